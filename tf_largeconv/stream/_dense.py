"""Dense training (`StreamingModel` without a head): the step over the tiles, and its
parts: the compiled loss as per-pixel values, the labels read tile by tile, and the sums
over tiles."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tf_largeconv.stream import _run
from tf_largeconv.stream import _traced
from tf_largeconv.stream import _windowed
from tf_largeconv.stream._plan import Range

# How a loss reduces its values: 'sum' adds them; the means divide the sum by their count.
SUMS = ("sum",)
MEANS = ("sum_over_batch_size", "mean")


class PixelLoss:
  """The compiled loss without its reduction, so that tiles' sums add up to the untiled
  sum; `divides` says whether the whole step's sum is then divided by the values' count."""

  def __init__(self, compiled: Any) -> None:
    if compiled is None:
      raise ValueError("StreamingModel without a head needs a loss: compile(loss=...)")
    if isinstance(compiled, (list, tuple, dict)):
      raise ValueError(
        "StreamingModel without a head trains one output: compile it with one loss, got "
        f"{type(compiled).__name__} {compiled!r}"
      )
    # An instance as it is (keras.losses.get would rebuild it from its config, which does
    # not keep its dtype); a name or function through Keras.
    loss = compiled if isinstance(compiled, keras.losses.Loss) else keras.losses.get(compiled)
    if isinstance(loss, keras.losses.Loss):
      reduction = loss.reduction
      # The same loss, every attribute kept (its dtype too; copy.copy rebuilds a Keras loss
      # from its config, which drops it), but for the reduction.
      self._values = object.__new__(type(loss))
      self._values.__dict__.update(vars(loss), reduction=None)
    else:  # a function of (y_true, y_pred), reduced as Keras reduces it when compiled
      reduction = "sum_over_batch_size"
      self._values = _Unreduced(loss)
    if reduction not in SUMS + MEANS:
      raise ValueError(
        f"StreamingModel without a head: the loss's reduction {reduction!r} is not a sum or "
        f"a mean over pixels; use one of {SUMS + MEANS}"
      )
    self.divides = reduction in MEANS

  def values(self, y_true: Any, y_pred: tf.Tensor, sample_weight: Any) -> tf.Tensor:
    """The loss's values on one tile, weighted, not reduced."""
    return self._values(y_true, y_pred, sample_weight=sample_weight)


class _Unreduced:
  """A loss function's values, weighted as Keras weighs them, not reduced."""

  def __init__(self, fn: Any) -> None:
    self._fn = fn

  def __call__(self, y_true: Any, y_pred: tf.Tensor, sample_weight: Any = None) -> tf.Tensor:
    values = self._fn(tf.convert_to_tensor(y_true), y_pred)
    if sample_weight is None:
      return values
    w = tf.cast(sample_weight, values.dtype)
    return values * tf.reshape(w, tf.concat([tf.shape(w), [1] * (values.ndim - w.ndim)], 0))


class Labels:
  """The labels of a batch, read one output tile at a time: (batch, *spatial) or
  (batch, *spatial, channels), from numpy, a tensor, dask, zarr or a memory map."""

  def __init__(self, y: Any, out_sizes: Sequence[int], batch: int) -> None:
    if y is None:
      raise ValueError("StreamingModel without a head needs labels y of the output's shape")
    if isinstance(y, (list, tuple)):
      y = np.asarray(y)
    shape = getattr(y, "shape", None)
    want = (batch, *out_sizes)
    if shape is None or not hasattr(y, "__getitem__"):
      raise TypeError(f"y must be an array of shape {want}[+ (channels,)], got {type(y).__name__}")
    shape = tuple(int(n) for n in shape)
    if shape[: len(want)] != want or len(shape) > len(want) + 1:
      raise ValueError(
        f"y has shape {shape}; the model's output over this batch is {want} (+ channels): "
        f"labels must have the output's batch and spatial shape"
      )
    self._y = y
    self._trailing = len(shape) - len(want)

  def read(self, spans: Sequence[Range]) -> np.ndarray:
    index = (slice(None),) + tuple(slice(a, b) for a, b in spans) + (slice(None),) * self._trailing
    part = self._y[index]
    if hasattr(part, "compute"):
      part = part.compute()
    return np.asarray(part)


class Weights:
  """A batch's sample weights, per tile: per image (batch,) or per pixel (the labels'
  batch and spatial shape, read tile by tile like them)."""

  def __init__(self, weights: Any, out_sizes: Sequence[int], batch: int) -> None:
    self._per_pixel: Labels | None = None
    self._per_image: np.ndarray | None = None
    if weights is None:
      return
    shape = tuple(int(n) for n in getattr(weights, "shape", np.shape(weights)))
    if shape == (batch,):
      self._per_image = np.reshape(np.asarray(weights), (batch,) + (1,) * len(out_sizes))
    elif shape == (batch, *out_sizes):
      self._per_pixel = Labels(weights, out_sizes, batch)
    else:
      raise ValueError(
        f"sample_weight has shape {shape}: give one weight per image {(batch,)} or per "
        f"output pixel {(batch, *out_sizes)}"
      )

  def read(self, spans: Sequence[Range]) -> np.ndarray | None:
    return self._per_image if self._per_pixel is None else self._per_pixel.read(spans)


