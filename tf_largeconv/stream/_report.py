"""The memory plan of a stream, as numbers and as a printable table."""

from __future__ import annotations

import math
from typing import Any

from tf_largeconv.stream import _plan
from tf_largeconv.stream import _pool
from tf_largeconv.stream._plan import Tiling


def _mib(n: float) -> str:
  return f"{n / (1 << 20):.1f} MiB"


class Stage:
  """One stage of a stream: the layers from `first` to `last`, streamed tile by tile with
  their own halo. A staged stream (`_stages`) runs several in order, each reading the values
  alive where it starts from temporary files and writing those alive where it ends.

  Attributes:
    first, last: the names of its first and last layers.
    tile, tile_out, tile_in, grid, tiles: as for `StreamPlan`, for this stage.
    tilings: its tiling per pass (several only in the last stage, with global context);
      tiling: the last one's.
    recompute: the work its tiles do twice in overlaps, as a fraction of its untiled work.
    disk_bytes: the bytes of the values it writes to disk for the stages after it (0 for
      the last stage, which writes the result).
  """

  def __init__(
    self, tilings: list[Tiling], tile: int, first: str = "", last: str = "", disk_bytes: int = 0
  ) -> None:
    self.tilings, self.tiling = tilings, tilings[-1]
    g = self.tiling.geometry
    self.first, self.last, self.tile, self.disk_bytes = first, last, tile, disk_bytes
    self.tile_out = tuple(self.tiling.tile_out)
    self.tile_in = tuple(math.ceil(t / sc) for t, sc in zip(self.tile_out, g.sink_scale))
    self.grid = tuple(len(b) for b in self.tiling.bounds)
    self.tiles = self.tiling.count
    self.work = [t.work() for t in tilings]
    self.recompute = sum(d for d, _ in self.work) / sum(w for _, w in self.work) - 1.0

  def peak(self, batch: int, itemsize: int, peak: Any = None) -> int:
    """The memory its passes need at most (`peak`, default `_plan.pass_peak`; unscaled)."""
    return max((peak or _plan.pass_peak)(t, batch, itemsize) for t in self.tilings)

  def __str__(self) -> str:
    return (
      f"{self.first} .. {self.last}: tile {self.tile_in} input pixels, {self.tiles} tiles "
      f"({' x '.join(str(n) for n in self.grid)}), recomputed {100 * self.recompute:.1f}%"
      + (f", {_mib(self.disk_bytes)} to disk" if self.disk_bytes else "")
    )


