"""Tiles: which part of every layer's output each tile computes, what a tile holds in memory
at its peak, and the tile size that fits a memory limit.

The output is cut into tiles along each spatial axis; a tile is one range per axis, so the
ranges of every layer are worked out per axis (the axes are independent) and a tile's
window is their product. For each tile range of the output, the range every layer must
compute is the union of what its readers need (`_rules`), clipped to the layer's output.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from tf_largeconv.stream import _graph
from tf_largeconv.stream import _pool
from tf_largeconv.stream import _rules
from tf_largeconv.stream import _windowed
from tf_largeconv.stream._graph import Graph

Range = tuple[int, int]
DEFAULT_MEMORY_LIMIT = 1 << 30


def check_tile(tile: Any, memory_limit: Any) -> None:
  """ValueError unless tile and memory_limit are positive ints or None."""

  def bad(v: Any) -> bool:
    return v is not None and (
      isinstance(v, bool) or not isinstance(v, (int, np.integer)) or bool(v < 1)
    )

  if bad(tile):
    raise ValueError(
      f"tile must be a positive int (input pixels per tile side) or None, got {tile!r}"
    )
  if bad(memory_limit):
    raise ValueError(f"memory_limit must be a positive int (bytes) or None, got {memory_limit!r}")


def _hull(r: Range | None, s: Range) -> Range:
  if s[0] >= s[1]:
    return r if r is not None else s
  if r is None or r[0] >= r[1]:
    return s
  return min(r[0], s[0]), max(r[1], s[1])


class Geometry:
  """The sizes, scales and tiling targets (`sinks`) of a graph for one image size: by
  default the output when it is an image and what the global poolings read; for one pass
  of a model with global context (`passes`), that pass's `sinks`. Only the steps the sinks
  need (and the poolings of the sinks) are computed, from the `sources`: the input (value
  0) by default; for one stage of a staged stream (`_stages`), the values alive where it
  starts, read from disk."""

  def __init__(
    self,
    graph: Graph,
    sizes: Sequence[int] | dict[int, tuple[int, ...]],
    sinks: set[int] | None = None,
    sources: Sequence[int] | None = None,
  ) -> None:
    self.graph = graph
    self.sources = sorted(sources) if sources is not None else [0]
    # The image's spatial sizes, or every value's as `_graph.spatial_sizes` bound them.
    self.sizes = dict(sizes) if isinstance(sizes, dict) else _graph.spatial_sizes(graph, sizes)
    self.rank = len(self.sizes[0])
    if sinks is None:
      sinks = {s.inputs[0] for s in graph.steps if s.kind == "reduce"}
      if graph.spatial.get(graph.output, False):
        sinks.add(graph.output)
    shapes = {self.sizes[v] for v in sinks}
    if len(shapes) != 1:
      raise ValueError(
        "tf_largeconv.stream: the model ends in image-shaped tensors of different sizes "
        f"{sorted(shapes)}; stream it up to one of them (up_to=...)"
      )
    self.sinks = sorted(sinks)
    self.out_sizes = shapes.pop()
    self.scales = self._scales()
    self.values = _ancestors(graph, sinks, set(self.sources))
    sink_scale = self.scales[self.sinks[0]]
    aligned = self.scales if sources is None else {v: self.scales[v] for v in self.values}
    self.align = [
      math.lcm(*(((sc[i] / sink_scale[i]).denominator) for sc in aligned.values()))
      for i in range(self.rank)
    ]
    self.sink_scale = sink_scale
    self.spatial_steps = [
      s
      for s in graph.steps
      if s.rule is not None
      and s.output not in self.sources
      and (s.output in self.values or (s.kind == "reduce" and s.inputs[0] in sinks))
    ]
    # The index (in spatial_steps) of each value's last reader: a tile frees it after that.
    self.last_use: dict[int, int] = {}
    for k, step in enumerate(self.spatial_steps):
      for v in step.inputs:
        self.last_use[v] = k

  def _scales(self) -> dict[int, list[Fraction]]:
    scales: dict[int, list[Fraction]] = {0: [Fraction(1)] * self.rank}
    for step in self.graph.steps:
      if step.rule is not None and step.rule.spatial_out:
        base = scales[step.inputs[0]]
        scales[step.output] = [base[i] * step.rule.scale(i) for i in range(self.rank)]
    return scales

  def ranges(self, axis: int, a: int, b: int) -> dict[int, Range]:
    """For the output tile [a, b) along `axis`: the range each spatial value is computed
    over (values not needed are absent)."""
    r: dict[int, Range] = {v: (a, b) for v in self.sinks}
    for step in reversed(self.spatial_steps):
      if step.kind == "reduce" or step.output not in r:
        continue
      oa, ob = r[step.output]
      # An empty range (a tile wholly inside a padding) still reads its inputs' windows,
      # empty too, so every value the tile computes has one.
      lo, hi = step.rule.needs(axis, oa, ob) if oa < ob else (oa, oa)  # type: ignore[union-attr]
      for v in step.inputs:
        r[v] = _hull(r.get(v), _rules.clip(lo, hi, self.sizes[v][axis]))
    return r

  def tile_bounds(self, axis: int, tile_out: int) -> list[Range]:
    """The tiles along `axis`: as few as tiles of at most `tile_out` pixels allow, of equal
    size (a multiple of the axis's alignment where `tile_out` is), the last one shorter
    where the size does not divide."""
    n, align = self.out_sizes[axis], self.align[axis]
    count = -(-n // tile_out)
    side = -(-n // count)
    if tile_out >= align:
      side = min(-(-side // align) * align, tile_out)
    return [(a, min(a + side, n)) for a in range(0, n, side)]

  def tile_out(self, tile: int) -> list[int]:
    """The output tile side per axis for a tile of `tile` input pixels: rounded down to a
    multiple of the strides' alignment when at least that, never below one pixel."""
    out = []
    for i in range(self.rank):
      t = max(1, math.floor(tile * self.sink_scale[i]))
      if t >= self.align[i]:
        t -= t % self.align[i]
      out.append(min(t, self.out_sizes[i]))
    return out


class Tiling:
  """A geometry cut into tiles of `tile_out` output pixels per axis, with each tile's
  ranges per axis."""

  def __init__(self, geometry: Geometry, tile_out: Sequence[int]) -> None:
    self.geometry = geometry
    self.bounds = [geometry.tile_bounds(i, t) for i, t in enumerate(tile_out)]
    self.tile_out = [b[0][1] - b[0][0] for b in self.bounds]  # the tiles' side, per axis
    self._ranges: dict[tuple[int, int], dict[int, Range]] = {}

  def ranges(self, axis: int, t: int) -> dict[int, Range]:
    """The ranges of tile number `t` along `axis` (worked out once)."""
    key = (axis, t)
    if key not in self._ranges:
      self._ranges[key] = self.geometry.ranges(axis, *self.bounds[axis][t])
    return self._ranges[key]

  @property
  def count(self) -> int:
    return math.prod(len(b) for b in self.bounds)

  def tiles(self) -> list[tuple[int, ...]]:
    return list(np.ndindex(*(len(b) for b in self.bounds)))

  def window(self, index: Sequence[int], value: int) -> list[Range] | None:
    spans = [self.ranges(i, t).get(value) for i, t in enumerate(index)]
    if any(s is None for s in spans):
      return None
    return spans  # type: ignore[return-value]

  def recompute(self) -> float:
    """Elements computed over all tiles / elements of the untiled run, less one, over the
    spatial values weighted by their channels."""
    done, whole = self.work()
    return done / whole - 1.0

  def work(self) -> tuple[float, float]:
    """(elements computed over all tiles, elements of the untiled run) of this tiling's
    spatial values, weighted by their channels."""
    g = self.geometry
    done = whole = 0.0
    for v, size in g.sizes.items():
      if v not in g.values or (v in g.sources and v != 0):  # a stage's stored inputs
        continue
      c = g.graph.channels.get(v) or 1
      per_axis = []
      for i, bounds in enumerate(self.bounds):
        ranges = [self.ranges(i, t) for t in range(len(bounds))]
        per_axis.append(sum(max(r[v][1] - r[v][0], 0) for r in ranges if v in r))
      done += c * math.prod(per_axis)
      whole += c * math.prod(size)
    return done, whole


def _ancestors(graph: Graph, sinks: set[int], sources: set[int]) -> set[int]:
  """The spatial values `sinks` are computed from back to `sources`, both included."""
  by_output = {s.output: s for s in graph.steps}
  found, todo = set(), list(sinks)
  while todo:
    v = todo.pop()
    if v in found:
      continue
    found.add(v)
    if v not in sources and v in by_output and by_output[v].rule is not None:
      todo.extend(by_output[v].inputs)
  return found


def passes(
  graph: Graph,
  sizes: Sequence[int] | dict[int, tuple[int, ...]],
  sources: Sequence[int] | None = None,
) -> list[Geometry]:
  """The passes over the image a model needs: one, unless a pooled value is multiplied back
  into the image (squeeze-excitation); then each pass computes the poolings the next passes
  read (a pooled value is known once the pass over all tiles that pools it has run), and
  the last one the output. A value's level is the number of passes before it is known."""
  level: dict[int, int] = {0: 0}
  for s in graph.steps:
    reads = s.inputs + [v for _, v in s.globals]
    level[s.output] = max((level[v] for v in reads), default=0) + (s.kind == "reduce")
  groups: dict[tuple[int, tuple[int, ...]], set[int]] = {}
  shapes = dict(sizes) if isinstance(sizes, dict) else _graph.spatial_sizes(graph, sizes)
  targets = [s.inputs[0] for s in graph.steps if s.kind == "reduce"]
  if graph.spatial.get(graph.output, False):
    targets.append(graph.output)
  for v in targets:
    groups.setdefault((level[v], shapes[v]), set()).add(v)
  return [Geometry(graph, shapes, groups[key], sources) for key in sorted(groups)]


def _bytes(tiling: Tiling, v: int, spans: Sequence[Range] | None, batch: int, itemsize: int) -> int:
  """Bytes of value `v` over `spans` (none: 0)."""
  if spans is None:
    return 0
  c = tiling.geometry.graph.channels.get(v) or 1
  return batch * c * itemsize * math.prod(max(b - a, 0) for a, b in spans)


def _padded(step: Any, out_spans: Sequence[Range]) -> list[Range]:
  """The input window, padding included, a windowed step reads for `out_spans`."""
  return [step.rule.needs(i, a, b) for i, (a, b) in enumerate(out_spans)]


def package_workspaces(
  tiling: Tiling, step: Any, out_spans: Sequence[Range], batch: int
) -> tuple[int, int, int]:
  """The workspace bytes of the package's op that windowed step `step` runs under the tape
  (`package_under_tape`) for the tile's output `out_spans`: its forward pass's, its input
  gradient's and its filter gradient's, from the op's planner (`_windowed`'s `workspaces`)
  for the input it reads and the padding it is given."""
  v = step.inputs[0]
  need, padded = _needed(tiling, step, out_spans, v), _padded(step, out_spans)
  pads = tuple((a - pa, pb - b) for (a, b), (pa, pb) in zip(need, padded))
  channels = tiling.geometry.graph.channels.get(v) or 1
  shape = (batch, *(b - a for a, b in need), channels)
  return step.rule.call.workspaces(shape, pads)


def _needed(tiling: Tiling, step: Any, out_spans: Sequence[Range], v: int) -> list[Range]:
  """The part of input `v` step `step` reads for `out_spans` (inside the input)."""
  size = tiling.geometry.sizes[v]
  if step.kind == "pointwise":
    return list(out_spans)
  need = [step.rule.needs(i, a, b) for i, (a, b) in enumerate(out_spans)]
  return [_rules.clip(lo, hi, size[i]) for i, (lo, hi) in enumerate(need)]


def tile_events(
  tiling: Tiling, index: Sequence[int], batch: int, itemsize: int, taped: bool = False
) -> list[Any]:
  """The tensors tile `index` allocates and frees, in the order `_run.run_tile` makes them:
  ('a', key, bytes) and ('f', key). Per step: a copy of each input window cropped to what
  the step reads (where that is less than the window), a padded copy for a windowed layer
  whose op takes no explicit padding, then the layer's own tensors (`Step.allocs`: its
  temporaries as fractions of its output, freed after the step, then the output); inputs
  are freed after their last reader, the tiled values after the tile. `taped`: as the
  tile runs under a gradient tape (`_windowed.taped`, `Step.tape_allocs`), where a layer
  that runs the package's op there (`package_under_tape`) also takes its workspace, ('ws',
  k), bounded by the padded window's bytes, while its first tensor is made."""
  g = tiling.geometry
  steps, last_use = g.spatial_steps, g.last_use
  ev: list[tuple[Any, ...]] = [
    ("a", v, _bytes(tiling, v, tiling.window(index, v), batch, itemsize)) for v in g.sources
  ]
  for k, step in enumerate(steps):
    out_spans = tiling.window(index, step.output) if step.rule.spatial_out else None  # type: ignore[union-attr]
    if out_spans is not None and min(b - a for a, b in out_spans) > 0:
      temps: list[Any] = []
      for v in dict.fromkeys(step.inputs):
        need = _needed(tiling, step, out_spans, v)
        if need != tiling.window(index, v):
          temps.append(("crop", k, v))
          ev.append(("a", temps[-1], _bytes(tiling, v, need, batch, itemsize)))
      rule: Any = step.rule
      if step.kind in ("conv", "pool", "folded conv") and (
        not rule.explicit or (taped and getattr(rule, "taped_copy", False))
      ):
        pads, need = _padded(step, out_spans), _needed(tiling, step, out_spans, step.inputs[0])
        if pads != need and not (rule.explicit and _windowed.runs_same(rule, pads, need)):
          temps.append(("pad", k))
          ev.append(("a", temps[-1], _bytes(tiling, step.inputs[0], pads, batch, itemsize)))
      out = _bytes(tiling, step.output, out_spans, batch, itemsize)
      *shares, _ = step.tape_allocs if taped else step.allocs
      made = [("tmp", k, j) for j in range(len(shares))]
      keys = made + [step.output]
      for key, nbytes in zip(keys, [int(f * out) for f in shares] + [out]):
        ev.append(("a", key, nbytes))
        if key == keys[0] and taped and getattr(rule, "package_under_tape", False):
          # The package's op: its forward pass's workspace, as its planner gives it for the
          # tile's input, from its result's allocation until it returns.
          ws = package_workspaces(tiling, step, out_spans, batch)[0]
          ev.extend([("a", ("ws", k), ws), ("f", ("ws", k))])
      ev.extend(("f", t) for t in temps + made)
    for v in dict.fromkeys(step.inputs):
      if last_use.get(v) == k and v not in g.sinks:
        ev.append(("f", v))
  ev.extend(("f", v) for v in g.sinks)
  return ev


def simulate(
  tiling: Tiling, batch: int, itemsize: int, events: Any = None, pool: _pool.Pool | None = None
) -> _pool.Pool:
  """TensorFlow's CPU pool (`_pool`) after serving a pass over `tiling` (the tensors of each
  tile by `events`, default `tile_events`; ('k', key, bytes) events go to `Pool.keep`),
  from empty or from `pool`. The tiles run in
  order, the first three and last two of each axis standing for the rest (interior tiles
  repeat one another); a tile whose tensors match one already run twice is skipped."""
  events = events or tile_events
  pool = pool or _pool.Pool(_pool.allocator(), _pool.onednn())
  seen: dict[tuple[Any, ...], int] = {}
  picks = [
    sorted({t for t in (0, 1, 2, len(b) - 2, len(b) - 1) if 0 <= t < len(b)}) for b in tiling.bounds
  ]
  for index in itertools.product(*picks):
    tensors = events(tiling, index, batch, itemsize)
    key = tuple(e[2] if e[0] == "a" else e[1] if e[0] == "k" else 0 for e in tensors)
    if seen.get(key, 0) >= 2:
      continue
    seen[key] = seen.get(key, 0) + 1
    handles: dict[Any, Any] = {}
    for e in tensors:
      if e[0] == "a":
        handles[e[1]] = pool.alloc(*e[2:])
      elif e[0] == "k":
        pool.keep(e[1], e[2])
      else:
        pool.free(handles.pop(e[1], None))
  return pool


def pass_peak(tiling: Tiling, batch: int, itemsize: int) -> int:
  """The anonymous memory a pass over `tiling` leaves the process holding (`simulate`)."""
  return simulate(tiling, batch, itemsize).grown


def middle_tile(tiling: Tiling) -> tuple[int, ...]:
  """A full-size tile as far from the edges as the grid has: where halos are widest."""
  index = []
  for bounds in tiling.bounds:
    full = [t for t, (a, b) in enumerate(bounds) if b - a == bounds[0][1] - bounds[0][0]]
    index.append(min(full, key=lambda t: abs(t - (len(bounds) - 1) / 2)))
  return tuple(index)


def edge_and_middle_tiles(tiling: Tiling) -> list[tuple[int, ...]]:
  """The first, middle and last tiles of each axis and their combinations: edge tiles pad,
  interior tiles carry halos on both sides."""
  middle = middle_tile(tiling)
  picks = [sorted({0, m, len(b) - 1}) for m, b in zip(middle, tiling.bounds)]
  return list(itertools.product(*picks))


def choose_tile(
  geometry: Geometry,
  memory_limit: int,
  batch: int,
  itemsize: int,
  peak: Any = None,
  most: int | None = None,
) -> int:
  """The largest tile (input pixels; at most `most`) whose pass (`peak`, default
  `pass_peak`) at its worst, `_pool.WORST` times the model's figure, fits `memory_limit`.
  Where malloc serves TensorFlow's tensors, warns that the limit may not hold
  (`_pool.MALLOC_WARNING`)."""
  if not _pool.pooled():
    warnings.warn(_pool.MALLOC_WARNING, RuntimeWarning, stacklevel=2)
  n_in = max(geometry.sizes[0])
  lo, hi = 1, max(min(n_in, most or n_in), 1)
  peak = peak or pass_peak
  known: dict[Any, bool] = {}  # tiles of many sizes cut the output alike

  def fits(tile: int) -> bool:
    tiling = Tiling(geometry, geometry.tile_out(tile))
    key = tuple(map(tuple, tiling.bounds))
    if key not in known:
      known[key] = _pool.WORST * peak(tiling, batch, itemsize) <= memory_limit
    return known[key]

  if fits(hi):
    return hi
  if not fits(lo):
    tiling = Tiling(geometry, geometry.tile_out(1))
    need = int(_pool.WORST * peak(tiling, batch, itemsize))
    raise ValueError(
      f"memory_limit: {memory_limit} bytes is less than one output pixel's step needs "
      f"(about {need} bytes for a batch of {batch}); raise it or pass a smaller batch"
    )
  while hi - lo > 1:
    mid = (lo + hi) // 2
    if fits(mid):
      lo = mid
    else:
      hi = mid
  return lo


def trunk_output_bytes(tiling: Tiling, batch: int) -> int:
  """Bytes of the whole tiled output of `tiling` (a StreamingModel's trunk output) in its
  dtype; its gradient has as many."""
  g = tiling.geometry
  channels = g.graph.channels.get(g.sinks[0]) or 1
  itemsize = np.dtype(g.graph.out_dtype).itemsize
  return batch * channels * itemsize * math.prod(g.out_sizes)


def input_window_bytes(tiling: Tiling, batch: int, itemsize: int) -> int:
  """Bytes of the largest input window (halo included) a tile of `tiling` reads, at
  `itemsize` bytes an element."""
  return max(
    _bytes(tiling, 0, tiling.window(index, 0), batch, itemsize)
    for index in edge_and_middle_tiles(tiling)
  )