class TileSums:
  """A step's loss and gradients, summed over tiles in tile order (the same every step)."""

  def __init__(self, variables: list[Any]) -> None:
    self._loss: tf.Tensor | None = None
    self._count = 0
    self._grads: list[Any] = [None] * len(variables)

  def add(self, loss: tf.Tensor, count: int, grads: list[tf.Tensor]) -> None:
    self._loss = loss if self._loss is None else self._loss + loss
    self._count += count
    self._grads = [g if t is None else t + g for t, g in zip(self._grads, grads)]

  def result(self, divides: bool) -> tuple[tf.Tensor, list[tf.Tensor]]:
    """(the loss, the gradients): sums, or means over the loss's values."""
    assert self._loss is not None
    if not divides:
      return self._loss, self._grads
    # Under a tf.distribute strategy each replica's mean is also divided by the number of
    # replicas, whose gradients are then summed, as Keras scales its own mean losses.
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    n = max(self._count, 1) * replicas
    return self._loss / tf.cast(n, self._loss.dtype), [g / tf.cast(n, g.dtype) for g in self._grads]


def update_metrics(
  compiled: Any, y: np.ndarray, pred: tf.Tensor, weights: np.ndarray | None, share: float
) -> None:
  """Updates the compiled metrics with one tile so that, over all tiles, they reach the
  untiled model's values: a metric that sums over pixels (a confusion matrix, true
  positives) takes the tile as it is; a mean (accuracy, MSE: Keras averages each image's
  values, then the images) takes the tile's share `share` of the image's pixels as an
  extra weight, so a small edge tile counts for its pixels only. `compiled` is Keras's
  CompileMetrics (the model's compiled metrics), or None."""
  if compiled is None:
    return
  if not compiled.built:
    compiled.build(y, pred)
  # Keras keeps `metrics=` and `weighted_metrics=` apart only in these two lists; the
  # first never sees the sample weights.
  weighted = {id(m) for m in _flat(getattr(compiled, "_flat_weighted_metrics", []))}
  for metric in compiled.metrics:
    w: Any = weights if id(metric) in weighted else None
    if isinstance(metric, keras.metrics.Mean):
      w = share if w is None else w * share
    metric.update_state(y, pred, sample_weight=w)


def _flat(metrics: list[Any]) -> list[Any]:
  found: list[Any] = []
  for m in metrics:
    found.extend(getattr(m, "metrics", [m]) if m is not None else [])
  return found


def step(
  model: Any, source: Any, plan: Any, y: Any, sample_weight: Any, training: bool
) -> tuple[tf.Tensor, Any, list[tf.Tensor], list[Any]]:
  """Dense training or evaluation of `model` (a StreamingModel without a head): every
  output tile's loss (and, training, gradients) from its input window, summed; metrics
  updated per tile. A training step's tiles run traced where they can
  (`model.trace_tiles`, `_traced.traceable`), else eagerly under a tape."""
  g = model._stream_graph
  loss = model._tile_steps.pixel_loss(model.loss, PixelLoss)
  out_sizes, batch = plan.tiling.geometry.out_sizes, source.shape[0]
  labels = Labels(y, out_sizes, batch)
  weights = Weights(sample_weight, out_sizes, batch)
  variables = list(model.trunk.trainable_variables) if training else []
  traced = training and model.trace_tiles and _traced.traceable(plan.tiling, len(plan.tilings))
  sums = TileSums(variables)
  for index in plan.tiling.tiles():
    bounds = [plan.tiling.bounds[i][t] for i, t in enumerate(index)]
    y_tile, w_tile = labels.read(bounds), weights.read(bounds)
    if traced:
      window = source.read(plan.tiling.window(index, 0))
      part, count, grads, pred = model._tile_steps.run(
        plan.tiling, index, window, y_tile, w_tile, loss, model.optimizer, variables
      )
      sums.add(part, int(count), grads)
    else:
      # Evaluation records nothing: a tape would keep every value of the tile.
      with _windowed.tile_tape() if training else contextlib.nullcontext() as tape:
        sinks, _ = _run.run_tile(plan.tiling, index, source.read, g.input_dtype)
        pred = sinks[g.output]
        values = loss.values(y_tile, pred, w_tile)
        part = tf.reduce_sum(values)
        scaled = model.optimizer.scale_loss(part) if training and model.optimizer else part
      grads = (
        tape.gradient(scaled, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        if tape is not None
        else []
      )
      sums.add(part, int(tf.size(values)), grads)
    share = float(np.prod([b - a for a, b in bounds])) / float(np.prod(out_sizes))
    update_metrics(model._compile_metrics, y_tile, pred, w_tile, share)
  total, grads = sums.result(loss.divides)
  if model.trunk.losses:  # regularization: once per step, not per tile
    with tf.GradientTape() as tape:
      extra = tf.add_n([tf.cast(v, total.dtype) for v in model.trunk.losses])
      extra = extra / tf.cast(tf.distribute.get_strategy().num_replicas_in_sync, extra.dtype)
    if training:
      more = tape.gradient(extra, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
      grads = [gr + tf.cast(m, gr.dtype) for gr, m in zip(grads, more)]
    total = total + extra
  return total, None, grads, variables
