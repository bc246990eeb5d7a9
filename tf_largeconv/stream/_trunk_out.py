"""Where a StreamingModel keeps its trunk's output and that output's gradient, and how its
head reads them (`TrunkOutputPlan.where`):

- 'mean': a head that reads the output only through global average poolings gets the
  output's mean, streamed (`StreamingModel._pooled`); nothing of the output's size is held.
- 'memory': the output and its gradient are whole tensors in memory (while the two fit the
  memory limit).
- 'disk': beyond the limit, both are numpy memory maps (`.npy`) in a temporary folder,
  removed after the step, also when the step raises. The trunk's forward pass writes the
  output there tile by tile; the trunk's backward pass reads the gradient back tile by tile.
  A head whose input is read only by windowed or pointwise layers that end in global
  average poolings (`StreamedHead`: a convolution, then pooling, then dense layers) runs
  tile by tile over the memory map too, and adds its gradient into the gradient's memory
  map window by window: nothing of the output's size is in anonymous memory. Any other head
  (flatten, dense on the image, global max pooling) needs its input as one tensor: it gets
  a copy of the memory map in memory, and its gradient goes to disk before the trunk's
  backward pass, so the output and its gradient are in memory while the head runs only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import tempfile
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_largeconv.stream import _backprop
from tf_largeconv.stream import _graph
from tf_largeconv.stream import _plan
from tf_largeconv.stream import _run
from tf_largeconv.stream import _windowed
from tf_largeconv.stream._plan import Range
from tf_largeconv.stream._report import plan_for


def _gradients(tape: Any, target: Any, sources: list[Any], **kwargs: Any) -> list[tf.Tensor]:
  """tape.gradient, zeros for the sources `target` does not depend on (TensorFlow's own
  zeros fail on a Keras 3 variable, whose dtype is a string)."""
  grads = tape.gradient(target, sources, **kwargs)
  return [tf.zeros(s.shape, s.dtype) if g is None else g for g, s in zip(grads, sources)]


@dataclasses.dataclass(frozen=True)
class TrunkOutputPlan:
  """What a step holds of the trunk's output, beyond a tile's own peak.

  Attributes:
    where: 'mean', 'memory' or 'disk' (module docstring).
    head: how the head reads the output: 'mean' (its streamed mean), 'streamed' (tile by
      tile from the memory map, on disk only) or 'whole' (one tensor).
    output_bytes: the trunk output's size; its gradient has as many.
    memory_bytes: anonymous memory the output and its gradient take (0 on disk with a
      streamed head; with a 'whole' head on disk, while the head runs only).
    disk_bytes: bytes written to the temporary folder (0 unless on disk).
    input_window_bytes: the largest input window a tile reads (with its halo).
  """

  where: str
  head: str
  output_bytes: int
  memory_bytes: int
  disk_bytes: int
  input_window_bytes: int

  def __str__(self) -> str:
    mib = 1 << 20
    text = {
      "mean": "its mean only (streamed)",
      "memory": "in memory, with its gradient",
      "disk": "on disk with its gradient (a temporary memory map)",
    }[self.where]
    return (
      f"trunk output {self.output_bytes / mib:.1f} MiB: {text}; head reads it {self.head}; "
      f"{self.memory_bytes / mib:.1f} MiB in memory, {self.disk_bytes / mib:.1f} MiB on disk; "
      f"input window {self.input_window_bytes / mib:.1f} MiB"
    )


def plan_trunk_output(
  plan: Any, head: str, window_itemsize: int, training: bool
) -> TrunkOutputPlan:
  """Where the trunk output of a StreamingModel's `plan` goes for a head that reads it as
  `head`: on disk when it and (training) its gradient exceed the plan's memory limit, but
  for a head that reads only its mean."""
  batch, copies = plan.image_shape[0], 2 if training else 1
  out = _plan.trunk_output_bytes(plan.tiling, batch)
  window = _plan.input_window_bytes(plan.tiling, batch, window_itemsize)
  if head == "mean":
    return TrunkOutputPlan("mean", head, out, 0, 0, window)
  if copies * out <= plan.memory_limit:  # the head runs on the whole tensor
    return TrunkOutputPlan("memory", "whole", out, copies * out, 0, window)
  held = 0 if head == "streamed" else copies * out
  return TrunkOutputPlan("disk", head, out, held, copies * out, window)


def head_variables(model: Any, plan: Any) -> list[Any]:
  """The trainable variables of a StreamingModel's head, a head made without an input shape
  (a Sequential of layers) built first on what it reads under `plan` (the trunk output, or
  its mean as a 1 x 1 image): else its first call, inside the step, would make variables
  that the step's gradients and the optimizer had not listed."""
  head = model.head
  if not head.built:
    g = model._stream_graph
    sizes = [1] * g.rank if model._pooled_head else list(plan.tiling.geometry.out_sizes)
    head.build((None, *sizes, g.channels[g.output] or 1))
  return list(head.trainable_variables)


