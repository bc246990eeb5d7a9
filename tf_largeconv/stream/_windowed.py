"""Windowed layers run on a tile with explicit padding: the layer's computation from its
own variables, with the padded rows of the tile's window (`_rules.Span.pads`) passed to the
op as explicit padding instead of copied into a padded input.

`explicit_call(op, rank)` gives `call(x, pads)` (pads: (before, after) per spatial axis) for
the layers whose op takes explicit padding, or None where the streamed rule pads a copy:
- Keras's Conv1D/Conv2D (groups 1, dilation 1), DepthwiseConv1D/2D, SeparableConv1D/2D:
  tf.nn.conv2d, tf.nn.depthwise_conv2d, tf.nn.separable_conv2d (1D as 2D of height 1);
- MaxPooling1D/2D: tf.nn.max_pool2d, where every padding is smaller than the window (the
  op's own limit; a window wholly inside a padding pads a copy);
- the package's LargeConv1D/LargeConv2D/LargeDepthwiseConv2D: tf_largeconv.conv1d, conv2d,
  depthwise_conv2d with the layer's algorithm and workspace limit;
- FoldedBlock: its `convolve(x, padding)`.
A window with nothing to pad runs the op with 'VALID', one whose padding is what 'SAME' gives
runs it with 'SAME' (`_op_padding`). Outside the tape, a Conv1D/Conv2D with a bias and a
linear or ReLU activation runs as one traced function (`_fused.conv`), which TensorFlow runs
as one kernel, where TensorFlow's pool serves its tensors (oneDNN on). `nearest_window`
gives Keras's nearest upsampling of only a tile's output pixels.
Under a gradient tape (`taped()`), Keras's Conv1D/Conv2D pad a copy and run 'VALID':
TensorFlow's CPU gradients of tf.nn.conv2d with explicit padding leave oneDNN, and the
filter's gradient then builds a buffer of kernel taps x input channels x output pixels
(nine times the input for a 3x3 kernel) and takes two to three times as long. Keras's
convolutions and depthwise convolutions with large kernels (`PACKAGE_UNDER_TAPE`: from
where the package's gradients are the faster, `benchmarks/cpu/taped_ops.py`) run the
package's op under the tape instead, with explicit padding, a workspace limit of the
padded window's bytes (the plan counts each pass's workspace as the op's planner gives it
for the tile's input: the call's `workspaces`, `_plan.package_workspaces`), and
keep_memory=False: each pass's workspace is a temporary of TensorFlow's
allocator, freed when the pass returns, and no filter spectra are kept, so nothing
outlives the call that the plan does not count (the op's pool of idle workspaces and its
spectrum cache would otherwise hold up to 128 and 64 MiB across a pass's tile shapes).
Copies stay for AveragePooling (tf.nn.avg_pool has no explicit padding), 3D layers
(tf.nn.conv3d has none), grouped Keras convolutions (TensorFlow runs them on the CPU only
under XLA), dilated Keras convolutions (tf.nn.conv2d has no gradient for dilations on the
CPU; Keras runs them through tf.nn.convolution, which takes no explicit padding), quantized
layers and subclasses that replace the layer's call.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tf_largeconv import ops as _ops
from tf_largeconv import planning as _plan
from tf_largeconv.stream import _fused
from tf_largeconv.stream import _rules

L = keras.layers
Pads = Sequence[tuple[int, int]]
PaddedCall = Callable[[tf.Tensor, Pads], tf.Tensor]


_TAPED = contextvars.ContextVar("tf_largeconv_stream_taped", default=False)

# The kernel size (largest spatial side) from which a Keras convolution runs, under a
# gradient tape, the package's op with its gradients instead of TensorFlow's. Measured with
# `python -m benchmarks.cpu.taped_ops` (the package's op as `_keras_windowed` runs it, its
# workspace bounded by the padded window): from these sizes its forward and backward pass
# is the faster on tiles of 128^2 and 256^2. TensorFlow's conv2d gradient takes hundreds of
# times as long from 15x15; below that, within the padded window's bytes, the package's
# conv2d is not faster.
PACKAGE_UNDER_TAPE = {"conv2d": 15, "depthwise_conv2d": 11}


@contextlib.contextmanager
def taped() -> Iterator[None]:
  """Within it, tiles run under a gradient tape: layers whose op's gradient is lean only
  without explicit padding pad a copy instead (`copies_under_tape`)."""
  token = _TAPED.set(True)
  try:
    yield
  finally:
    _TAPED.reset(token)


@contextlib.contextmanager
def tile_tape() -> Iterator[tf.GradientTape]:
  """A gradient tape for tiles, within `taped()`."""
  with taped(), tf.GradientTape() as tape:
    yield tape


def copies_under_tape(call: Any) -> bool:
  """Whether `call` (from `explicit_call`) pads a copy when it runs under `taped()`."""
  return bool(getattr(call, "copies_under_tape", False))


def package_under_tape(call: Any) -> bool:
  """Whether `call` (from `explicit_call`) runs the package's op under `taped()`."""
  return bool(getattr(call, "package_under_tape", False))


