"""The plan types: what the C++ planner chose for each pass of a convolution.

`Plan` and `PassPlan` are what `tf_largeconv.plan`, `plan_conv1d`, `plan_transpose` and
`plan_conv3d` return.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv._passes import PerPass

_CORE = _loader.core()
# The algorithms a plan prices (every one the op's planner names but 'auto').
_MODELLED = tuple(a for a in _args.OP_ALGORITHMS if a != "auto")


class PassPlan:
  """The plan of one pass (forward, backprop_input or backprop_filter).

  Attributes:
    name: 'forward', 'backprop_input' or 'backprop_filter'.
    algorithm: 'direct', 'fft' or 'tf' (TensorFlow's own kernel).
    workspace_bytes: the temporary memory the pass takes.
    flops: the pass's floating-point operations as its algorithm runs them: the direct
      sum's (2 per multiply-add) for 'direct' and 'tf', the FFT cost model's count of
      transforms and spectral products for 'fft'.
    fft_size, tile, tiles: an FFT pass's transform size, the outputs each transform
      yields and the tiles per spatial dimension (2 or 3 entries); None otherwise.
    in_block, out_block, group_block, vec_block, slots: how an FFT pass is cut up.
    fft_work: what the FFT cost model counts, by name; None where it is not priced.
    estimated_seconds: the cost model's seconds of each algorithm, None where it cannot
      run.
    kept_spectra_seconds, kept_spectra_bytes: the FFT's seconds for a call whose filter
      spectra are kept, and the bytes they take (None and 0 where none are kept).
  """

  name: str
  algorithm: str
  workspace_bytes: int
  flops: float
  fft_size: tuple[int, ...] | None
  tile: tuple[int, ...] | None
  tiles: tuple[int, ...] | None
  in_block: int | None
  out_block: int | None
  group_block: int | None
  vec_block: int | None
  slots: int | None
  fft_work: dict[str, float] | None
  estimated_seconds: dict[str, float | None]
  kept_spectra_seconds: float | None
  kept_spectra_bytes: int

  def __init__(self, d: dict[str, Any]) -> None:
    self.name = d["pass"]
    self.algorithm = d["algorithm"]
    self.workspace_bytes = int(d["workspace_bytes"])
    self.flops = float(d["flops"])
    self.fft_size = tuple(d["fft"]) if "fft" in d else None
    self.tile = tuple(d["tile"]) if "tile" in d else None
    self.tiles = tuple(d["tiles"]) if "tiles" in d else None
    # How an FFT pass is cut up (cc/core/cpu/fft.h, FftConfig): channel blocks, groups held at
    # once, and vec_block: groups per batched transform call, or with a single group, the
    # tiles of one item (a run of tiles that shares each filter value read; in the filter
    # pass, a sweep of tiles that shares each read and write of the accumulators).
    self.in_block = d.get("in_block")
    self.out_block = d.get("out_block")
    self.group_block = d.get("group_block")
    self.vec_block = d.get("vec_block")
    self.slots = d.get("slots")
    # What the FFT cost model counts: transforms, their points, spectral multiply-adds and
    # the filter values they read from memory (a 3-D plan reports the transforms only).
    self.fft_work = d.get("fft_work")
    if self.fft_work is None and "transforms" in d:
      self.fft_work = {"transforms": d["transforms"]}
    # The cost model's single-thread seconds of each algorithm (None: it cannot run here),
    # the FFT's for its configuration spread over two reference threads: what the choice
    # was made on.
    self.estimated_seconds = {a: d["cost_" + a] if d["cost_" + a] >= 0 else None for a in _MODELLED}
    # The FFT's estimated seconds, as estimated_seconds has them, for a call whose filter
    # spectra were kept from an earlier call (its filter transforms left out), and the
    # bytes the spectrum cache holds for them; None and 0 where the FFT was not priced or
    # keeps none (the filter pass, 'direct', int32, or no FFT configuration fits).
    kept = d.get("cost_fft_kept", -1)
    self.kept_spectra_seconds = kept if kept >= 0 else None
    self.kept_spectra_bytes = int(d.get("kept_spectra_bytes", 0))

  def __repr__(self) -> str:
    return (
      f"PassPlan({self.name}: {self.algorithm}, workspace={self.workspace_bytes} B, "
      f"fft={self.fft_size}, tile={self.tile}, tiles={self.tiles})"
    )


class Plan:
  """Per-pass plans of one convolution; `str()` prints a short table.

  Attributes:
    forward, backprop_input, backprop_filter: `PassPlan`s.
    output_shape: the convolution's output shape.
    workspace_bytes: the largest temporary memory any one pass takes.
    workspace_limit: the limit the plan was made under, in bytes.
    unavailable: None, or why the op library could not be loaded: then the passes show
      what the ops would do, and every call runs the portable path (stock TF ops) instead.
  """

  passes: PerPass
  forward: PassPlan
  backprop_input: PassPlan
  backprop_filter: PassPlan
  output_shape: tuple[int, ...]
  workspace_limit: int
  threads: int
  workspace_bytes: int
  unavailable: str | None

  def __init__(
    self,
    passes: Sequence[PassPlan],
    output_shape: Sequence[int],
    workspace_limit: int,
    threads: int,
    unavailable: str | None = None,
  ) -> None:
    self.passes = PerPass.of(passes)
    self.forward, self.backprop_input, self.backprop_filter = self.passes
    self.output_shape = tuple(output_shape)
    self.workspace_limit = workspace_limit
    self.threads = threads
    self.workspace_bytes = max(p.workspace_bytes for p in passes)
    self.unavailable = unavailable

  def __str__(self) -> str:
    def sizes(v: Sequence[int] | None) -> str:
      return "x".join(map(str, v)) if v else "-"

    cells = [
      (
        p.name,
        p.algorithm,
        sizes(p.fft_size),
        sizes(p.tile),
        sizes(p.tiles),
        f"{p.in_block}x{p.out_block}" if p.fft_size else "-",
        str(p.slots or "-"),
        f"{p.workspace_bytes / 2**20:.2f} MiB",
        f"{p.flops / 1e9:.3f}",
      )
      for p in self.passes
    ]
    header = (
      "pass",
      "algorithm",
      "fft size",
      "tile",
      "tiles",
      "blocks",
      "slots",
      "workspace",
      "GFLOP",
    )
    # Column widths: the 2-D table's, wider where a cell (a 3-D size) needs it.
    widths = [
      max([w] + [len(row[i]) + (1 if i > 1 else 0) for row in cells])
      for i, w in enumerate((16, 10, 12, 12, 9, 9, 6, 13, 9))
    ]

    def line(row: Sequence[str]) -> str:
      return "".join(
        c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))
      )

    kernels = {"onednn": "oneDNN's", "eigen": "Eigen's"}[_CORE.tf_kernels()]
    rows = [
      f"output {self.output_shape}, workspace limit {self.workspace_limit / 2**20:.1f} "
      f"MiB, {self.threads} thread(s), TF priced as {kernels} kernels",
      line(header) + "  model ms (1 thread): " + " / ".join(_MODELLED) + " / fft kept",
    ]

    def ms(seconds: float | None) -> str:
      return "-" if seconds is None else f"{seconds * 1e3:.4g}"

    for p, row in zip(self.passes, cells):
      rows.append(
        line(row)
        + "  "
        + " / ".join([ms(p.estimated_seconds[a]) for a in _MODELLED] + [ms(p.kept_spectra_seconds)])
      )
    if self.unavailable is not None:
      rows.append(
        "the op library could not be loaded, so every pass runs the portable path "
        f"(stock TensorFlow ops) instead of the above: {self.unavailable}"
      )
    return "\n".join(rows)

  def __repr__(self) -> str:
    return f"Plan({self.passes!r})"