def _output_shape(model: Any, batch: int, plan: Any) -> tuple[int, ...]:
  g = model._stream_graph
  return (batch, *plan.tiling.geometry.out_sizes, g.channels[g.output] or 1)


def disk_step(
  model: Any, source: Any, plan: Any, data: Any, trunk_vars: list[Any], head_vars: list[Any]
) -> tuple[tf.Tensor, tf.Tensor, list[tf.Tensor]]:
  """A StreamingModel's training step on `data` (x, y, sample_weight) with its trunk output
  on disk: (loss, prediction, gradients of trunk_vars + head_vars)."""
  x, y, sample_weight = data

  def loss_of(y_pred: Any) -> tuple[tf.Tensor, tf.Tensor]:
    loss = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight)
    return loss, model.optimizer.scale_loss(loss) if model.optimizer is not None else loss

  shape = _output_shape(model, source.shape[0], plan)
  with disk_store(shape, model._stream_graph.out_dtype, 2) as (z, dz):
    model._trunk_forward(source, plan, z)
    if model._streamed_head is not None:
      head = model._streamed_head.step(z, dz, plan.memory_limit, loss_of, head_vars)
    else:
      head = _whole_head(model.head, z, dz, loss_of, head_vars)
    loss, y_pred, head_grads = head
    trunk_grads = model._backward(plan, source, dz, trunk_vars)
  return loss, y_pred, trunk_grads + head_grads


def _whole_head(
  head: Any, z: np.ndarray, dz: np.ndarray, loss_of: Any, variables: list[Any]
) -> tuple[tf.Tensor, tf.Tensor, list[tf.Tensor]]:
  """A head that needs its input as one tensor: `z` copied into memory, its gradient
  written into `dz`; both in memory until this returns."""
  zt = tf.convert_to_tensor(np.asarray(z))
  with tf.GradientTape() as tape:
    tape.watch(zt)
    y_pred = head(zt, training=True)
    loss, scaled = loss_of(y_pred)
  *grads, d = _gradients(tape, scaled, variables + [zt])
  dz[...] = d.numpy()
  return loss, y_pred, grads


def disk_predict(model: Any, source: Any, plan: Any, training: Any) -> tf.Tensor:
  """A StreamingModel's prediction with its trunk output on disk."""
  shape = _output_shape(model, source.shape[0], plan)
  with disk_store(shape, model._stream_graph.out_dtype, 1) as (z,):
    model._trunk_forward(source, plan, z)
    if model._streamed_head is not None:
      return model._streamed_head.predict(z, plan.memory_limit)
    return model.head(tf.convert_to_tensor(np.asarray(z)), training=training)


@contextlib.contextmanager
def disk_store(shape: Sequence[int], dtype: Any, count: int) -> Iterator[list[Any]]:
  """`count` zero-filled memory maps of `shape` (the output, then its gradient) in a
  temporary folder, which is removed on leaving, whatever happened inside."""
  with tempfile.TemporaryDirectory(prefix="tf_largeconv-trunk-") as folder:
    maps: list[Any] = [
      np.lib.format.open_memmap(
        os.path.join(folder, name), "w+", np.dtype(dtype), tuple(int(n) for n in shape)
      )
      for name in ("output.npy", "gradient.npy")[:count]
    ]
    try:
      yield maps
    finally:
      for m in maps:
        m._mmap.close()


def _given(window: tf.Tensor) -> Any:
  """A reader returning `window` (already read, and watched by a tape)."""

  def read(spans: Sequence[Range]) -> tf.Tensor:
    return window

  return read


def window_index(spans: Sequence[Range]) -> tuple[slice, ...]:
  """The numpy index of the window `spans` of a (batch, *spatial, channels) array."""
  return (slice(None), *(slice(a, b) for a, b in spans), slice(None))