def fused_outside_tape(call: Any) -> bool:
  """Whether `call` (from `explicit_call`) runs its convolution, bias and activation as one
  traced function outside `taped()` (`_fused.conv`) where TensorFlow serves tensors from its
  pool (`_pool.pooled()`, `_fused.fuses`). Without the pool (oneDNN off), malloc serves
  them, and the traced calls left more resident than the eager ops (the U-Net of
  `benchmarks/cpu/stream_memory.py` at 256 MiB: 467 to 505 MiB against 355 to 367), so
  the ops run one by one there."""
  return bool(getattr(call, "fused_outside_tape", False))


def _nhwc(pads: Pads) -> list[list[int]]:
  return [[0, 0], *[[int(a), int(b)] for a, b in pads], [0, 0]]


def _op_padding(
  pads: Pads,
  sizes: Sequence[Any],
  kernel: Sequence[int],
  strides: Sequence[int],
  dilations: Sequence[int],
) -> Any:
  """`pads` of a 2-D window op (`kernel` taps, `strides`, `dilations` per spatial axis)
  on an NHWC window of spatial `sizes` as tf.nn's ops take them: 'VALID' where nothing is
  padded (the tiles inside the image), 'SAME' where that gives the same output (a tile
  that spans the image, as a one-tile stream does), else explicit pairs. The CPU kernels
  run 'VALID' and 'SAME' faster than the same op given explicit pairs (max pooling about
  twice to five times, 3x3 convolutions of 64 channels about 1.5 times)."""
  if not any(p for pair in pads for p in pair):
    return "VALID"
  if same_padding([int(n) for n in sizes], pads, kernel, strides, dilations):
    return "SAME"
  return _nhwc(pads)


def same_padding(
  sizes: Sequence[int],
  pads: Pads,
  kernel: Sequence[int],
  strides: Sequence[int],
  dilations: Sequence[int],
) -> bool:
  """Whether padding 'same' on a window of `sizes` gives what `pads` give, on every axis
  (`_same_as`)."""
  return all(
    _same_as(n, k, s, d, (int(a), int(b)))
    for n, k, s, d, (a, b) in zip(sizes, kernel, strides, dilations, pads)
  )


def runs_same(
  rule: Any, padded: Sequence[tuple[int, int]], inside: Sequence[tuple[int, int]]
) -> bool:
  """Whether an explicit windowed rule (`_rules.Sliding`) runs its op with 'SAME' on the
  window [a, b) per axis of `inside`, padded to `padded`: without a padded copy."""
  pads = [(a - p, q - b) for (p, q), (a, b) in zip(padded, inside)]
  sizes = [b - a for a, b in inside]
  return same_padding(sizes, pads, rule.kernel, rule.strides, rule.dilations)


def _same_as(n: int, kernel: int, stride: int, dilation: int, pads: tuple[int, int]) -> bool:
  """Whether padding 'same' on an axis of `n` pixels gives what `pads` give: the same
  padding before and the same number of outputs (padding after the last window's taps
  is never read)."""
  out, before, extent = _rules.slide_axis(n, kernel, stride, dilation, "same")
  a, b = pads
  return a == before and n + a + b >= extent and (n + a + b - extent) // stride + 1 == out


