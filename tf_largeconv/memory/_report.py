"""MemoryReport: the per-layer table, the peaks, the advice; printable, as a dict, and as a
stacked bar chart."""

from __future__ import annotations

import dataclasses
from typing import Any

MiB = 1 << 20


def mib(n: float) -> str:
  return f"{n / MiB:,.1f} MiB"


@dataclasses.dataclass
class LayerRow:
  name: str
  kind: str
  output_bytes: int
  kept_bytes: int
  workspace_bytes: int
  largeconv_workspace_bytes: int | None  # the LargeConv planner's bound, for TF's convolutions
  param_bytes: int
  not_priced: list[str]


@dataclasses.dataclass
class Advice:
  change: str
  inference_peak: int | None
  training_peak: int | None
  fits: bool | None = None


@dataclasses.dataclass
class MemoryReport:
  """Where a model's memory goes for one input shape. Peaks are bytes of growth over the
  process before the call (weights and the input already held are not counted again).

  Attributes:
    input_shape, training, budget: as given to `report`.
    layers: per layer (in execution order) a LayerRow: output, kept for the backward pass,
      kernel workspace (and the LargeConv planner's bound, for TensorFlow's convolutions),
      parameters, and the op types not priced.
    param_bytes, gradient_bytes, optimizer_bytes: the weights, their gradients, the
      optimizer's slots (slots per weight: optimizer_slots).
    inference_peak, inference_layer: one traced inference call (`predict`).
    training_peak, training_layer: one traced training step (`fit`); None without training.
    eager_inference_peak, eager_training_peak: `model(x)` and a `GradientTape` step.
    not_priced: op types the report has no rule for (their outputs are counted).
    advice: changes that cut the peak, each with the peaks after it.
  """

  input_shape: tuple[int, ...]
  training: bool
  budget: int | None
  layers: list[LayerRow]
  param_bytes: int
  gradient_bytes: int
  optimizer_slots: int
  optimizer_bytes: int
  not_priced: list[str]
  inference_peak: int
  inference_layer: str
  eager_inference_peak: int
  training_peak: int | None
  training_layer: str | None
  eager_training_peak: int | None
  advice: list[Advice]

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  def __str__(self) -> str:
    head = (
      f"{'layer':<24}{'kind':<20}{'output':>13}{'kept':>13}{'workspace':>13}"
      f"{'(LargeConv)':>13}{'params':>12}"
    )
    rows = [f"memory report for input {self.input_shape}", head, "-" * len(head)]
    for r in self.layers:
      alt = r.largeconv_workspace_bytes
      rows.append(
        f"{r.name[:23]:<24}{r.kind[:19]:<20}{mib(r.output_bytes):>13}{mib(r.kept_bytes):>13}"
        f"{mib(r.workspace_bytes):>13}{mib(alt) if alt is not None else '':>13}"
        f"{mib(r.param_bytes):>12}"
        + (f"  not priced: {', '.join(r.not_priced)}" if r.not_priced else "")
      )
    rows.append(
      f"parameters {mib(self.param_bytes)}, gradients {mib(self.gradient_bytes)}, "
      f"optimizer slots {mib(self.optimizer_bytes)} ({self.optimizer_slots} per weight)"
    )
    rows.append(
      f"inference peak (traced, predict) {mib(self.inference_peak)} at {self.inference_layer}; "
      f"eager model(x) {mib(self.eager_inference_peak)}"
    )
    if self.training_peak is not None:
      rows.append(
        f"training peak (traced, fit) {mib(self.training_peak)} at {self.training_layer}; "
        f"eager GradientTape step {mib(self.eager_training_peak or 0)}"
      )
    if self.not_priced:
      rows.append(
        f"not priced (outputs counted, kept memory unknown): {', '.join(self.not_priced)}"
      )
    if self.budget is not None:
      rows.append(f"budget {mib(self.budget)}:")  # advice lines follow
    for a in self.advice:
      peaks = [f"inference {mib(a.inference_peak)}" if a.inference_peak is not None else ""]
      peaks.append(f"training {mib(a.training_peak)}" if a.training_peak is not None else "")
      fits = "" if a.fits is None else ("  fits" if a.fits else "  does not fit")
      rows.append(f"  {a.change}: {', '.join(p for p in peaks if p)}{fits}")
    return "\n".join(rows)

  def plot(self, path: str | None = None) -> Any:
    """A stacked bar chart of memory by layer (output, kept, workspace, parameters); saved
    to `path` if given. Returns the matplotlib figure. Needs matplotlib."""
    try:
      import matplotlib

      if path is not None:
        matplotlib.use("Agg")
      import matplotlib.pyplot as plt
    except ImportError as e:
      raise ImportError(
        "MemoryReport.plot needs matplotlib: pip install matplotlib (the 'bench' extra)"
      ) from e
    names = [r.name for r in self.layers]
    fig, ax = plt.subplots(figsize=(max(6, 0.35 * len(names)), 4))
    bottom = [0.0] * len(names)
    for label, key in (
      ("output", "output_bytes"),
      ("kept for backward", "kept_bytes"),
      ("workspace", "workspace_bytes"),
      ("parameters", "param_bytes"),
    ):
      vals = [getattr(r, key) / MiB for r in self.layers]
      ax.bar(names, vals, bottom=bottom, label=label)
      bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("MiB")
    ax.set_title(f"memory by layer, input {self.input_shape}")
    ax.tick_params(axis="x", rotation=90)
    ax.legend()
    fig.tight_layout()
    if path is not None:
      fig.savefig(path)
    return fig
