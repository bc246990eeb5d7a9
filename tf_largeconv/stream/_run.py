"""Runs a streaming graph tile by tile: reads each tile's input window, computes every layer
over its range (`_plan.Tiling`), writes the tile of the output or adds it to the global
poolings, then runs the head on the pooled values."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_largeconv import _arrays
from tf_largeconv.stream import _rules
from tf_largeconv.stream._plan import Range
from tf_largeconv.stream._plan import Tiling

Reader = Callable[[Sequence[Range]], np.ndarray]
# What a tile reads its sources from: the input's reader, or one reader per source value
# (a stage of a staged stream, `_stages`). The input (value 0) is cast to the graph's dtype;
# stored values are read in the dtype they were computed in.
Readers = Reader | Mapping[int, Reader]
Store = Callable[[int, Sequence[Range], np.ndarray], None]


def _crop(x: tf.Tensor, starts: Sequence[int], spans: Sequence[Range]) -> tf.Tensor:
  """The part [a, b) per axis of a window that starts at `starts`."""
  return _rules.crop(x, [a - s for s, (a, _) in zip(starts, spans)], [b - a for a, b in spans])


def run_tile(
  tiling: Tiling,
  index: Sequence[int],
  read: Readers,
  dtype: tf.DType,
  pooled: dict[int, tf.Tensor] | None = None,
) -> tuple[dict[int, tf.Tensor], dict[int, tuple[tf.Tensor, tf.DType]]]:
  """Computes tile `index`: (the tile of each tiled value (`Geometry.sinks`), the partial
  global pooling of each reduce step with the dtype of what it pooled). `pooled` holds the
  values known from earlier passes that steps read whole (`Step.globals`)."""
  g = tiling.geometry
  steps, last_use = g.spatial_steps, g.last_use
  windows: dict[int, tuple[tf.Tensor, list[int]]] = {}
  for v in g.sources:
    spans = tiling.window(index, v)
    if spans is not None:
      x = tf.convert_to_tensor((read[v] if isinstance(read, Mapping) else read)(spans))
      windows[v] = (tf.cast(x, dtype) if v == 0 else x, [a for a, _ in spans])
  tile = [tiling.bounds[i][t] for i, t in enumerate(index)]
  partials: dict[int, tuple[tf.Tensor, tf.DType]] = {}
  for k, step in enumerate(steps):
    rule = step.rule
    assert rule is not None
    if step.kind == "reduce":
      x, starts = windows[step.inputs[0]]
      partials[step.output] = (rule.partial(_crop(x, starts, tile)), x.dtype)  # type: ignore[attr-defined]
    else:
      out = tiling.window(index, step.output)
      if out is not None:
        if step.globals:
          y = _gated(step, rule, out, windows, pooled or {})
        else:
          y = _compute(step, rule, out, windows, g.sizes, g.graph.channels.get(step.output))
        windows[step.output] = (y, [a for a, _ in out])
    for v in set(step.inputs):
      if last_use.get(v) == k and v not in g.sinks:
        windows.pop(v, None)
  sinks = {v: _crop(*windows[v], tile) for v in g.sinks if v in windows}
  return sinks, partials


def _compute(
  step: Any,
  rule: _rules.Rule,
  out: Sequence[Range],
  windows: dict[int, tuple[tf.Tensor, list[int]]],
  sizes: dict[int, tuple[int, ...]],
  channels: int | None,
) -> tf.Tensor:
  first = step.inputs[0]
  spans = []
  for axis, (a, b) in enumerate(out):
    lo, hi = rule.needs(axis, a, b) if a < b else (a, a)
    spans.append(_rules.Span(a, b, lo, hi, sizes[first][axis]))
  lengths = [b - a for a, b in out]
  if min(lengths) <= 0:  # nothing of this value lies in the tile along some axis
    x = windows[first][0]
    return tf.zeros([x.shape[0], *lengths, channels or x.shape[-1]], x.dtype)
  inputs = [_crop(*windows[v], [(sp.lo_in, sp.hi_in) for sp in spans]) for v in step.inputs]
  y = rule.run(inputs, spans)
  if list(y.shape[1:-1]) != lengths:
    raise AssertionError(
      f"tf_largeconv.stream: layer '{step.name}' gave spatial shape {list(y.shape[1:-1])} for "
      f"a tile of {lengths}"
    )
  return y


def _gated(
  step: Any,
  rule: _rules.Rule,
  out: Sequence[Range],
  windows: dict[int, tuple[tf.Tensor, list[int]]],
  pooled: dict[int, tf.Tensor],
) -> tf.Tensor:
  """A per-pixel step that also reads pooled values: the image windows cropped to the
  step's range, the pooled values whole, in the order of the layer's call."""
  inputs = [_crop(*windows[v], out) for v in step.inputs]
  for position, v in step.globals:
    inputs.insert(position, pooled[v])
  return rule.run(inputs, [])


def run(
  tilings: Sequence[Tiling],
  read: Readers,
  dtype: tf.DType,
  write: Callable[[Sequence[Range], np.ndarray], None] | None,
  progress: Callable[[int, int], None] | None = None,
) -> dict[int, tf.Tensor]:
  """Runs the passes in order (`_plan.passes`), each over all its tiles: every pass but the
  last pools what later passes read, then the steps after those poolings run on the pooled
  values; the last pass writes each tile of the output with `write(ranges, array)`.
  Returns every pooled value and what the head computed from them (empty without global
  pooling)."""
  total = sum(t.count for t in tilings)
  values: dict[int, tf.Tensor] = {}
  for p, tiling in enumerate(tilings):

    def step_progress(done: int, _: int, before: int = sum(t.count for t in tilings[:p])) -> None:
      if progress is not None:
        progress(before + done, total)

    last = p == len(tilings) - 1
    values.update(run_pass(tiling, read, dtype, write if last else None, step_progress, values))
    run_head(tiling.geometry.graph, values)
  return values


def run_pass(
  tiling: Tiling,
  read: Readers,
  dtype: tf.DType,
  write: Callable[[Sequence[Range], np.ndarray], None] | None,
  progress: Callable[[int, int], None] | None = None,
  pooled: dict[int, tf.Tensor] | None = None,
  store: Store | None = None,
) -> dict[int, tf.Tensor]:
  """Runs every tile of one pass in order: each tile of the output goes to
  `write(ranges, array)`, and with `store`, the tile of every tiled value `v` to
  `store(v, ranges, array)` (a stage's results); the returned dict holds every global
  pooling's combined result (empty without one). `pooled`: the values known from earlier
  passes."""
  g = tiling.geometry
  reduces = [s for s in g.spatial_steps if s.kind == "reduce"]
  sums: dict[int, list[tf.Tensor]] = {s.output: [] for s in reduces}
  dtypes: dict[int, tf.DType] = {}
  out_value = g.graph.output if g.graph.spatial.get(g.graph.output) else None
  tiles = tiling.tiles()
  for done, index in enumerate(tiles):
    sinks, partials = run_tile(tiling, index, read, dtype, pooled)
    bounds = [tiling.bounds[i][t] for i, t in enumerate(index)]
    if out_value in sinks and write is not None:
      write(bounds, _arrays.as_array(sinks[out_value]))
    if store is not None:
      for v, y in sinks.items():
        store(v, bounds, _arrays.as_array(y))
    for v, (p, x_dtype) in partials.items():
      # Folded in tile order as they come: the same order on every run.
      sums[v] = [p] if not sums[v] else [_fold(sums[v][0], p, reduces, v)]
      dtypes[v] = x_dtype
    if progress is not None:
      progress(done + 1, len(tiles))
    del sinks, partials  # before the next tile's tensors are made
  count = int(np.prod(g.out_sizes))
  pooled = {}
  for s in reduces:
    rule = s.rule
    pooled[s.output] = rule.combine(sums[s.output], count, dtypes[s.output], g.rank)  # type: ignore[union-attr]
  return pooled


def _fold(total: tf.Tensor, part: tf.Tensor, reduces: list[Any], v: int) -> tf.Tensor:
  rule = next(s.rule for s in reduces if s.output == v)
  return tf.maximum(total, part) if rule.how == "max" else total + part


def run_head(graph: Any, values: dict[int, tf.Tensor]) -> None:
  """Runs the steps after the global poolings whose pooled values are known (in `values`),
  adding their results to `values`."""
  for step in graph.steps:
    if step.kind == "head" and step.output not in values:
      if all(v in values for v in step.inputs):
        values[step.output] = step.call(*[values[v] for v in step.inputs])