def _as_2d(rank: int, run: PaddedCall) -> PaddedCall:
  """`run` (on NHWC) for a layer of `rank` 1 (NWC, run as height 1) or 2."""
  if rank == 2:
    return run

  def call(x: tf.Tensor, pads: Pads) -> tf.Tensor:
    return tf.squeeze(run(tf.expand_dims(x, 1), [(0, 0), *pads]), 1)

  return call


def _value(variable: Any, dtype: Any) -> tf.Tensor:
  return tf.cast(tf.convert_to_tensor(variable), dtype)


def _finish(op: Any, y: tf.Tensor) -> tf.Tensor:
  """The bias and activation of a Keras convolution, as its call adds them: the same sums,
  by TensorFlow's BiasAdd kernel outside a gradient tape (it adds a per-channel vector
  faster than a broadcast add), by an add under the tape, which keeps the convolution's
  raw result as the memory model (`_layers.tape_allocs`) counts."""
  if op.use_bias:
    b = _value(op.bias, y.dtype)
    y = y + b if _TAPED.get() else tf.nn.bias_add(y, b)
  return op.activation(y) if op.activation is not None else y


def _own_call(op: Any, base: type, *names: str) -> bool:
  """Whether `op` computes as Keras's `base` does: its call (and the named methods) not
  replaced, channels last, not quantized."""
  if op.data_format != "channels_last" or getattr(op, "quantization_mode", None):
    return False
  return all(getattr(type(op), n) is getattr(base, n) for n in ("call", *names))


def _window(op: Any, rank: int) -> tuple[list[int], list[int]]:
  ones = [1] * (2 - rank)
  return ones + list(op.strides), ones + list(op.dilation_rate)


def _keras_windowed(
  op: Any, rank: int, kernels: tuple[str, ...], conv: Any, package: str | None = None
) -> PaddedCall:
  """`op`, a Keras convolution that computes as Keras's does, as `conv` (tf.nn's 2-D op) on
  its `kernels` (attribute names; 1-D kernels lifted to height 1), then its bias and
  activation; under the tape, for kernels from `PACKAGE_UNDER_TAPE[package]`, as the
  package's op of that name."""
  strides, dilations = _window(op, rank)
  large = package is not None and max(op.kernel_size) >= PACKAGE_UNDER_TAPE[package]
  copies = conv is tf.nn.conv2d and not large
  fused = _fused.fuses(op, conv)

  def run(x: tf.Tensor, pads: Pads) -> tf.Tensor:
    x = tf.cast(x, op.compute_dtype)
    weights = [_value(getattr(op, name), x.dtype) for name in kernels]
    if rank == 1:
      weights = [w[None] for w in weights]
    pairs = _nhwc(pads)
    padding = _op_padding(pads, x.shape[1:-1], weights[0].shape[:2], strides, dilations)
    options: dict[str, Any] = {}
    run_conv = conv
    if large and _TAPED.get():
      run_conv = getattr(_ops, str(package))
      options.update(workspace_limit=padded_bytes(x.shape, pairs, x.dtype.size), keep_memory=False)
    elif copies and _TAPED.get() and not isinstance(padding, str):
      x, padding = tf.pad(x, pairs), "VALID"
    elif fused and not _TAPED.get():
      fn = _fused.conv(
        tuple(strides),
        tuple(dilations),
        padding if isinstance(padding, str) else tuple(map(tuple, padding)),
        op.activation is keras.activations.relu,
        x.dtype,
        tuple(int(n) for n in weights[0].shape),
      )
      return fn(x, weights[0], _value(op.bias, x.dtype))
    # No name holds the op's result: _finish frees it once the bias is added.
    return _finish(
      op, run_conv(x, *weights, [1, *strides, 1], padding, dilations=dilations, **options)
    )

  call = _as_2d(rank, run)
  call.copies_under_tape = copies  # type: ignore[attr-defined]
  call.fused_outside_tape = fused  # type: ignore[attr-defined]
  # The plan counts the package op's workspaces under the tape (`_plan.tile_events`,
  # `_backprop`): `workspaces` gives them for a tile's input.
  call.package_under_tape = large  # type: ignore[attr-defined]
  depthwise = package == "depthwise_conv2d"
  call.workspaces = _planned(op, rank, getattr(op, kernels[0]), depthwise, {})  # type: ignore[attr-defined]
  return call


