"""Staged streams: a network run as a sequence of stages through disk, each streamed tile by
tile with only its own halo.

A tile of a whole network carries the halo of the whole network's receptive field, so deep
networks recompute much of their work in the overlaps. A stage is a run of steps between two
cuts of the step order; where the values alive across a cut are few (in a ResNet, one after
each block), the stage before writes them into temporary `.npy` memory maps tile by tile
and the stage after reads its windows from them. The pages of those files are the system's
page cache, not the process's memory, so each stage's tile is the largest its own steps fit
in the memory limit, and its halo only its own.

Cuts are taken only before the first global pooling or step that reads a pooled value
(squeeze-excitation): the last stage runs from its cut to the end as an unstaged stream
does, in passes where it has global context.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_largeconv.stream import _plan
from tf_largeconv.stream import _run
from tf_largeconv.stream._plan import Range
from tf_largeconv.stream._report import Stage
from tf_largeconv.stream._report import StreamPlan
from tf_largeconv.stream._report import plan_for

# What an element written to disk and read back is taken to cost, in the units of
# `Tiling.work` (an element of a layer's output computed): a rough price, for the choice
# of cuts only.
DISK_COST = 1.0
# Staging runs only where it cuts the work (disk included) by at least this share.
MARGIN = 0.05


class Cut:
  """A place in the step order where the network can be cut: after step `position` of
  `order`, with `values` alive across it (all of one spatial size), named by the layer
  before it; `elements`: of those values in all but the input's (read from the image)."""

  def __init__(self, position: int, name: str, values: list[int], elements: int) -> None:
    self.position, self.name, self.values, self.elements = position, name, values, elements


def _order(graph: Any, whole: Sequence[_plan.Geometry]) -> list[Any]:
  """The spatial steps the unstaged passes run, in the graph's order."""
  steps = {id(s) for g in whole for s in g.spatial_steps}
  return [s for s in graph.steps if id(s) in steps]


def cuts(graph: Any, whole: Sequence[_plan.Geometry], batch: int) -> list[Cut]:
  """Every cut before the first global pooling or gated step (`Step.globals`) whose alive
  values have one spatial size, in order."""
  order = _order(graph, whole)
  sizes = whole[-1].sizes
  last_read: dict[int, int] = {graph.output: len(order)}
  for k, step in enumerate(order):
    for v in step.inputs + [v for _, v in step.globals]:
      last_read[v] = max(last_read.get(v, -1), k)
  alive = {0}
  found = []
  for k, step in enumerate(order[:-1]):
    if step.kind == "reduce" or step.globals:
      break
    alive.add(step.output)
    alive = {v for v in alive if last_read.get(v, -1) > k}
    if len({sizes[v] for v in alive}) == 1 and alive != {0}:
      channels = [graph.channels.get(v) or 1 for v in alive if v != 0]  # 0: the image's
      n = batch * sum(channels) * math.prod(sizes[min(alive)])
      found.append(Cut(k, step.name, sorted(alive), n))
  return found