def reads_only_the_mean(head: Any) -> bool:
  """Whether `head` reads its input only through global average poolings (a classifier's
  usual first layer): then the head of a 1 x ... x 1 image holding the input's spatial mean
  is the head of the input, exactly."""
  try:
    graph = _graph.build(head)
  except (TypeError, ValueError):
    return False
  for step in graph.steps:
    reads_input = 0 in step.inputs
    if step.kind == "reduce":
      if not reads_input or getattr(step.rule, "how", None) != "mean":
        return False
    elif reads_input or step.rule is not None:
      return False
  return True


class StreamedHead:
  """A head whose input is read only by windowed or pointwise layers ending in global
  average poolings, then anything on the pooled values (its layers run as in inference:
  the caller keeps heads with dropout, noise or trainable BatchNormalization whole).
  `of(head)` is None for any other."""

  def __init__(self, graph: _graph.Graph) -> None:
    self.graph = graph
    self._tilings: dict[tuple[Any, ...], _plan.Tiling] = {}  # by input shape and limit

  @classmethod
  def of(cls, head: Any) -> StreamedHead | None:
    try:
      graph = _graph.build(head)
    except (TypeError, ValueError, AttributeError):
      return None
    if graph.spatial.get(graph.output, False) or graph.rank == 0:
      return None
    for step in graph.steps:
      if step.globals or (step.kind == "reduce" and getattr(step.rule, "how", "") != "mean"):
        return None
      if step.rule is None and any(graph.spatial.get(v, False) for v in step.inputs):
        return None
    return cls(graph)

  def _tiling(self, z: np.ndarray, limit: int) -> _plan.Tiling:
    """The head's tiling of `z`, planned once per shape and limit (every step reads it
    twice: forward, then backward)."""
    key = (*z.shape, limit)
    if key not in self._tilings:
      plan = plan_for(self.graph, tuple(z.shape), None, limit, _backprop.head_tiles_peak)
      self._tilings[key] = plan.tiling
    return self._tilings[key]

  def _read(self, z: np.ndarray) -> Callable[[Sequence[Range]], np.ndarray]:
    return lambda spans: np.asarray(z[window_index(spans)])

  def forward(self, z: np.ndarray, limit: int) -> dict[int, tf.Tensor]:
    """The pooled values, from `z` tile by tile."""
    tiling = self._tiling(z, limit)
    return _run.run_pass(tiling, self._read(z), self.graph.input_dtype, None)

  def predict(self, z: np.ndarray, limit: int) -> tf.Tensor:
    values = self.forward(z, limit)
    _run.run_head(self.graph, values)
    return values[self.graph.output]

  def step(
    self, z: np.ndarray, dz: np.ndarray, limit: int, loss_of: Any, variables: list[Any]
  ) -> tuple[tf.Tensor, tf.Tensor, list[tf.Tensor]]:
    """(loss, prediction, gradients of `variables`) of the head on `z`, its gradient with
    respect to `z` added into `dz`. `loss_of(y_pred)` gives (loss, scaled loss)."""
    pooled = self.forward(z, limit)
    keys = sorted(pooled)
    with tf.GradientTape() as tape:
      for k in keys:
        tape.watch(pooled[k])
      values = dict(pooled)
      _run.run_head(self.graph, values)
      y_pred = values[self.graph.output]
      loss, scaled = loss_of(y_pred)
    n = len(variables)
    grads = _gradients(tape, scaled, variables + [pooled[k] for k in keys])
    head_grads, d_pooled = grads[:n], grads[n:]
    tiling = self._tiling(z, limit)
    count = float(math.prod(tiling.geometry.out_sizes))
    read, dtype = self._read(z), self.graph.input_dtype
    for index in tiling.tiles():
      spans = tiling.window(index, 0)
      assert spans is not None
      window = tf.cast(tf.convert_to_tensor(read(spans)), dtype)
      with _windowed.tile_tape() as tape:
        tape.watch(window)
        _, partials = _run.run_tile(tiling, index, _given(window), dtype)
        shares = [partials[k][0] / count for k in keys]
      outs = [tf.reshape(tf.cast(d, s.dtype), s.shape) for d, s in zip(d_pooled, shares)]
      got = _gradients(tape, shares, variables + [window], output_gradients=outs)
      head_grads = [a + tf.cast(b, a.dtype) for a, b in zip(head_grads, got[:n])]
      dz[window_index(spans)] += got[-1].numpy()
    return loss, y_pred, head_grads