def _planned(
  op: Any, rank: int, kernel: Any, depthwise: bool, options: dict[str, Any]
) -> Callable[[Sequence[int], Pads], tuple[int, int, int]]:
  """`workspaces(shape, pads)`: the planner's workspace bytes of the package's op as a
  layer's call runs it under the tape on an input of `shape` (batch, spatial, channels)
  padded by `pads`, with keep_memory=False and the layer's `options` (algorithm,
  workspace_limit; default: the padded window's bytes): its forward pass's, its input
  gradient's and its filter gradient's."""
  strides, dilations = _window(op, rank)

  # Cached with the call (a tile shape recurs over a pass's tiles and every step), so the
  # cache goes with the graph that holds the call.
  @functools.lru_cache(maxsize=256)
  def workspaces(shape: tuple[int, ...], pads: tuple[tuple[int, int], ...]) -> tuple[int, int, int]:
    filter_shape = [int(d) for d in kernel.shape]
    dims, padding = list(shape), list(pads)
    if rank == 1:
      filter_shape, dims = [1, *filter_shape], [dims[0], 1, *dims[1:]]
      padding = [(0, 0), *padding]
    if depthwise:  # the op's grouped filter, one group per channel
      filter_shape = [*filter_shape[:2], 1, filter_shape[2] * filter_shape[3]]
    dtype = tf.as_dtype(op.compute_dtype)
    kept = dict(options, keep_memory=False)
    if kept.get("workspace_limit") is None:
      kept["workspace_limit"] = padded_bytes(dims, _nhwc(padding), dtype.size)
    passes = _plan.plan(
      [int(n) for n in dims], filter_shape, [1, *strides, 1],
      _op_padding(padding, dims[1:-1], filter_shape[:2], strides, dilations),
      dilations=dilations, dtype=dtype, **kept,
    )  # fmt: skip
    return tuple(  # type: ignore[return-value]
      q.workspace_bytes if q else 0
      for q in (passes.forward, passes.backprop_input, passes.backprop_filter)
    )

  return workspaces


def padded_bytes(shape: Sequence[Any], padding: Sequence[Sequence[int]], itemsize: int) -> int:
  """The bytes of a tensor of `shape` (NHWC) and `itemsize` padded by `padding` (per axis,
  before and after)."""
  count = itemsize
  for n, (a, b) in zip(shape, padding):
    count *= int(n) + int(a) + int(b)
  return count


def _keras_conv(op: Any, rank: int) -> PaddedCall | None:
  base = L.Conv1D if rank == 1 else L.Conv2D
  if not _own_call(op, base, "convolution_op") or op.groups != 1 or max(op.dilation_rate) > 1:
    return None
  return _keras_windowed(op, rank, ("kernel",), tf.nn.conv2d, "conv2d")


def _keras_depthwise(op: Any, rank: int) -> PaddedCall | None:
  base = L.DepthwiseConv1D if rank == 1 else L.DepthwiseConv2D
  if not _own_call(op, base):
    return None
  return _keras_windowed(op, rank, ("kernel",), tf.nn.depthwise_conv2d, "depthwise_conv2d")


def _keras_separable(op: Any, rank: int) -> PaddedCall | None:
  base = L.SeparableConv1D if rank == 1 else L.SeparableConv2D
  if not _own_call(op, base):
    return None
  kernels = ("depthwise_kernel", "pointwise_kernel")
  return _keras_windowed(op, rank, kernels, tf.nn.separable_conv2d)


def _max_pool(op: Any, rank: int) -> PaddedCall | None:
  base = L.MaxPooling1D if rank == 1 else L.MaxPooling2D
  if not _own_call(op, base):
    return None
  ones = [1] * (2 - rank)
  size, strides = ones + list(op.pool_size), ones + list(op.strides)

  def run(x: tf.Tensor, pads: Pads) -> tf.Tensor:
    if any(p >= k for pair, k in zip(pads, size) for p in pair):
      # The op takes paddings smaller than the window only.
      low = float("-inf")
      return tf.nn.max_pool2d(tf.pad(x, _nhwc(pads), constant_values=low), size, strides, "VALID")
    return tf.nn.max_pool2d(
      x, size, strides, _op_padding(pads, x.shape[1:-1], size, strides, [1, 1])
    )

  return _as_2d(rank, run)


