"""StreamingModel: a Keras model trained on images larger than memory, its convolutional
trunk streamed tile by tile forwards and backwards, with the untiled model's gradients.

With a head (classification, regression of one value per image), a training step:
1. streams the trunk forward over the batch (tile by tile, nothing but the trunk's output
   kept: its mean, in memory, or on disk beyond the memory limit, `_trunk_out`), untaped;
2. runs the head and the loss on the trunk's output, and takes the gradients of the loss
   with respect to the head's variables and to the trunk's output (in memory or on disk);
3. streams the backward pass: each tile's forward is computed again from its input window
   under a gradient tape, and the tile's slice of the trunk-output gradient is pushed
   through it; the trunk's variable gradients are summed over the tiles in tile order
   (the same order every step: deterministic).
Every trunk output pixel belongs to one tile and a tile's forward computes it from the same
values as the untiled trunk, so the summed gradients are the untiled model's (float
rounding aside).

Without a head (dense training: segmentation, per-pixel regression), the whole model is
streamed and its output is the prediction. A step runs each output tile once, under a
gradient tape: the tile's forward from its input window, the loss of its pixels against the
same tile of the labels (read by tile, like the input), and the gradients of that partial
loss. The loss is a sum over pixels, so the tiles' losses and gradients add up to the
untiled ones; a mean divides both by the number of loss values once at the end. Nothing of
the size of the image is held: not the prediction, not its gradient.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tf_largeconv import _arrays
from tf_largeconv.stream import _backprop
from tf_largeconv.stream import _dense
from tf_largeconv.stream import _distribute
from tf_largeconv.stream import _graph
from tf_largeconv.stream import _lazy
from tf_largeconv.stream import _plan
from tf_largeconv.stream import _run
from tf_largeconv.stream import _traced
from tf_largeconv.stream import _trunk_out
from tf_largeconv.stream import _windowed
from tf_largeconv.stream._report import StreamPlan
from tf_largeconv.stream._report import plan_for
from tf_largeconv.stream._source import Source
from tf_largeconv.stream._trunk_out import reads_only_the_mean

STOCHASTIC = (
  keras.layers.Dropout,
  keras.layers.SpatialDropout1D,
  keras.layers.SpatialDropout2D,
  keras.layers.SpatialDropout3D,
  keras.layers.GaussianNoise,
  keras.layers.GaussianDropout,
  keras.layers.AlphaDropout,
)


def _layers_of(model: Any) -> list[Any]:
  found = []
  for layer in model.layers:
    found.append(layer)
    if isinstance(layer, keras.Model):
      found.extend(_layers_of(layer))
  return found


def check_trunk(trunk: Any, graph: _graph.Graph) -> None:
  """A trunk trains streamed only if every layer computes the same on every tile: no
  global pooling (the head's), no trainable BatchNormalization (its batch statistics span
  the image), no dropout or noise (its masks would differ between the two passes)."""
  if not graph.spatial.get(graph.output, False):
    raise ValueError(
      f"trunk '{trunk.name}' ends in a global pooling; a StreamingModel's trunk ends in an "
      "image-shaped tensor: move the pooling to the head"
    )
  pooled = [s.name for s in graph.steps if s.kind == "reduce"]
  if pooled:
    raise ValueError(
      f"trunk '{trunk.name}' pools the image inside ('{pooled[0]}', as squeeze-excitation "
      "does): a StreamingModel's trunk trains streamed without global context; move the "
      "pooling to the head"
    )
  for layer in _layers_of(trunk):
    if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable:
      raise ValueError(
        f"trunk '{trunk.name}': BatchNormalization '{layer.name}' is trainable. A streamed "
        "trunk computes batch normalization from its moving statistics, which training "
        "would not; freeze it (layer.trainable = False) or move it to the head"
      )
    if isinstance(layer, STOCHASTIC):
      raise ValueError(
        f"trunk '{trunk.name}': {type(layer).__name__} '{layer.name}' draws random masks, "
        "which would differ between the forward pass and the backward pass's recompute; "
        "move it to the head"
      )


@keras.saving.register_keras_serializable(package="tf_largeconv")
class StreamingModel(keras.Model):
  """A Keras model `head(trunk(x))` whose trunk runs tile by tile, in training too; or,
  with `head=None`, a model whose every output pixel is predicted and trained tile by tile
  (dense training: segmentation, per-pixel regression).

  `compile`, `fit`, `train_on_batch`, `evaluate` and `predict` work as for any Keras
  model, with any optimizer, loss, metrics and callbacks; steps run eagerly (the tiles are
  a Python loop), and `compile` says so if asked for `run_eagerly=False` or XLA.

  Args:
    trunk: a Keras model (functional or Sequential, channels last) that
      `tf_largeconv.stream` can stream and that ends in an image-shaped tensor; its
      BatchNormalization layers frozen; no dropout or noise layers.
    head: a Keras model or layer taking the trunk's output (global pooling, dense
      layers, ...), run on the output's mean, whole, or tile by tile (`plan(...)`'s
      `trunk_output` says which). None: the trunk is the whole model; its output is the
      prediction, the labels `y` have the output's spatial shape
      (batch, *spatial[, channels]) and are read tile by tile from any array the
      input may be (numpy, dask, zarr, memory map), and the compiled loss must be one loss
      reduced by 'sum', 'sum_over_batch_size' or 'mean' (a sum or mean over pixels).
    tile: the tile side in input pixels (see `tf_largeconv.stream.predict`); None: the
      largest whose training step fits `memory_limit`.
    memory_limit: bytes a tile's training step may hold (default 1 GiB); a trunk output
      whose size and its gradient's exceed it is kept on disk (a temporary memory map).
    trace_tiles: without a head, run each tile's training step (its forward pass, loss and
      gradients) as one traced function, one for each kind of tile (interior, edge,
      corner), traced on the first step that meets it: faster (TensorFlow fuses a
      convolution with its bias and activation, and runs the step as one graph), but its
      memory is not what `plan()` counts, which is the eager step's: the graph may run
      independent gradient ops at once, so `memory_limit` is not guaranteed. Tiles of a
      network with a squeeze-excitation gate, or under a tf.distribute strategy, run
      eagerly.
    **kwargs: for `keras.Model` (name, ...).

  Raises:
    ValueError: a trunk that cannot be streamed or trained streamed (the message names the
      layer), malformed tile or memory_limit.
  """

  def __init__(
    self,
    trunk: Any,
    head: Any = None,
    *,
    tile: int | None = None,
    memory_limit: int | None = None,
    trace_tiles: bool = False,
    **kwargs: Any,
  ) -> None:
    super().__init__(**kwargs)
    _plan.check_tile(tile, memory_limit)
    if not isinstance(trace_tiles, bool):
      raise TypeError(f"trace_tiles must be True or False, got {trace_tiles!r}")
    self.trunk, self.head = trunk, head
    self.tile, self.memory_limit, self.trace_tiles = tile, memory_limit, trace_tiles
    self._tile_steps = _traced.TileSteps()
    self._stream_graph = _graph.build(trunk)
    check_trunk(trunk, self._stream_graph)
    self._pooled_head = head is not None and reads_only_the_mean(head)
    # A head with dropout, noise or trainable BatchNormalization trains whole: its layers
    # run with training=True.
    whole = (
      head is None
      or self._pooled_head
      or any(
        isinstance(layer, STOCHASTIC)
        or (isinstance(layer, keras.layers.BatchNormalization) and layer.trainable)
        for layer in (_layers_of(head) if isinstance(head, keras.Model) else [])
      )
    )
    self._streamed_head = None if whole else _trunk_out.StreamedHead.of(head)
    self._plans: dict[tuple[int, ...], StreamPlan] = {}  # by batch shape and training

  def plan(self, shape: tuple[int, ...], training: bool = True) -> StreamPlan:
    """The plan of a training step (training=False: of the streamed forward pass) on a
    batch of `shape` (batch, *spatial, channels): tiles, halos, recomputed share, the
    memory the tiles' passes take (`peak_bytes`, `worst_bytes`), and `trunk_output` (a
    `TrunkOutputPlan`): where the trunk's output and its gradient are kept (its mean,
    memory or disk) and their bytes in memory and on disk, beyond that."""
    shape = tuple(int(n) for n in shape)
    key = shape + (int(training),)
    if key not in self._plans:
      peak = _backprop.step_peak(training, forward=self.head is not None)
      plan = plan_for(self._stream_graph, shape, self.tile, self.memory_limit, peak)
      if self.head is not None:
        how = "mean" if self._pooled_head else "streamed" if self._streamed_head else "whole"
        itemsize = self._stream_graph.input_dtype.size
        plan.trunk_output = _trunk_out.plan_trunk_output(plan, how, itemsize, training)
      self._plans[key] = plan
    return self._plans[key]

  def _batch(self, x: Any, training: bool) -> tuple[Source, StreamPlan]:
    g = self._stream_graph
    source = Source(x, g.rank, g.channels[0])
    if source.layout != "batched":
      raise ValueError(f"x must be a batch (batch, *spatial, channels), got shape {source.shape}")
    return source, self.plan(source.shape, training)

  def _trunk_forward(self, source: Source, plan: StreamPlan, out: Any = None) -> tf.Tensor:
    """The trunk's output, streamed tile by tile into one buffer (or into `out`, a
    memory map, then returned as it is)."""
    g = self._stream_graph
    given = out is not None
    if not given:
      sizes = plan.tiling.geometry.out_sizes
      shape = (source.shape[0], *sizes, g.channels[g.output] or 1)
      out = _arrays.aligned_empty(shape, g.out_dtype)
    _run.run(plan.tilings, source.read, g.input_dtype, source.writer(out))
    return out if given else _arrays.as_tensor(out)  # the buffer's memory, not a copy

  def _pooled(self, source: Source, plan: StreamPlan) -> tf.Tensor:
    """The trunk output's spatial mean as a 1 x ... x 1 image (batch, 1, ..., channels),
    streamed tile by tile: what a head that reads only that mean sees of the output."""
    g, tiling = self._stream_graph, plan.tiling
    total = None
    for index in tiling.tiles():
      sinks, _ = _run.run_tile(tiling, index, source.read, g.input_dtype)
      part = tf.reduce_sum(tf.cast(sinks[g.output], tf.float64), axis=list(range(1, g.rank + 1)))
      total = part if total is None else total + part
    assert total is not None
    count = float(np.prod(tiling.geometry.out_sizes))
    mean = tf.cast(total / count, g.out_dtype)
    return tf.reshape(mean, [source.shape[0]] + [1] * g.rank + [mean.shape[-1]])

  def call(self, x: Any, training: bool | None = None) -> Any:
    if isinstance(x, tf.Tensor) and not tf.executing_eagerly():
      # Keras tracing the model to build its metrics and losses (as `fit` does under a
      # distribution strategy): the untiled graph gives the shapes; steps always run
      # eagerly (`run_eagerly`), so this graph is never run on an image.
      z = self.trunk(x, training=False)
      return z if self.head is None else self.head(z, training=training)
    source, plan = self._batch(x, training=False)
    if self._pooled_head:
      return self.head(self._pooled(source, plan), training=training)
    if self.head is not None and plan.trunk_output.where == "disk":
      return _trunk_out.disk_predict(self, source, plan, training)
    z = self._trunk_forward(source, plan)
    return z if self.head is None else self.head(z, training=training)

  def compute_output_spec(self, x: Any, training: bool | None = None) -> Any:
    z = self.trunk.compute_output_spec(x)
    return z if self.head is None else self.head.compute_output_spec(z)

  def build(self, input_shape: Any) -> None:
    self.built = True

  def _maybe_symbolic_build(self, iterator: Any = None, data_batch: Any = None) -> None:
    strategy = self.distribute_strategy
    if _distribute.build_from_first_replica(strategy, iterator) and data_batch is None:
      data_batch, iterator = _distribute.first_batch(strategy, iterator), None
    super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

  @property
  def run_eagerly(self) -> bool:
    """Always True: the tiles are a Python loop (also for a model not compiled)."""
    return True

  @run_eagerly.setter
  def run_eagerly(self, value: bool) -> None:
    pass

  @property
  def jit_compile(self) -> bool:
    return False

  @jit_compile.setter
  def jit_compile(self, value: Any) -> None:
    pass

  def compile(self, *args: Any, **kwargs: Any) -> None:
    if kwargs.get("run_eagerly") is False or kwargs.get("jit_compile") is True:
      raise ValueError(
        "StreamingModel runs its steps eagerly (its tiles are a Python loop): leave "
        "run_eagerly and jit_compile unset"
      )
    kwargs.update(run_eagerly=True, jit_compile=False)
    super().compile(*args, **kwargs)
    self._tile_steps.clear()  # traced with the loss and optimizer compiled before

  def streamed_gradients(
    self, x: Any, y: Any, sample_weight: Any = None
  ) -> tuple[tf.Tensor, Any, list[tf.Tensor], list[Any]]:
    """One step's loss, prediction, gradients and variables (trunk's then head's), without
    applying them: what `train_step` applies. Where the whole batch is one tile, the tile
    runs once under the tape (nothing to recompute). Without a head, the prediction is
    None (it is never whole in memory) and the compiled metrics are updated tile by tile."""
    check_trunk(self.trunk, self._stream_graph)
    g = self._stream_graph
    source, plan = self._batch(x, training=True)
    if self.head is None:
      return _dense.step(self, source, plan, y, sample_weight, training=True)
    head_vars = _trunk_out.head_variables(self, plan)
    trunk_vars = list(self.trunk.trainable_variables)
    one_tile = plan.tiles == 1
    if not one_tile and plan.trunk_output.where == "disk":
      data = (x, y, sample_weight)
      loss, y_pred, grads = _trunk_out.disk_step(self, source, plan, data, trunk_vars, head_vars)
      return loss, y_pred, grads, trunk_vars + head_vars
    if not one_tile:  # streamed forward, outside the tape: nothing of the tiles is kept
      # A head that reads only the output's mean gets that mean as a 1 x 1 image: the
      # output itself is never whole.
      z = self._pooled(source, plan) if self._pooled_head else self._trunk_forward(source, plan)
    with _windowed.tile_tape() as tape:
      if one_tile:
        sinks, _ = _run.run_tile(plan.tiling, (0,) * g.rank, source.read, g.input_dtype)
        z = sinks[g.output]
      else:
        tape.watch(z)
      y_pred = self.head(z, training=True)
      loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
      scaled = self.optimizer.scale_loss(loss) if self.optimizer is not None else loss
    if one_tile:
      grads = tape.gradient(
        scaled, trunk_vars + head_vars, unconnected_gradients=tf.UnconnectedGradients.ZERO
      )
      return loss, y_pred, grads, trunk_vars + head_vars
    *head_grads, dz = tape.gradient(scaled, head_vars + [z])
    if self._pooled_head:
      trunk_grads = self._backward_pooled(plan, source, dz, trunk_vars)
    else:
      trunk_grads = self._backward(plan, source, dz, trunk_vars)
    return loss, y_pred, trunk_grads + head_grads, trunk_vars + head_vars

  def _backward(
    self, plan: StreamPlan, source: Source, dz: Any, variables: list[Any]
  ) -> list[tf.Tensor]:
    """The trunk's gradients from `dz`, the gradient of its output (a tensor, or a memory
    map read one tile at a time)."""
    g, tiling = self._stream_graph, plan.tiling
    totals: list[Any] = [None] * len(variables)
    for index in tiling.tiles():
      with _windowed.tile_tape() as tape:
        sinks, _ = _run.run_tile(tiling, index, source.read, g.input_dtype)
      bounds = [tiling.bounds[i][t] for i, t in enumerate(index)]
      part = dz[_trunk_out.window_index(bounds)]
      if isinstance(part, np.ndarray):  # a memory map's: read here
        part = tf.convert_to_tensor(np.ascontiguousarray(part))
      grads = tape.gradient(
        sinks[g.output],
        variables,
        output_gradients=part,
        unconnected_gradients=tf.UnconnectedGradients.ZERO,
      )
      totals = [gr if t is None else t + gr for t, gr in zip(totals, grads)]
    return totals

  def _backward_pooled(
    self, plan: StreamPlan, source: Source, d_mean: tf.Tensor, variables: list[Any]
  ) -> list[tf.Tensor]:
    """The trunk's gradients from the gradient of its output's mean: each tile pushes it
    through its share of the mean (its sum over the output's pixel count)."""
    g, tiling = self._stream_graph, plan.tiling
    count = float(np.prod(tiling.geometry.out_sizes))
    d_mean = tf.reshape(d_mean, [d_mean.shape[0], d_mean.shape[-1]])
    totals: list[Any] = [None] * len(variables)
    for index in tiling.tiles():
      with _windowed.tile_tape() as tape:
        sinks, _ = _run.run_tile(tiling, index, source.read, g.input_dtype)
        z = sinks[g.output]
        share = tf.reduce_sum(z, axis=list(range(1, g.rank + 1))) / tf.cast(count, z.dtype)
      grads = tape.gradient(
        share,
        variables,
        output_gradients=tf.cast(d_mean, share.dtype),
        unconnected_gradients=tf.UnconnectedGradients.ZERO,
      )
      totals = [gr if t is None else t + gr for t, gr in zip(totals, grads)]
    return totals

  def train_step(self, data: Any) -> Any:
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    loss, y_pred, grads, variables = self.streamed_gradients(x, y, sample_weight)
    self._loss_tracker.update_state(
      _distribute.unscaled(loss), sample_weight=_distribute.batch_size(x)
    )
    self.optimizer.apply_gradients(zip(grads, variables))
    if y_pred is None:  # dense: the metrics were updated tile by tile
      return self._logs(self.get_metrics_result())
    return self._logs(self.compute_metrics(x, y, y_pred, sample_weight=sample_weight))

  def test_step(self, data: Any) -> Any:
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    if self.head is not None:  # Keras's test_step, but for reading the batch size
      y_pred = self.call(x, training=False)
      loss = self._compute_loss(x, y, y_pred, sample_weight, training=False)
    else:
      source, plan = self._batch(x, training=False)
      loss, _, _, _ = _dense.step(self, source, plan, y, sample_weight, training=False)
    batch, loss = _distribute.batch_size(x), _distribute.unscaled(loss)
    self._loss_tracker.update_state(loss, sample_weight=batch)
    if self.head is None:  # the metrics were updated tile by tile
      return self._logs(self.get_metrics_result())
    return self._logs(self.compute_metrics(x, y, y_pred, sample_weight=sample_weight))

  def predict_step(self, data: Any) -> Any:
    return self.call(keras.utils.unpack_x_y_sample_weight(data)[0], training=False)

  # A PyDataset's batches reach the steps as the dataset returns them (`_lazy`); the steps
  # call `call` (Keras's __call__ would turn a lazy batch into a tensor).
  fit = _lazy.keeping_batches(keras.Model.fit)
  evaluate = _lazy.keeping_batches(keras.Model.evaluate)
  predict = _lazy.keeping_batches(keras.Model.predict)

  def _logs(self, logs: dict[str, Any]) -> dict[str, Any]:
    return _distribute.step_logs(self.distribute_strategy, logs)

  def get_config(self) -> dict[str, Any]:
    return {
      "name": self.name,
      "trunk": keras.saving.serialize_keras_object(self.trunk),
      "head": None if self.head is None else keras.saving.serialize_keras_object(self.head),
      "tile": self.tile,
      "memory_limit": self.memory_limit,
      "trace_tiles": self.trace_tiles,
    }

  @classmethod
  def from_config(cls, config: dict[str, Any]) -> StreamingModel:
    config = dict(config)
    trunk = keras.saving.deserialize_keras_object(config.pop("trunk"))
    head = config.pop("head")
    head = None if head is None else keras.saving.deserialize_keras_object(head)
    return cls(trunk, head, **config)
