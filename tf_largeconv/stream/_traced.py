"""A dense training step's tiles as traced functions: each tile's forward pass under the
tape, its loss and its gradients run as one `tf.function`, so that TensorFlow's graph
optimizer fuses a convolution with its bias and activation and the executor frees what
the backward pass does not read. One function serves every tile that computes alike
(`tile_key`): a grid's interior tiles share one, its edges and corners one each.

Two tiles compute alike when every number the tile's run takes from the geometry is the
same once each value's range is measured from that value's own window: the ranges'
lengths, each step's span (`_rules.Span`: what it needs, what of that lies inside its
input, its padding), the step's output against its input scaled by the step (the
upsampling's and transposed convolution's crop), and the output tile against the output's
window. These are all a tile's run reads (`_run.run_tile`, the rules' `run`)."""

from __future__ import annotations

import collections
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import tensorflow as tf

from tf_largeconv.stream import _rules
from tf_largeconv.stream import _run
from tf_largeconv.stream import _windowed
from tf_largeconv.stream._plan import Tiling

# The traced functions a model keeps, the least recently used dropped first.
FUNCTIONS = 64


def traceable(tiling: Tiling, passes: int) -> bool:
  """Whether a dense step over `tiling` can run traced: one pass, no global pooling (a
  squeeze-excitation gate reads values of an earlier pass), under no tf.distribute
  strategy (each replica's variables are its own)."""
  g = tiling.geometry
  if passes != 1 or tf.distribute.has_strategy() or list(g.sources) != [0]:
    return False
  return not any(s.kind == "reduce" or s.globals for s in g.spatial_steps)


def axis_key(tiling: Tiling, axis: int, t: int) -> tuple[Any, ...]:
  """What tile number `t` along `axis` computes, measured from each value's window."""
  g = tiling.geometry
  ranges = tiling.ranges(axis, t)
  start = {v: a for v, (a, _) in ranges.items()}
  key: list[Any] = [tuple(sorted((v, b - a) for v, (a, b) in ranges.items()))]
  for step in g.spatial_steps:
    out = ranges.get(step.output)
    if out is None:
      key.append(None)
      continue
    a, b = out
    rule = step.rule
    lo, hi = rule.needs(axis, a, b) if a < b else (a, a)  # type: ignore[union-attr]
    first = step.inputs[0]
    sp = _rules.Span(a, b, lo, hi, g.sizes[first][axis])
    c_in, c_out = start.get(first, 0), start[step.output]
    inputs = tuple(sp.lo_in - start.get(v, 0) for v in step.inputs)
    scaled = Fraction(a - c_out) - (lo - c_in) * rule.scale(axis)  # type: ignore[union-attr]
    key.append((a - c_out, b - c_out, lo - c_in, hi - c_in, inputs, sp.pads, scaled))
  lo_t, hi_t = tiling.bounds[axis][t]
  key.append(tuple((lo_t - start[v], hi_t - start[v]) for v in g.sinks if v in start))
  return tuple(key)


def tile_key(tiling: Tiling, index: Sequence[int]) -> tuple[Any, ...]:
  return tuple(axis_key(tiling, i, t) for i, t in enumerate(index))


class TileSteps:
  """A model's traced tile steps, by `tile_key` and what the step is traced with."""

  def __init__(self) -> None:
    self._functions: collections.OrderedDict[Any, Any] = collections.OrderedDict()
    self._loss: tuple[Any, Any] | None = None

  def clear(self) -> None:
    self._functions.clear()

  def pixel_loss(self, compiled: Any, make: Any) -> Any:
    """`make(compiled)`, the compiled loss as per-pixel values, made once per loss: the
    steps are traced with it."""
    if self._loss is None or self._loss[0] is not compiled:
      self._loss = (compiled, make(compiled))
    return self._loss[1]

  def __len__(self) -> int:
    return len(self._functions)

  def run(
    self,
    tiling: Tiling,
    index: Sequence[int],
    window: Any,
    labels: Any,
    weights: Any,
    loss: Any,
    optimizer: Any,
    variables: list[Any],
  ) -> tuple[tf.Tensor, tf.Tensor, list[tf.Tensor], tf.Tensor]:
    """Tile `index`'s (loss, number of loss values, gradients of `variables`, prediction):
    its input `window`, `labels` and `weights` (or None) as arrays; `loss` the per-pixel
    loss (`_dense.PixelLoss`); `optimizer` scales the loss (`scale_loss`), or None."""
    key = (
      tile_key(tiling, index),
      weights is None,
      id(loss),
      id(optimizer),
      tuple(id(v) for v in variables),
      id(tiling.geometry.graph),
    )
    fn = self._functions.get(key)
    if fn is None:
      fn = _traced_step(tiling, tuple(index), loss, optimizer, variables)
      self._functions[key] = fn
      while len(self._functions) > FUNCTIONS:
        self._functions.popitem(last=False)
    else:
      self._functions.move_to_end(key)
    args = [tf.convert_to_tensor(window), tf.convert_to_tensor(labels)]
    if weights is not None:
      args.append(tf.convert_to_tensor(weights))
    part, count, grads, pred = fn(*args)
    return part, count, list(grads), pred


def _traced_step(
  tiling: Tiling, index: tuple[int, ...], loss: Any, optimizer: Any, variables: list[Any]
) -> Any:
  graph = tiling.geometry.graph

  @tf.function(autograph=False)
  def step(window: tf.Tensor, labels: tf.Tensor, weights: tf.Tensor | None = None) -> Any:
    with _windowed.tile_tape() as tape:
      sinks, _ = _run.run_tile(tiling, index, lambda spans: window, graph.input_dtype)
      pred = sinks[graph.output]
      values = loss.values(labels, pred, weights)
      part = tf.reduce_sum(values)
      scaled = optimizer.scale_loss(part) if optimizer is not None else part
    grads = tape.gradient(scaled, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return part, tf.size(values), grads, pred

  return step