def _package_conv(op: Any, rank: int) -> PaddedCall | None:
  """The package's LargeConv1D/2D and LargeDepthwiseConv2D: its op with explicit padding."""
  from tf_largeconv import keras as lk

  families = (
    (lk.LargeConv1D, _ops.conv1d),
    (lk.LargeDepthwiseConv2D, _ops.depthwise_conv2d),
    (lk.LargeConv2D, _ops.conv2d),
  )
  found = next(((f, c) for f, c in families if isinstance(op, f)), None)
  if found is None:
    return None
  family, conv = found
  if op.data_format != "channels_last" or not all(
    getattr(type(op), n) is getattr(family, n) for n in ("call", "convolution_op")
  ):
    return None
  strides = list(op.strides)

  def run(x: tf.Tensor, pads: Pads) -> tf.Tensor:
    x = tf.cast(x, op.compute_dtype)
    padding = [list(p) for p in pads] if rank == 1 else _nhwc(pads)
    options = op._op_kwargs()
    if _TAPED.get():  # nothing kept past the call, as the plan counts it
      options["keep_memory"] = False
    return op._bias_and_activation(conv(x, _value(op.kernel, x.dtype), strides, padding, **options))

  # Under the tape the plan counts the op's workspaces (`_plan.tile_events`, `_backprop`).
  run.package_under_tape = True  # type: ignore[attr-defined]
  settings = {k: v for k, v in op.settings().items() if k in ("algorithm", "workspace_limit")}
  depthwise = family is lk.LargeDepthwiseConv2D
  run.workspaces = _planned(op, rank, op.kernel, depthwise, settings)  # type: ignore[attr-defined]
  return run


def nearest_window(op: Any, rank: int) -> Callable[..., tf.Tensor | None] | None:
  """`call(x, starts, lengths)`: Keras's nearest UpSampling1D/2D/3D on the window `x`, only
  the output pixels from `starts` (relative to the window's upsampled origin) for `lengths`
  along each spatial axis, gathered row by row instead of upsampling the window and
  cropping a copy; None under a gradient tape (which runs the layer's own call), and None
  for a layer that does not compute as Keras's does."""
  bases = {1: L.UpSampling1D, 2: L.UpSampling2D, 3: L.UpSampling3D}
  base = bases.get(rank)
  if base is None or not isinstance(op, base) or type(op).call is not base.call:
    return None
  if getattr(op, "data_format", "channels_last") != "channels_last":
    return None
  if getattr(op, "interpolation", "nearest") != "nearest":
    return None
  factors = [int(f) for f in (op.size if rank > 1 else [op.size])]

  def call(x: tf.Tensor, starts: Sequence[int], lengths: Sequence[int]) -> tf.Tensor | None:
    if _TAPED.get():
      return None
    if x.dtype.is_floating:
      x = tf.cast(x, op.compute_dtype)
    for axis, (f, s, n) in enumerate(zip(factors, starts, lengths)):
      x = tf.gather(x, tf.range(s, s + n) // f, axis=axis + 1)
    return x

  return call


def explicit_call(op: Any, rank: int) -> PaddedCall | None:
  """`call(x, pads)`: `op` (a Keras layer) on the window `x` with `pads` padded rows per
  spatial axis given to its op as explicit padding, or None where the op cannot take it."""
  if rank not in (1, 2):
    return None
  from tf_largeconv import keras as lk

  if isinstance(op, (lk.LargeConv1D, lk.LargeConv2D, lk.LargeDepthwiseConv2D)):
    return _package_conv(op, rank)
  if isinstance(op, (L.SeparableConv1D, L.SeparableConv2D)):
    return _keras_separable(op, rank)
  if isinstance(op, (L.DepthwiseConv1D, L.DepthwiseConv2D)):
    return _keras_depthwise(op, rank)
  if isinstance(op, (L.Conv1D, L.Conv2D)):
    return _keras_conv(op, rank)
  if isinstance(op, (L.MaxPooling1D, L.MaxPooling2D)):
    return _max_pool(op, rank)
  return None