class StreamPlan:
  """What `tf_largeconv.stream.predict` does for one model and image size.

  Attributes:
    image_shape: (batch, *spatial, channels) of the image.
    output_size: the spatial size of the tiled output (the model's output, or what its
      global pooling reads).
    tile: the tile side in input pixels that was asked for, or the largest that fits the
      memory limit: an upper bound, which `tile_out` and `tile_in` round to the grid.
    tile_out: per axis, the output pixels a tile computes (all tiles but the last of an
      axis); tile_in: per axis, the input pixels that output covers, without its halo.
    tiles: the number of tiles (steps); grid: tiles per axis.
    halo: per layer (name: per axis), the pixels an interior tile computes beyond its
      share of that layer's output on each side (the overlap with its neighbours).
    receptive_field: per axis, the input pixels one output pixel depends on.
    recompute: the work done twice in the overlaps, as a fraction of the untiled run's.
    passes: the passes over the image: 1, or with global context inside the image part
      (squeeze-excitation), one more per pooled value that later layers multiply back into
      the image; tilings: the tiling of each pass (`tiling`: the last one's, the output's).
    pass_work: the work of the passes before the last, as a fraction of the untiled run's
      (0 for one pass; tiles' overlaps not counted).
    stages: the stages (`Stage`) the network runs in: one, or for a staged stream several,
      each tiled for itself through temporary files (`disk_bytes` in all). In a staged
      plan, `tile`, `tile_out`, `tile_in`, `grid`, `tiles`, `tilings` and `passes` are the
      last stage's; `halo` gives each layer's within its stage; `recompute` is over all
      stages.
    peak_bytes: the expected growth of the process's anonymous memory over the run (over
      all passes; over all stages, one pool serving them in turn): TensorFlow's CPU pool
      after serving every tile's tensors (`_pool`); worst_bytes: the most it grew to on the
      benchmark's cases for the same figure, which the chosen tile keeps within the limit;
      memory_limit: the limit used.
      Pages of the temporary files are the system's page cache, not counted.
    trunk_output: in a StreamingModel's plan with a head, where the trunk's output and its
      gradient are kept and their bytes (`stream._trunk_out.TrunkOutputPlan`); else None.
  """

  def __init__(
    self,
    stages: list[Stage],
    image_shape: tuple[int, ...],
    memory_limit: int,
    batch: int,
    itemsize: int,
    peak: Any = None,
    whole: Any = None,
  ) -> None:
    last = stages[-1]
    self.stages = stages
    tiling = self.tiling = last.tiling
    self.tilings, self.passes = last.tilings, len(last.tilings)
    g = tiling.geometry
    self.image_shape = tuple(image_shape)
    self.output_size = tuple(g.out_sizes)
    self.tile, self.tile_out, self.tile_in = last.tile, last.tile_out, last.tile_in
    self.grid, self.tiles = last.grid, last.tiles
    self.memory_limit = memory_limit
    self.trunk_output: Any = None
    base = max(s.peak(batch, itemsize, peak) for s in stages)
    if len(stages) > 1 and peak is None:
      # TensorFlow's pool keeps what each stage took: one pool serves the stages in turn.
      pool = None
      for tiling_ in (t for s in stages for t in s.tilings):
        pool = _plan.simulate(tiling_, batch, itemsize, pool=pool)
      base = max(base, pool.grown)  # type: ignore[union-attr]
    self.peak_bytes, self.worst_bytes = (int(f * base) for f in (_pool.EXPECTED, _pool.WORST))
    self.disk_bytes = sum(s.disk_bytes for s in stages)
    done = sum(d for s in stages for d, _ in s.work)
    self.recompute = done / sum(w for s in stages for _, w in s.work) - 1.0
    self.pass_work = sum(w for _, w in last.work[:-1]) / sum(s.work[-1][1] for s in stages)
    self.halo: dict[str, tuple[int, ...]] = {}
    for stage in stages:
      self.halo.update(_halo(stage.tiling))
    whole = whole or g
    one = _plan.Tiling(whole, [1] * whole.rank)
    ranges = [one.ranges(i, len(one.bounds[i]) // 2).get(0, (0, 0)) for i in range(g.rank)]
    self.receptive_field = tuple(b - a for a, b in ranges)

  def __str__(self) -> str:
    rows = [
      f"image {self.image_shape} -> tiled output {self.output_size}",
      f"tile {self.tile_in} input pixels = {self.tile_out} output pixels; "
      f"{self.tiles} tiles ({' x '.join(str(n) for n in self.grid)})",
      f"receptive field {self.receptive_field} input pixels; "
      f"recomputed in overlaps {100 * self.recompute:.1f}% of the untiled work",
      f"estimated memory {_mib(self.peak_bytes)}, at most {_mib(self.worst_bytes)} "
      f"(limit {_mib(self.memory_limit)})",
    ]
    if self.passes > 1:
      rows.append(
        f"{self.passes} passes over the image: the first {self.passes - 1} pool the global "
        f"context later layers read, adding {100 * self.pass_work:.1f}% of the untiled work"
      )
    if len(self.stages) > 1:
      rows.append(
        f"{len(self.stages)} stages, each tiled with its own halo, through "
        f"{_mib(self.disk_bytes)} of temporary files (the tile above is the last stage's):"
      )
      rows += [f"  {k + 1}. {stage}" for k, stage in enumerate(self.stages)]
    if self.trunk_output is not None:  # a StreamingModel's plan with a head
      rows.append(str(self.trunk_output))
    rows += [
      "halo per layer (pixels beyond the tile on each side, per axis):",
    ]
    width = max((len(n) for n in self.halo), default=0)
    rows += [f"  {name:<{width}}  {halo}" for name, halo in self.halo.items()]
    return "\n".join(rows)

  __repr__ = __str__


def _halo(tiling: Tiling) -> dict[str, tuple[int, ...]]:
  """Per layer of `tiling`'s steps: the pixels a middle tile computes beyond its share on
  each side, per axis."""
  g = tiling.geometry
  middle = _plan.middle_tile(tiling)
  halo = {}
  for step in g.spatial_steps:
    spans = tiling.window(middle, step.output) if step.rule.spatial_out else None  # type: ignore[union-attr]
    if spans is None:
      continue
    scale = g.scales[step.output]
    halo[step.name] = tuple(
      max(0, math.ceil(((b - a) - tiling.tile_out[i] * scale[i] / g.sink_scale[i]) / 2))
      for i, (a, b) in enumerate(spans)
    )
  return halo


def plan_for(
  graph: Any, shape: tuple[int, ...], tile: int | None, memory_limit: int | None, peak: Any = None
) -> StreamPlan:
  """The plan of `graph` over a batch of `shape` (batch, *spatial, channels): `tile`, or
  the largest whose pass (`peak(tiling, batch, itemsize)`, default `_plan.pass_peak`;
  `_backprop.train_pass_peak` for training) fits `memory_limit` (default
  `_plan.DEFAULT_MEMORY_LIMIT`)."""
  geometries = _plan.passes(graph, shape[1:-1])
  limit = _plan.DEFAULT_MEMORY_LIMIT if memory_limit is None else int(memory_limit)
  itemsize = max(graph.input_dtype.size, 4)
  if tile is None:
    tile = min(_plan.choose_tile(g, limit, shape[0], itemsize, peak) for g in geometries)
  tilings = [_plan.Tiling(g, g.tile_out(int(tile))) for g in geometries]
  return StreamPlan([Stage(tilings, int(tile))], tuple(shape), limit, shape[0], itemsize, peak)
