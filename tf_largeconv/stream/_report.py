"""The memory plan of a stream, as numbers and as a printable table."""

from __future__ import annotations

import math
from typing import Any

from tf_largeconv.stream import _plan
from tf_largeconv.stream import _pool
from tf_largeconv.stream._plan import Tiling


def _mib(n: float) -> str:
  return f"{n / (1 << 20):.1f} MiB"


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
    peak_bytes: the expected growth of the process's anonymous memory over the run (over
      all passes): TensorFlow's CPU pool after serving every tile's tensors (`_pool`);
      worst_bytes: the most it grew to on the benchmark's cases for the same figure, which
      the chosen tile keeps within the limit; memory_limit: the limit used.
    trunk_output: in a StreamingModel's plan with a head, where the trunk's output and its
      gradient are kept and their bytes (`stream._trunk_out.TrunkOutputPlan`); else None.
  """

  def __init__(
    self,
    tilings: list[Tiling],
    image_shape: tuple[int, ...],
    tile: int,
    memory_limit: int,
    batch: int,
    itemsize: int,
    peak: Any = None,
  ) -> None:
    tiling = self.tiling = tilings[-1]
    self.tilings, self.passes = tilings, len(tilings)
    g = tiling.geometry
    self.image_shape = tuple(image_shape)
    self.output_size = tuple(g.out_sizes)
    self.tile = tile
    self.tile_out = tuple(tiling.tile_out)
    self.tile_in = tuple(math.ceil(t / scale) for t, scale in zip(tiling.tile_out, g.sink_scale))
    self.grid = tuple(len(b) for b in tiling.bounds)
    self.tiles = tiling.count
    self.memory_limit = memory_limit
    self.trunk_output: Any = None
    middle = _plan.middle_tile(tiling)
    base = max((peak or _plan.pass_peak)(t, batch, itemsize) for t in tilings)
    self.peak_bytes, self.worst_bytes = (int(f * base) for f in (_pool.EXPECTED, _pool.WORST))
    work = [t.work() for t in tilings]
    self.recompute = sum(d for d, _ in work) / sum(w for _, w in work) - 1.0
    self.pass_work = sum(w for _, w in work[:-1]) / work[-1][1]
    self.halo: dict[str, tuple[int, ...]] = {}
    sink = g.sink_scale
    for step in g.spatial_steps:
      if not step.rule.spatial_out:  # type: ignore[union-attr]
        continue
      spans = tiling.window(middle, step.output)
      if spans is None:
        continue
      scale = g.scales[step.output]
      self.halo[step.name] = tuple(
        max(0, math.ceil(((b - a) - tiling.tile_out[i] * scale[i] / sink[i]) / 2))
        for i, (a, b) in enumerate(spans)
      )
    one = _plan.Tiling(g, [1] * g.rank)
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
    if self.trunk_output is not None:  # a StreamingModel's plan with a head
      rows.append(str(self.trunk_output))
    rows += [
      "halo per layer (pixels beyond the tile on each side, per axis):",
    ]
    width = max((len(n) for n in self.halo), default=0)
    rows += [f"  {name:<{width}}  {halo}" for name, halo in self.halo.items()]
    return "\n".join(rows)

  __repr__ = __str__


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
  return StreamPlan(tilings, tuple(shape), int(tile), limit, shape[0], itemsize, peak)
