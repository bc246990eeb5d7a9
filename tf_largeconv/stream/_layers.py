"""Which rule streams each Keras layer or operation, and the checks that it can be streamed
exactly (channels last; normalization over channels only; no layer whose output pixel
depends on the whole image)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tf_largeconv import fold as _fold
from tf_largeconv.stream import _rules
from tf_largeconv.stream import _trace
from tf_largeconv.stream import _windowed

L = keras.layers

CONVS = (L.Conv1D, L.Conv2D, L.Conv3D, L.DepthwiseConv1D, L.DepthwiseConv2D)
SEPARABLE = (L.SeparableConv1D, L.SeparableConv2D)
TRANSPOSED = (L.Conv1DTranspose, L.Conv2DTranspose, L.Conv3DTranspose)
MAX_POOLS = (L.MaxPooling1D, L.MaxPooling2D, L.MaxPooling3D)
AVG_POOLS = (L.AveragePooling1D, L.AveragePooling2D, L.AveragePooling3D)
GLOBAL_AVG = (L.GlobalAveragePooling1D, L.GlobalAveragePooling2D, L.GlobalAveragePooling3D)
GLOBAL_MAX = (L.GlobalMaxPooling1D, L.GlobalMaxPooling2D, L.GlobalMaxPooling3D)
UPSAMPLING = (L.UpSampling1D, L.UpSampling2D, L.UpSampling3D)
ZERO_PADDING = (L.ZeroPadding1D, L.ZeroPadding2D, L.ZeroPadding3D)
CROPPING = (L.Cropping1D, L.Cropping2D, L.Cropping3D)

# Layers that compute each output pixel from the same pixel of their inputs (at inference).
POINTWISE: list[type] = [
  L.Activation,
  L.ReLU,
  L.LeakyReLU,
  L.ELU,
  L.Softmax,
  L.PReLU,
  L.BatchNormalization,
  L.LayerNormalization,
  L.UnitNormalization,
  L.Normalization,
  L.Rescaling,
  L.Dense,
  L.Dropout,
  L.SpatialDropout1D,
  L.SpatialDropout2D,
  L.SpatialDropout3D,
  L.GaussianNoise,
  L.GaussianDropout,
  L.AlphaDropout,
  L.ActivityRegularization,
  L.Identity,
  L.Add,
  L.Subtract,
  L.Multiply,
  L.Average,
  L.Maximum,
  L.Minimum,
  L.Concatenate,
]

BUILTIN_POINTWISE = tuple(POINTWISE)

# Keras operations applied to symbolic tensors in a functional model (`x + y`,
# `keras.ops.relu(x)`), by class name: element by element.
ELEMENTWISE_OPS = frozenset(
  "Add Subtract Multiply Divide TrueDivide Maximum Minimum Power Negative Abs Absolute Square "
  "Sqrt Exp Log Tanh Sigmoid Relu Relu6 Gelu Silu Swish Softplus Softsign LeakyRelu Elu Selu "
  "HardSigmoid HardSilu Mish Erf Clip Cast Where".split()
)


def register_pointwise(layer_class: type) -> type:
  """Declares that `layer_class` (a Keras layer) computes each output pixel from the same
  pixel of its inputs, so `tf_largeconv.stream` may run it on tiles. Usable as a class
  decorator; returns the class."""
  if not (isinstance(layer_class, type) and issubclass(layer_class, keras.layers.Layer)):
    raise TypeError(f"layer_class must be a keras.layers.Layer subclass, got {layer_class!r}")
  if layer_class not in POINTWISE:
    POINTWISE.append(layer_class)
  return layer_class


def _refuse(op: Any, why: str) -> ValueError:
  return ValueError(
    f"tf_largeconv.stream: layer '{op.name}' ({type(op).__name__}) cannot be streamed: {why}. "
    "Stream the model up to the layer before it (stream.predict(..., up_to='<layer name>')) "
    "and run the rest on the result"
    + (
      "; if it does compute each pixel from the same pixel of its inputs, declare it with "
      "tf_largeconv.stream.register_pointwise"
      if isinstance(op, keras.layers.Layer)
      else ""
    )
  )


def _channels_last(op: Any) -> None:
  fmt = getattr(op, "data_format", "channels_last")
  if fmt not in (None, "channels_last"):
    raise _refuse(op, f"data_format is {fmt!r}; stream.predict streams channels_last models")


def _last_axis(op: Any, axes: Any, rank: int, what: str) -> None:
  values = list(axes) if isinstance(axes, (list, tuple)) else [axes]
  if [int(a) % rank for a in values] != [rank - 1]:
    raise _refuse(op, f"its {what} is {axes!r}; only the channel axis (-1) keeps pixels apart")


def _tuple(value: Any, rank: int) -> tuple[int, ...]:
  if isinstance(value, int):
    return (value,) * rank
  return tuple(int(v) for v in value)


def _valid_clone(layer: Any, channels: int, rank: int) -> Any:
  """The layer with padding 'valid' (output_padding none), computing with the layer's own
  variables: the same kernels, run on windows padded by hand, with the weights as they are
  at each call (and gradients reaching the layer's variables)."""
  config = dict(layer.get_config(), padding="valid", name=layer.name + "_streamed")
  if "output_padding" in config:
    config["output_padding"] = None
  clone = type(layer).from_config(config)
  if layer.weights:
    clone.build((None,) * (rank + 1) + (channels,))
    own = vars(layer)
    for name, value in list(vars(clone).items()):
      if isinstance(value, keras.Variable):
        if not isinstance(own.get(name), keras.Variable):
          raise AssertionError(f"{layer.name}: no variable '{name}' to share")
        # Past Keras's tracking: the clone's call reads the layer's variable.
        object.__setattr__(clone, name, own[name])
  return clone


def _pairs(value: Any, rank: int) -> list[tuple[int, int]]:
  if rank == 1:
    value = (value,)
  return [_tuple(v, 2) if not isinstance(v, int) else (v, v) for v in value]  # type: ignore[misc]


def _folded(op: Any) -> _rules.Rule:
  """A FoldedBlock: the layer's own convolution (`convolve`: its folded kernel from the
  current weights, its op, algorithm and workspace limit) with each window's padded rows as
  its explicit padding."""
  conv = op.folded_conv()

  def call(x: tf.Tensor, pads: Sequence[tuple[int, int]]) -> tf.Tensor:
    return op.convolve(x, padding=tuple(pads))

  kernel = [int(n) for n in conv.kernel.shape[:2]]
  pads = [(int(a), int(b)) for a, b in conv.padding]
  return _rules.Sliding(call, kernel, list(conv.strides), [1, 1], pads, explicit=True)


def _elementwise(op: Any, refs: Sequence[Any], rank: int, call: _rules.Call) -> _rules.Rule | None:
  name = type(op).__name__
  if name in ELEMENTWISE_OPS:
    pass
  elif name == "Concatenate" and hasattr(op, "axis"):
    _last_axis(op, op.axis, rank + 2, "axis")
  else:
    return None
  for r in refs:
    if len(r.shape) != rank + 2:
      raise _refuse(op, f"it broadcasts a tensor of shape {tuple(r.shape)} against the image")
  return _rules.Pointwise(call)


# Activations whose call makes temporaries the size of its output (eager, measured with
# TensorFlow's allocator statistics): how many, beside the output.
_ACTIVATION_TEMPS = {"gelu": 2, "swish": 1, "silu": 1, "elu": 1, "selu": 1, "softplus": 1}
_TWO_TENSORS = (L.BatchNormalization, L.Rescaling, L.Normalization, L.Dense, L.Softmax, L.PReLU)


def allocs(op: Any, kind: str, n_inputs: int, fused: bool = False) -> tuple[float, ...]:
  """The tensors a step's call makes on a tile, as shares of its output, the output last:
  what `_plan.tile_events` feeds the memory model. Measured per layer with TensorFlow's
  allocator statistics in eager calls (a temporary is freed only when the call returns).
  `fused`: a convolution that runs as one traced function outside the tape
  (`_windowed.fused_outside_tape`) makes its output alone."""
  if fused and kind == "conv":
    return (1.0,)
  if kind in ("conv", "folded conv", "transpose"):
    # The convolution's result, then the bias added, then the activation (with its own
    # temporaries) on that: each alive until the next is made.
    act = getattr(getattr(op, "activation", None), "__name__", "linear")
    if act == "linear":
      return (1.0, 1.0) if getattr(op, "use_bias", False) else (1.0,)
    return (1.0,) * (2 + _ACTIVATION_TEMPS.get(act, 0))
  if kind == "upsample":
    return (0.5, 1.0) if getattr(op, "interpolation", "nearest") == "nearest" else (1.0,)
  if kind != "pointwise" or not isinstance(op, keras.layers.Layer):
    return (1.0,)
  if isinstance(op, L.LayerNormalization):
    return (1.0,) * 4
  if isinstance(op, (L.Activation, L.ReLU, L.LeakyReLU, L.ELU)):
    name = getattr(getattr(op, "activation", None), "__name__", "")
    return (1.0,) * (1 + _ACTIVATION_TEMPS.get(name, 1 if isinstance(op, L.ELU) else 0))
  if isinstance(op, (L.Add, L.Subtract, L.Multiply, L.Maximum, L.Minimum)):
    return (1.0,) * max(1, n_inputs - 1)
  if isinstance(op, L.Average):
    return (1.0,) * max(1, n_inputs)
  if isinstance(op, _TWO_TENSORS) or not isinstance(op, BUILTIN_POINTWISE):
    return (1.0, 1.0)
  return (1.0,)


def tape_allocs(op: Any, kind: str, n_inputs: int) -> tuple[float, ...]:
  """`allocs` under a gradient tape, which keeps every tensor the call makes: a
  convolution's raw result too, where its bias and activation follow."""
  made = allocs(op, kind, n_inputs)
  act = getattr(getattr(op, "activation", None), "__name__", "linear")
  if kind in ("conv", "folded conv", "transpose") and getattr(op, "use_bias", False):
    return (1.0, *made) if act != "linear" else made
  return made


def grad_temps(op: Any, kind: str) -> tuple[float, float, bool]:
  """A step's backward pass besides its inputs' gradients: its temporaries as shares of its
  output and of what it read, and whether it hands its output's gradient to its inputs as
  it is (a sum). Measured per layer with TensorFlow's allocator statistics."""
  act = getattr(getattr(op, "activation", None), "__name__", "linear")
  if kind in ("conv", "folded conv", "transpose"):
    return (0.0 if act == "linear" else 1.0), 0.0, False  # the activation's gradient
  if kind == "pool" and isinstance(op, MAX_POOLS):
    return 3.0, 0.0, False
  if kind == "upsample":
    return 0.0, 1.0, False
  return 0.0, 0.0, isinstance(op, (L.Add, L.Subtract))


# What TensorFlow's oneDNN gradient of a strided Keras Conv1D/Conv2D's kernel keeps, outside
# TensorFlow's allocator, for each input shape it has run on, as long as the process lives
# (a buffer of the output's gradient in the cached primitive): measured as 1.02 to 1.08 times
# the output's bytes (3x3 and 7x7 kernels, strides 2 and 3; kernel 1 keeps nothing).
KEPT_BY_STRIDED_KERNEL_GRAD = 1.05


def kept_by_kernel(op: Any, kind: str, rule: Any = None) -> float:
  """The bytes a step's backward pass leaves held for the life of the process, once per
  shape of its output, as a share of that output: a trainable strided Conv1D/Conv2D's
  (`KEPT_BY_STRIDED_KERNEL_GRAD`) where TensorFlow's gradient runs (not the package's:
  `rule.package_under_tape`); else 0."""
  if kind != "conv" or not isinstance(op, (L.Conv1D, L.Conv2D)) or not op.trainable:
    return 0.0
  if getattr(rule, "package_under_tape", False):
    return 0.0
  strided = any(s > 1 for s in _tuple(op.strides, 2))
  return KEPT_BY_STRIDED_KERNEL_GRAD if strided and max(_tuple(op.kernel_size, 2)) > 1 else 0.0


# TensorFlow's own CPU gradients of a convolution (oneDNN's off) each fill an im2col buffer
# of output pixels x (kernel window x input channels) per image, for `shard` images at a
# time: as many as a 30 MiB working set holds (at least one), whatever the batch, except
# that the input's gradient of a batch of one image takes one image's.
EIGEN_GRAD_WORKING_SET = 30 << 20


def grad_cols(op: Any, kind: str, rule: Any = None) -> tuple[int, int]:
  """(kernel window x input channels, output channels) of the im2col buffer TensorFlow's
  own CPU gradient of a Keras Conv1D/Conv2D fills (`grad_col_bytes`), where it runs (not
  the package's op, `rule.package_under_tape`; not a 1x1 convolution of stride 1, which is a
  matrix product; not grouped or dilated); (0, 0) for other steps."""
  if kind != "conv" or not isinstance(op, (L.Conv1D, L.Conv2D)):
    return 0, 0
  if getattr(rule, "package_under_tape", False) or getattr(op, "groups", 1) != 1:
    return 0, 0
  rank = 1 if isinstance(op, L.Conv1D) else 2
  kernel, strides = _tuple(op.kernel_size, rank), _tuple(op.strides, rank)
  if any(d != 1 for d in _tuple(op.dilation_rate, rank)):
    return 0, 0
  if max(kernel) == 1 and max(strides) == 1:
    return 0, 0
  window = 1
  for n in kernel:
    window *= int(n)
  return window * int(op.kernel.shape[-2]), int(op.filters)


def grad_col_bytes(
  cols: tuple[int, int], out_pixels: int, batch: int, itemsize: int
) -> list[tuple[int, int]]:
  """The im2col buffers of `grad_cols` (the input's gradient's, the kernel's) for an
  output of `out_pixels` per image and `batch` images: (bytes, bytes written) each, since
  a buffer sized for more images than the batch has is written only for the batch's."""
  total, depth = cols
  if not total:
    return []
  work = out_pixels * total + out_pixels * depth + total * depth
  shard = max(-(-(EIGEN_GRAD_WORKING_SET // itemsize) // work), 1)
  image = out_pixels * total * itemsize
  written = min(shard, batch) * image
  return [(image if batch == 1 else shard * image, written), (shard * image, written)]


def rule_for(op: Any, refs: Sequence[Any], rank: int, call: _rules.Call) -> tuple[_rules.Rule, str]:
  """The rule that streams `op` (a layer or operation reading the symbolic tensors `refs`,
  all spatial; `call(*tensors)` calls it as the model does) and the kind of step it is.
  Raises ValueError for what cannot be streamed."""
  channels = int(refs[0].shape[-1] or 0) if refs else 0
  if not isinstance(op, keras.layers.Layer):
    rule = _elementwise(op, refs, rank, call)
    if rule is None:
      _traced(op, refs, rank, call)
      rule = _rules.Pointwise(call)
    return rule, "pointwise"
  _channels_last(op)
  if isinstance(op, _fold.FoldedBlockBase):
    return _folded(op), "folded conv"
  if isinstance(op, CONVS + SEPARABLE):
    explicit = _windowed.explicit_call(op, rank)
    kernel = _tuple(op.kernel_size, rank)
    strides, dilations = _tuple(op.strides, rank), _tuple(op.dilation_rate, rank)
    call = explicit or _valid_clone(op, channels, rank)
    sliding = _rules.Sliding(call, kernel, strides, dilations, op.padding, explicit=bool(explicit))
    sliding.taped_copy = _windowed.copies_under_tape(explicit)
    sliding.package_under_tape = _windowed.package_under_tape(explicit)
    sliding.fused = _windowed.fused_outside_tape(explicit)
    return sliding, "conv"
  if isinstance(op, TRANSPOSED):
    clone = _valid_clone(op, channels, rank)

    def out_size(sizes: Sequence[int], op: Any = op) -> Sequence[int]:
      return op.compute_output_shape((1, *sizes, channels))[1:-1]

    kernel = _tuple(op.kernel_size, rank)
    strides, dilations = _tuple(op.strides, rank), _tuple(op.dilation_rate, rank)
    return _rules.Transpose(clone, kernel, strides, dilations, op.padding, out_size), "transpose"
  if isinstance(op, MAX_POOLS + AVG_POOLS):
    explicit = _windowed.explicit_call(op, rank)
    call = explicit or _valid_clone(op, channels, rank)
    kernel, strides = _tuple(op.pool_size, rank), _tuple(op.strides, rank)
    average = isinstance(op, AVG_POOLS)
    low = 0.0 if average else float("-inf")
    rule = _rules.Sliding(
      call, kernel, strides, [1] * rank, op.padding, low, average, explicit=bool(explicit)
    )
    return rule, "pool"
  if isinstance(op, GLOBAL_AVG + GLOBAL_MAX):
    how = "max" if isinstance(op, GLOBAL_MAX) else "mean"
    return _rules.Reduce(how, bool(op.keepdims)), "reduce"
  if isinstance(op, UPSAMPLING):
    interpolation = getattr(op, "interpolation", "nearest")
    if interpolation not in ("nearest", "bilinear"):
      raise _refuse(op, f"interpolation {interpolation!r} (streamed: 'nearest', 'bilinear')")
    halo = 1 if interpolation == "bilinear" else 0
    window = _windowed.nearest_window(op, rank)
    return _rules.Upsample(call, _tuple(op.size, rank), halo, window), "upsample"
  if isinstance(op, ZERO_PADDING + CROPPING):
    pairs = _pairs(op.padding if isinstance(op, ZERO_PADDING) else op.cropping, rank)
    sign = 1 if isinstance(op, ZERO_PADDING) else -1
    return _rules.Shift([sign * p[0] for p in pairs], [sign * p[1] for p in pairs]), "shift"
  if isinstance(op, tuple(POINTWISE)):
    _check_pointwise(op, rank)
  else:
    _traced(op, refs, rank, call)
  return _rules.Pointwise(call), "pointwise"


def _traced(op: Any, refs: Sequence[Any], rank: int, call: _rules.Call) -> None:
  """Refuses `op` unless its traced call shows each output pixel computed from the same
  pixel of its inputs (`_trace`)."""
  why = _trace.why_not_pointwise(call, refs, rank)
  if why is not None:
    raise _refuse(
      op, f"its output pixels are not shown to depend only on the same pixel of its inputs: {why}"
    )


def _check_pointwise(op: Any, rank: int) -> None:
  if isinstance(op, (L.BatchNormalization, L.LayerNormalization, L.UnitNormalization)):
    _last_axis(op, op.axis, rank + 2, "axis")
  elif isinstance(op, L.Normalization) and op.axis is not None:
    _last_axis(op, op.axis, rank + 2, "axis")
  elif isinstance(op, (L.Softmax, L.Concatenate)):
    _last_axis(op, op.axis, rank + 2, "axis")
  elif isinstance(op, L.PReLU):
    shape = tuple(op.alpha.shape)
    if any(int(n) != 1 for n in shape[:-1]):
      raise _refuse(op, f"its alpha of shape {shape} differs from pixel to pixel (shared_axes)")