class _Planner:
  """Stages between cuts, each planned once: sources from the cut before, sinks at the cut
  after (or the passes to the end), its tile from the memory limit (or `tile`)."""

  def __init__(self, graph: Any, shape: tuple[int, ...], tile: int | None, limit: int) -> None:
    self.graph, self.shape, self.tile, self.limit = graph, shape, tile, limit
    self.whole = _plan.passes(graph, shape[1:-1])
    self.order = _order(graph, self.whole)
    self.itemsize = max(graph.input_dtype.size, 4)
    self.cuts = cuts(graph, self.whole, shape[0])
    self.cache: dict[tuple[int, int], Stage | None] = {}

  def stage(self, a: int, b: int, most: int | None = None) -> Stage | None:
    """The stage from cut `a` (-1: the input) to cut `b` (len(cuts): the end), its tile at
    most `most`; None where the memory limit holds no tile of it."""
    if (a, b) not in self.cache:
      self.cache[a, b] = self._stage(a, b, most)
    return self.cache[a, b]

  def _stage(self, a: int, b: int, most: int | None) -> Stage | None:
    sizes, batch = self.whole[-1].sizes, self.shape[0]
    sources = self.cuts[a].values if a >= 0 else [0]
    if b == len(self.cuts):
      geometries = _plan.passes(self.graph, sizes, sources)
      last, stored = self.graph.steps[self.graph.output - 1].name, 0
    else:
      geometries = [_plan.Geometry(self.graph, sizes, set(self.cuts[b].values), sources)]
      last = self.cuts[b].name
      stored = self.cuts[b].elements * self.itemsize
    tile = self.tile
    if tile is None:
      try:
        tile = min(
          _plan.choose_tile(g, self.limit, batch, self.itemsize, most=most) for g in geometries
        )
      except ValueError:
        return None
    tilings = [_plan.Tiling(g, g.tile_out(tile)) for g in geometries]
    first = self.order[self.cuts[a].position + 1 if a >= 0 else 0].name
    return Stage(tilings, tile, first, last, stored)

  def cost(self, a: int, b: int, most: int | None = None) -> float:
    """The stage's work over all its tiles and passes, plus the price of what it stores."""
    stage = self.stage(a, b, most)
    if stage is None:
      return math.inf
    stored = self.cuts[b].elements if b < len(self.cuts) else 0
    return sum(d for d, _ in stage.work) + DISK_COST * stored

  def merged(self) -> list[int]:
    """Cuts chosen by merging stages bottom up: from a stage between every two single-value
    cuts, the two neighbours whose merge lowers the cost most, while one does. A merged
    stage's tile is searched up to the smaller of its parts' (holding more layers, its tile
    holds more)."""
    bounds = [-1] + [i for i, c in enumerate(self.cuts) if len(c.values) == 1] + [len(self.cuts)]

    def gain(a: int, m: int, b: int) -> float:
      parts = [self.stage(a, m), self.stage(m, b)]
      if any(p is None for p in parts):
        return -math.inf  # a part that fits no tile: merged, it would hold more
      most = min(p.tile for p in parts)  # type: ignore[union-attr]
      merged = self.cost(a, b, most)
      return -math.inf if merged == math.inf else self.cost(a, m) + self.cost(m, b) - merged

    while len(bounds) > 2:
      gains = [gain(*bounds[j - 1 : j + 2]) for j in range(1, len(bounds) - 1)]
      best = int(np.argmax(gains))
      if not gains[best] > 0:
        break
      del bounds[best + 1]
    return bounds

  def named(self, names: Sequence[str]) -> list[int]:
    """The cuts after the layers `names`."""
    by_name = {c.name: i for i, c in enumerate(self.cuts)}
    chosen = []
    for name in names:
      if name not in by_name:
        steps = [s.name for s in self.order]
        why = (
          "is not a layer of the streamed part"
          if name not in steps
          else "is not followed by a cut: the values alive after it differ in size, or it "
          "is at or after the first global pooling"
        )
        raise ValueError(f"stages: layer {name!r} {why}")
      chosen.append(by_name[name])
    return [-1] + sorted(set(chosen)) + [len(self.cuts)]


def _staged(
  graph: Any,
  shape: tuple[int, ...],
  tile: int | None,
  limits: tuple[int, int],
  stages: bool | Sequence[str] | None,
) -> tuple[StreamPlan | None, float]:
  """(the staged plan, its cost) with each stage's tile fitting the first of `limits` (the
  plan's limit: the second); no plan where no cut pays or a stage fits no tile."""
  planner = _Planner(graph, shape, tile, limits[0])
  bounds = planner.merged() if stages in (None, True) else planner.named(stages)  # type: ignore[arg-type]
  chosen = [planner.stage(a, b) for a, b in zip(bounds, bounds[1:])]
  if len(bounds) == 2 or any(s is None for s in chosen):
    return None, math.inf
  cost = sum(planner.cost(a, b) for a, b in zip(bounds, bounds[1:]))
  staged = StreamPlan(
    chosen,  # type: ignore[arg-type]
    shape,
    limits[1],
    shape[0],
    planner.itemsize,
    whole=planner.whole[-1],
  )
  return staged, cost


def plan(
  graph: Any,
  shape: tuple[int, ...],
  tile: int | None,
  memory_limit: int | None,
  stages: bool | Sequence[str] | None,
) -> StreamPlan:
  """The plan of `graph` over a batch of `shape`, in stages: False, one stage (`plan_for`);
  None, stages where they cut the work (disk included) by `MARGIN` at least, when the tile
  is chosen from the memory limit and the image is more than one tile; True, the stages
  `_Planner.merged` chooses; layer names: cuts after those layers. The stages' tiles are
  chosen for a budget lowered until all the stages in turn fit the limit (TensorFlow's pool
  keeps what each took: `StreamPlan.peak_bytes`)."""
  try:
    single: StreamPlan | None = plan_for(graph, shape, tile, memory_limit)
  except ValueError as e:  # the limit holds no tile of the whole network: stages may fit
    if stages is False or tile is not None:
      raise
    single, too_small = None, e
  if stages is False or (
    single is not None
    and stages is None
    and (tile is not None or all(t.count == 1 for t in single.tilings))
  ):
    return single  # type: ignore[return-value]
  limit = _plan.DEFAULT_MEMORY_LIMIT if memory_limit is None else int(memory_limit)
  budget = limit
  for _ in range(4):
    staged, cost = _staged(graph, tuple(shape), tile, (budget, limit), stages)
    if staged is None or tile is not None or staged.worst_bytes <= limit:
      break
    budget = int(budget * limit / staged.worst_bytes * 0.95)
  if staged is not None and tile is None and staged.worst_bytes > limit:
    staged = None
  if staged is None:
    if single is not None and (stages in (None, True) or tile is not None):
      return single
    if single is None:
      raise too_small
    raise ValueError(
      f"memory_limit: {limit} bytes holds no tiles of the stages cut after {list(stages)}"  # type: ignore[arg-type]
      "; raise it, or cut elsewhere"
    )
  if single is not None and stages is None:
    if cost > (1 - MARGIN) * sum(d for d, _ in single.stages[0].work):
      return single
  return staged


def _index(spans: Sequence[Range]) -> tuple[slice, ...]:
  """The index of `spans` in a (batch, *spatial, channels) array."""
  return (slice(None),) + tuple(slice(a, b) for a, b in spans) + (slice(None),)


class _Stores:
  """The values stages hand on, as `.npy` memory maps in `folder`, made on their first
  tile (their dtype is the one they were computed in)."""

  def __init__(self, folder: str, sizes: dict[int, tuple[int, ...]]) -> None:
    self.folder, self.sizes = folder, sizes
    self.maps: dict[int, np.ndarray] = {}

  def _path(self, v: int) -> str:
    return os.path.join(self.folder, f"value{v}.npy")

  def writer(self, skip: Sequence[int]) -> _run.Store:
    """Stores a tile of each value but those in `skip` (a stage's sources it passes on)."""

    def store(v: int, spans: Sequence[Range], tile: np.ndarray) -> None:
      if v in skip:
        return
      if v not in self.maps:
        shape = (tile.shape[0], *self.sizes[v], tile.shape[-1])
        self.maps[v] = np.lib.format.open_memmap(self._path(v), "w+", tile.dtype, shape)
      self.maps[v][_index(spans)] = tile

    return store

  def reader(self, v: int) -> _run.Reader:
    def read(spans: Sequence[Range]) -> np.ndarray:
      return np.asarray(self.maps[v][_index(spans)])

    return read

  def keep(self, values: set[int]) -> None:
    """Removes the files of every value not in `values`."""
    for v in [v for v in self.maps if v not in values]:
      del self.maps[v]
      os.remove(self._path(v))


def run(
  stream_plan: StreamPlan,
  read: _run.Reader,
  dtype: tf.DType,
  write: Callable[[Sequence[Range], np.ndarray], None] | None,
  progress: Callable[[int, int], None] | None = None,
) -> dict[int, tf.Tensor]:
  """Runs the plan's stages in order (`_run.run` for one), handing values on through a
  temporary folder, removed when done or on error. Returns what `_run.run` does."""
  stages = stream_plan.stages
  if len(stages) == 1:
    return _run.run(stages[0].tilings, read, dtype, write, progress)
  counts = [sum(t.count for t in s.tilings) for s in stages]
  with tempfile.TemporaryDirectory(prefix="tf_largeconv-stages-") as folder:
    stores = _Stores(folder, stages[0].tiling.geometry.sizes)
    for k, stage in enumerate(stages):
      sources = stage.tiling.geometry.sources
      readers = {v: read if v == 0 else stores.reader(v) for v in sources}

      def step_progress(done: int, _: int, before: int = sum(counts[:k])) -> None:
        if progress is not None:
          progress(before + done, sum(counts))

      if k == len(stages) - 1:
        return _run.run(stage.tilings, readers, dtype, write, step_progress)
      store = stores.writer(sources)
      _run.run_pass(stage.tiling, readers, dtype, None, step_progress, store=store)
      stores.keep(set(stages[k + 1].tiling.geometry.sources))
  raise AssertionError("unreachable")
