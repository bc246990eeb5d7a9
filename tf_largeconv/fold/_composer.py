"""Folds a block of linear layers (Keras 3 or tf_keras) into one convolution.

Every tensor of a block is tracked as an affine function of the block input x:

  t[i, j, c] = sum_{u, v, ci} K[u, v, ci, c] * x[i*s + u - oh, j*s + v - ow, ci] + b[c]

(x zero outside the image), with a kernel K in grouped-convolution storage (the filter
`tf_largeconv.conv2d` takes: [kh, kw, C0 / groups, C]), offsets (oh, ow), a bias b, a
stride s and the tensor's size. Each layer maps that description to its output's, with
TensorFlow ops only: in float64 on constants for `fold` and `reparameterize`, and on the
layers' own variables (differentiably) for `FoldedBlock`, so the algebra exists once.

At the border the formula holds only while no layer reads a tensor beyond its edge where
the formula is not zero: padding (SAME, ZeroPadding2D) after a bias, after a spatial
kernel or after a crop is refused (ValueError naming the layer and the reason), unless
exact=False, which folds anyway and counts the output pixels that differ.

The flavour modules (`keras.py`, `tf_keras.py`) pass a `Flavour` with their Input, Model
and Large layer classes; everything else here reads the layers through attributes both
Kerases share (`_keras_history`, `_inbound_nodes`, `get_config`).
"""

import copy
import dataclasses
import math
import warnings

import numpy as np
import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv import ops as _ops

# A spatial size that stands in for an unknown input height or width. At stride 1 every
# offset, padding and size difference the fold computes is independent of the input size.
_STAND_IN = 4096


class _Unfoldable(ValueError):
  """A layer no fold can contain, whatever surrounds it (non-linear, or a setting fold does
  not handle); `node` is the graph node, so reparameterize can fold around it."""
  node = None


class FoldWarning(UserWarning):
  """Issued by fold(..., exact=False) when the fold differs from the block at the border."""


@dataclasses.dataclass(frozen=True)
class FoldReport:
  """How a non-exact fold differs from its block (`fold(..., exact=False)`).

  Attributes:
    differing_pixels: output pixels (height x width positions, any channel) where the
      folded convolution differs from the block, for an input of `input_size`.
    total_pixels: output pixels in all.
    input_size: the (height, width) the count is for.
    reasons: one line per layer that reads beyond a border where the fold is not zero.
  """
  differing_pixels: int
  total_pixels: int
  input_size: tuple
  reasons: tuple


@dataclasses.dataclass(frozen=True)
class Flavour:
  """What a Keras flavour supplies: its Input/Model and the Large layer classes."""
  input: object          # keras.Input
  model: type            # keras.Model
  conv: type             # LargeConv2D
  depthwise: type        # LargeDepthwiseConv2D


# ---------------------------------------------------------------------------------------
# The layer graph
# ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Ref:
  """Stands for a graph tensor (by id) inside a node's call arguments."""
  id: int


@dataclasses.dataclass
class _Node:
  layer: object
  args: tuple       # call arguments with graph tensors replaced by _Ref
  kwargs: dict
  inputs: list      # ids of the graph tensors among the arguments, in order
  outputs: list     # ids of the output tensors


def _is_graph_tensor(value):
  return hasattr(value, "_keras_history")


def _call_arguments(node):
  arguments = getattr(node, "arguments", None)  # Keras 3
  if arguments is not None:
    return tuple(arguments.args), dict(arguments.kwargs)
  return tuple(node.call_args), dict(node.call_kwargs)  # tf_keras


class _Graph:
  """A built functional model's nodes in topological order, tensors by id.

  Uses the attributes Keras 3 and tf_keras share: a symbolic tensor's `_keras_history`
  (layer, node index, tensor index) and a layer's `_inbound_nodes`.
  """

  def __init__(self, model):
    inputs, outputs = getattr(model, "inputs", None), getattr(model, "outputs", None)
    if not inputs or not outputs:
      raise ValueError(f"model '{model.name}' is not built: give it an Input (a functional "
                       "model, or a Sequential model starting with keras.Input)")
    self.name = model.name
    self.inputs = [id(t) for t in inputs]
    self.outputs = [id(t) for t in outputs]
    self.tensors = {id(t): t for t in list(inputs) + list(outputs)}
    self.nodes = []
    seen = set()
    # Iterative depth-first search from the outputs: a node is appended after every node
    # producing one of its inputs.
    stack = [(t, False) for t in reversed(outputs)]
    while stack:
      tensor, expanded = stack.pop()
      if id(tensor) in self.inputs:
        continue
      layer, node_index, _ = tensor._keras_history
      node = layer._inbound_nodes[node_index]
      if id(node) in seen and not expanded:
        continue
      args, kwargs = _call_arguments(node)
      arg_tensors = [v for v in tf.nest.flatten((args, kwargs)) if _is_graph_tensor(v)]
      if expanded:
        if id(node) not in seen:
          seen.add(id(node))
          outs = [t for t in tf.nest.flatten(node.outputs) if _is_graph_tensor(t)]
          self.tensors.update({id(t): t for t in outs + arg_tensors})
          ref = lambda v: _Ref(id(v)) if _is_graph_tensor(v) else v  # noqa: E731
          self.nodes.append(_Node(layer, tf.nest.map_structure(ref, args),
                                  tf.nest.map_structure(ref, kwargs),
                                  [id(t) for t in arg_tensors], [id(t) for t in outs]))
        continue
      if not arg_tensors:
        raise ValueError(f"{_describe(layer)} has no input from the model's inputs")
      stack.append((tensor, True))
      stack.extend((t, False) for t in reversed(arg_tensors))
    self.producer = {o: n for n in self.nodes for o in n.outputs}
    self.consumers = {}
    for n in self.nodes:
      for i in dict.fromkeys(n.inputs):
        self.consumers.setdefault(i, []).append(n)


def _describe(layer):
  return f"{type(layer).__name__} layer '{getattr(layer, 'name', '?')}'"


# ---------------------------------------------------------------------------------------
# Kernel algebra (TensorFlow ops, so that FoldedBlock differentiates through it)
# ---------------------------------------------------------------------------------------

def _dilate(w, rate):
  """The kernel with rate-1 zeros between its taps, per spatial axis."""
  for axis, d in enumerate(rate):
    if d > 1:
      k = w.shape[axis]
      stuffed = tf.stack([w] + [tf.zeros_like(w)] * (d - 1), axis=axis + 1)
      shape = list(w.shape)
      shape[axis] = k * d
      w = tf.reshape(stuffed, shape)
      w = w[: (k - 1) * d + 1] if axis == 0 else w[:, : (k - 1) * d + 1]
  return w


def _regroup(k, groups, target):
  """A kernel of `groups` groups as one of `target` groups (target divides groups): each
  target group holds groups/target original groups block-diagonally."""
  if groups == target:
    return k
  r = groups // target
  h, w, n, c = k.shape
  k6 = tf.reshape(k, [h, w, n, target, r, c // groups])
  eye = tf.eye(r, dtype=k.dtype)
  return tf.reshape(tf.einsum("hwnSso,ts->hwtnSso", k6, eye), [h, w, r * n, c])


def _compose_kernels(a, ga, b, gb):
  """The kernel of B applied after A (full 2-D convolution over space, matrix product over
  channels), without expanding either group structure.

  a: [ha, wa, C0/ga, C] in `ga` groups; b: [hb, wb, C/gb, C'] in `gb` groups. Returns the
  [ha+hb-1, wa+wb-1, C0/g, C'] kernel in g = gcd(ga, gb) groups, and g.
  """
  ha, wa, na, c = a.shape
  hb, wb, _, cout = b.shape
  lcm = ga * gb // math.gcd(ga, gb)
  q, ob = c // lcm, cout // gb
  ra, rb = lcm // ga, lcm // gb
  # The channels between A and B in lcm parts: part p lies in A's group p // ra and B's
  # group p // rb. T[w, n, p, o]: the contribution through part p.
  a5 = tf.reshape(a, [ha, wa, na, lcm, q])
  b5 = tf.reshape(tf.transpose(tf.reshape(b, [hb, wb, rb, q, gb, ob]), [0, 1, 4, 2, 3, 5]),
                  [hb, wb, lcm, q, ob])
  if ha == wa == 1:
    t = tf.einsum("npq,hwpqo->hwnpo", a5[0, 0], b5)
  elif hb == wb == 1:
    t = tf.einsum("hwnpq,pqo->hwnpo", a5, b5[0, 0])
  else:
    # A as a batch of na images with C channels, correlated (full padding) with flipped B
    # as a convolution of lcm groups.
    image = tf.transpose(a, [2, 0, 1, 3])
    filt = tf.reverse(tf.reshape(tf.transpose(b5, [0, 1, 3, 2, 4]), [hb, wb, q, lcm * ob]),
                      [0, 1])
    out = _ops.conv2d(image, filt, 1, [[0, 0], [hb - 1, hb - 1], [wb - 1, wb - 1], [0, 0]])
    t = tf.reshape(tf.transpose(out, [1, 2, 0, 3]), [ha + hb - 1, wa + wb - 1, na, lcm, ob])
  h, w = t.shape[0], t.shape[1]
  g = math.gcd(ga, gb)
  ga_s, gb_s = ga // g, gb // g
  t = tf.reshape(t, [h, w, na, g, lcm // g, ob])
  if ra == 1:  # one part per A group, one B group per result group
    k = tf.reshape(tf.transpose(t, [0, 1, 4, 2, 3, 5]), [h, w, ga_s * na, cout])
  elif rb == 1:  # one part per B group, one A group per result group
    k = tf.reshape(t, [h, w, na, cout])
  else:
    part = np.arange(lcm // g)
    to_a = tf.constant(part[:, None] // ra == np.arange(ga_s)[None], dtype=t.dtype)
    to_b = tf.constant(part[:, None] // rb == np.arange(gb_s)[None], dtype=t.dtype)
    k = tf.reshape(tf.einsum("hwnSpo,pa,pb->hwanSbo", t, to_a, to_b),
                   [h, w, ga_s * na, cout])
  return k, g


def _bias_through(bias, w, groups):
  """W applied to a constant bias: sum over W's taps and group inputs."""
  ws = tf.reduce_sum(w, axis=[0, 1])
  n, cout = ws.shape
  ws = tf.reshape(ws, [n, groups, cout // groups])
  b = tf.reshape(bias, [groups, n])
  return tf.reshape(tf.einsum("Gi,iGo->Go", b, ws), [cout])


def _pad_kernel(k, top, bottom, left, right):
  if top == bottom == left == right == 0:
    return k
  return tf.pad(k, [[top, bottom], [left, right], [0, 0], [0, 0]])


# ---------------------------------------------------------------------------------------
# The affine description of a tensor
# ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Affine:
  """A block tensor as an affine function of the block input (see the module docstring)."""
  kernel: tf.Tensor       # [kh, kw, C0 / groups, C]
  groups: int
  bias: object            # [C] tensor, or None where no bias can reach
  offset: tuple           # (oh, ow)
  size: tuple             # (height, width), for the input size the fold is made at
  stride: tuple = (1, 1)
  bias_from: str = None   # the layer that added the bias, for messages
  spill_from: str = None  # the last layer that spread the formula beyond the tensor's edge
  stride_from: str = None
  err: object = None      # (counting) the formula minus the tensor, on the probe input

  @property
  def channels(self):
    return self.kernel.shape[3]

  def border_issue(self, pads, in_size):
    """None if zero-padding this tensor by pads = (top, bottom, left, right) is exact,
    else why not. Row i of the formula reads input rows i*s - oh .. i*s - oh + kh - 1, so
    it is zero above the tensor when oh >= kh - 1, below when oh <= height - H."""
    if not any(pads):
      return None
    if self.bias is not None:
      return f"its input carries a bias (added by {self.bias_from})"
    kh, kw = self.kernel.shape[:2]
    zero = (self.offset[0] >= kh - 1, self.offset[0] <= self.size[0] - in_size[0],
            self.offset[1] >= kw - 1, self.offset[1] <= self.size[1] - in_size[1])
    if all(z or not p for z, p in zip(zero, pads)):
      return None
    return (f"its input is not zero beyond its border (it comes from {self.spill_from}), "
            "while the padding is")

  def formula(self, probe, pads):
    """(counting) The formula on the probe input over the tensor padded by pads."""
    kh, kw = self.kernel.shape[:2]
    lo = (-pads[0] - self.offset[0], -pads[2] - self.offset[1])
    hi = (self.size[0] + pads[1] + kh - 2 - self.offset[0],
          self.size[1] + pads[3] + kw - 2 - self.offset[1])
    h, w = probe.shape[1:3]
    m = max(0, -lo[0], -lo[1], hi[0] - h + 1, hi[1] - w + 1)
    x = tf.pad(probe, [[0, 0], [m, m], [m, m], [0, 0]])
    x = x[:, lo[0] + m: hi[0] + m + 1, lo[1] + m: hi[1] + m + 1]
    f = _ops.conv2d(x, self.kernel, 1, "VALID")
    return f if self.bias is None else f + self.bias


def _identity(channels, size, dtype):
  return _Affine(kernel=tf.ones([1, 1, 1, channels], dtype), groups=channels, bias=None,
                 offset=(0, 0), size=tuple(size))


def _geometry(size, kernel, strides, padding, dilations=(1, 1)):
  """(pad_top, pad_bottom, pad_left, pad_right), (out_h, out_w) of a convolution, from the
  package's one geometry (tf_largeconv._core)."""
  g = _loader.core().geometry([1, int(size[0]), int(size[1]), 1],
                              [int(kernel[0]), int(kernel[1]), 1, 1],
                              [1, int(strides[0]), int(strides[1]), 1], padding, [], "NHWC",
                              [1, int(dilations[0]), int(dilations[1]), 1])
  return (g["pad_top"], g["pad_bottom"], g["pad_left"], g["pad_right"]), (g["out_h"],
                                                                          g["out_w"])


# ---------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------

_NONLINEAR = {"ReLU", "LeakyReLU", "PReLU", "ELU", "Softmax", "ThresholdedReLU",
              "MaxPooling2D", "MaxPool2D", "GlobalMaxPooling2D", "Maximum", "Minimum",
              "Dropout", "SpatialDropout2D", "GaussianNoise", "GaussianDropout",
              "AlphaDropout", "LayerNormalization", "GroupNormalization",
              "UnitNormalization"}
_NOT_LINEAR_WHY = {"Dropout": "random in training", "SpatialDropout2D": "random in training",
                   "GaussianNoise": "random in training",
                   "GaussianDropout": "random in training",
                   "AlphaDropout": "random in training"}
# Linear, but not folded; some subclass a supported layer in tf_keras (Conv2DTranspose is
# a Conv2D there), so they are named before the class hierarchy is searched.
_UNSUPPORTED = {"Conv2DTranspose", "Conv1D", "Conv3D", "Conv1DTranspose", "Conv3DTranspose",
                "DepthwiseConv1D", "SeparableConv1D", "Dense", "EinsumDense", "Reshape",
                "Flatten", "Permute", "AveragePooling2D", "AvgPool2D",
                "GlobalAveragePooling2D", "UpSampling2D", "Lambda"}
# tf_keras records `a - b`, `2 * a` etc. as TFOpLambda layers named by their symbol.
_TF_OP_SYMBOLS = {"math.add": "Add", "__operators__.add": "Add", "math.subtract": "Subtract",
                  "math.multiply": "Multiply", "math.negative": "Negative",
                  "math.truediv": "TrueDivide", "math.divide": "TrueDivide"}


def _kind(layer):
  """The handler name for a layer (its class or a base class), or None."""
  symbol = getattr(layer, "symbol", None)
  if type(layer).__name__ == "TFOpLambda":
    return _TF_OP_SYMBOLS.get(symbol)
  if hasattr(layer, "_inbound_nodes") and hasattr(layer, "outputs") and \
      hasattr(layer, "layers") and getattr(layer, "outputs", None):
    return "Model"
  for cls in type(layer).__mro__:
    if cls.__name__ in _NONLINEAR or cls.__name__ in _UNSUPPORTED:
      return None
    if hasattr(_Composer, "_" + cls.__name__):
      return cls.__name__
  return None


def _activation(layer):
  """The layer's activation name if it is not linear, else None."""
  config = layer.get_config() if hasattr(layer, "get_config") else {}
  act = config.get("activation")
  if act in (None, "linear") or not isinstance(act, (str, dict)):
    return None
  if isinstance(act, dict):
    name = act.get("config", {}).get("name") or act.get("class_name")
    return None if name == "linear" else str(name)
  return act


def _not_linear(layer):
  """The ValueError for a layer that cannot be folded."""
  name = type(layer).__name__
  if name == "Activation":
    return _Unfoldable(f"{_describe(layer)} ({_activation(layer)}) is not linear")
  act = _activation(layer)
  if act is not None and _kind(layer) is not None:
    return _Unfoldable(f"{_describe(layer)} has activation '{act}': not linear")
  if name in _NONLINEAR:
    why = _NOT_LINEAR_WHY.get(name, "")
    return _Unfoldable(f"{_describe(layer)} is not linear" + (f" ({why})" if why else ""))
  if name == "TFOpLambda":
    return _Unfoldable(f"{_describe(layer)} ({getattr(layer, 'symbol', '?')}) is not a "
                      "linear operation fold supports")
  return _Unfoldable(f"{_describe(layer)} is not a linear layer fold supports (supported: "
                    "Conv2D, DepthwiseConv2D, SeparableConv2D, the Large* layers, "
                    "BatchNormalization, Add, Subtract, Average, Concatenate, ZeroPadding2D, "
                    "Cropping2D, Identity, linear Activation, Rescaling, nested models)")


def _pairs(value):
  """Keras's ((top, bottom), (left, right)) from an int, a pair, or pairs."""
  if isinstance(value, int):
    return (value, value), (value, value)
  a, b = value
  if isinstance(a, int):
    return (a, a), (b, b)
  return tuple(a), tuple(b)


def _channel_constant(value, channels, desc):
  """A scalar or per-channel constant as a float64 vector of `channels`, or an error."""
  v = np.asarray(value.numpy() if hasattr(value, "numpy") else value, np.float64)
  if v.size == 1:
    return np.full(channels, float(v.reshape(-1)[0]))
  if v.size == channels and all(n == 1 for n in v.shape[:-1]):
    return v.reshape(-1)
  raise _Unfoldable(f"{desc} uses a constant of shape {v.shape}: only scalars and "
                   f"per-channel vectors ({channels}) fold")


_TAKES_CONSTANTS = ("Add", "Subtract", "Multiply", "TrueDivide")


class _Composer:
  """Walks a graph from its input's affine description to its output's.

  read(variable) -> tensor gives a layer weight in the composing dtype; with `count`, the
  difference between the formula and the block on a probe input is propagated (it is a
  linear function of the differences padding brings in, so `exact=False` reports count
  exactly the pixels that differ); `final_activation_ok` lets the last
  node carry a non-linear activation (reparameterize moves it to the Large layer).
  """

  def __init__(self, read, dtype, in_size, known, exact=True, count=False,
               final_activation_ok=False):
    self.read, self.dtype, self.in_size, self.known = read, dtype, tuple(in_size), known
    self.exact, self.count = exact, count
    self.final_activation_ok = final_activation_ok
    self.reasons = []
    self.activation = None

  def run(self, graph, state, final=True):
    output = graph.outputs[0]
    states = {graph.inputs[0]: state}
    for node in graph.nodes:
      try:
        states[node.outputs[0]] = self._node(node, states, final and output in node.outputs)
      except _Unfoldable as e:
        e.node = node  # set last by the outermost graph: a nested model's node, for its layers
        raise
    return states[output]

  def _node(self, node, states, last):
    layer = node.layer
    kind = _kind(layer)
    if kind is None:
      raise _not_linear(layer)
    act = _activation(layer)
    if act is not None:
      if not (last and self.final_activation_ok):
        raise _not_linear(layer)
      self.activation = act
    if len(node.outputs) != 1:
      raise _Unfoldable(f"{_describe(layer)} has {len(node.outputs)} outputs: fold needs "
                        "one tensor per layer")
    resolve = lambda v: states[v.id] if isinstance(v, _Ref) else v  # noqa: E731
    operands = ([resolve(v) for v in tf.nest.flatten(node.args)] +
                [resolve(v) for v in tf.nest.flatten(node.kwargs) if isinstance(v, _Ref)])
    if kind not in _TAKES_CONSTANTS and not isinstance(operands[0], _Affine):
      raise _Unfoldable(f"{_describe(layer)}: its first argument is not a graph tensor")
    return getattr(self, "_" + kind)(layer, operands)

  # -- helpers ---------------------------------------------------------------------------

  def _check_channels_last(self, layer):
    fmt = layer.get_config().get("data_format", "channels_last")
    if fmt not in (None, "channels_last"):
      raise _Unfoldable(f"{_describe(layer)} has data_format='{fmt}': fold supports "
                       "channels_last only")

  def _padded_err(self, t, pads):
    """(counting) The error of t zero-padded by pads: t's inside, the formula outside."""
    if not any(pads):
      return t.err
    paddings = [[0, 0], [pads[0], pads[1]], [pads[2], pads[3]], [0, 0]]
    outside = tf.pad(tf.zeros_like(t.err[:1, :, :, :1]), paddings, constant_values=1.0)
    return tf.pad(t.err, paddings) + outside * t.formula(self.probe, pads)

  def _border(self, t, pads, desc, how):
    """Checks that padding t by pads is exact; else raises, or (exact=False) notes it."""
    issue = t.border_issue(pads, self.in_size)
    if issue is None:
      return
    message = (f"{desc} pads its input ({how}), but {issue}: at the border the block is "
               "not one convolution")
    if self.exact:
      raise ValueError(message + ". fold(block, exact=False) folds it anyway and counts "
                       "the output pixels that differ")
    self.reasons.append(message)

  def _no_stride_before(self, t, desc, what):
    if t.stride != (1, 1):
      raise ValueError(f"{desc} has {what} after the stride of {t.stride_from}: a stride "
                       "before a spatial kernel is not one convolution")

  def _spatial(self, layer, t, w, groups, strides, padding, bias=None, dilation=(1, 1)):
    """t -> conv(t, w) (+ bias) for a Keras convolution's kernel, strides and padding."""
    desc = _describe(layer)
    if tuple(strides) != (1, 1) and not self.known:
      raise ValueError(f"{desc} has strides {tuple(strides)}: a strided fold needs the "
                       "block's input height and width (pass input_size=(height, width))")
    w = _dilate(tf.cast(w, self.dtype), dilation)
    kh, kw = w.shape[:2]
    pads, size = _geometry(t.size, (kh, kw), strides, padding.upper())
    if t.stride != (1, 1) and (kh > 1 or kw > 1 or any(pads)):
      self._no_stride_before(t, desc, f"a {kh}x{kw} kernel")
    self._border(t, pads, desc, f"padding='{padding.lower()}'")
    err = None
    if self.count:
      err = _ops.conv2d(self._padded_err(t, pads), w, list(strides), "VALID")
    kernel, g = _compose_kernels(t.kernel, t.groups, w, groups)
    out_bias = None if t.bias is None else _bias_through(t.bias, w, groups)
    if bias is not None:
      out_bias = bias if out_bias is None else out_bias + bias
    stride = (t.stride[0] * strides[0], t.stride[1] * strides[1])
    return _Affine(kernel=kernel, groups=g, bias=out_bias,
                   offset=(t.offset[0] + pads[0], t.offset[1] + pads[2]), size=size,
                   stride=stride,
                   bias_from=t.bias_from or (desc if bias is not None else None),
                   spill_from=desc if (kh > 1 or kw > 1) else t.spill_from,
                   stride_from=desc if tuple(strides) != (1, 1) else t.stride_from,
                   err=err)

  def _scaled(self, layer, t, scale=None, shift=None):
    """t * scale + shift, per channel (scale and shift: tensors, or None)."""
    kernel, bias = t.kernel, t.bias
    if scale is not None:
      kernel = kernel * scale
      bias = None if bias is None else bias * scale
    if shift is not None:
      bias = shift if bias is None else bias + shift
    err = t.err if t.err is None or scale is None else t.err * scale
    return dataclasses.replace(t, kernel=kernel, bias=bias, err=err,
                               bias_from=t.bias_from or (_describe(layer) if shift is not None
                                                         else None))

  def _combine(self, layer, terms, constant=None):
    """sum of coef * t over terms [(coef, t)] (+ a per-channel constant)."""
    desc = _describe(layer)
    states = [t for _, t in terms]
    first = states[0]
    for t in states[1:]:
      if t.size != first.size or t.stride != first.stride or t.channels != first.channels:
        raise ValueError(f"{desc} adds tensors of different sizes, strides or channels")
    kernels, off = self._aligned(states)
    g_all = math.gcd(*[t.groups for t in states]) if len(states) > 1 else first.groups
    kernel = sum(c * _regroup(k, t.groups, g_all) for (c, t), k in zip(terms, kernels))
    biases = [c * t.bias for c, t in terms if t.bias is not None]
    bias = tf.add_n(biases) if biases else None
    if constant is not None:
      const = tf.constant(constant, self.dtype)
      bias = const if bias is None else bias + const
    bias_from = next((t.bias_from for t in states if t.bias_from), None)
    return _Affine(kernel=kernel, groups=g_all, bias=bias, offset=off, size=first.size,
                   stride=first.stride,
                   bias_from=bias_from or (desc if constant is not None else None),
                   spill_from=next((t.spill_from for t in states if t.spill_from), None),
                   stride_from=first.stride_from,
                   err=(tf.add_n([c * t.err for c, t in terms]) if self.count else None))

  @staticmethod
  def _aligned(states):
    """The states' kernels zero-padded to one extent and offset; returns them, offset."""
    off = tuple(max(t.offset[a] for t in states) for a in (0, 1))
    ext = tuple(max(off[a] - t.offset[a] + t.kernel.shape[a] for t in states) for a in (0, 1))
    kernels = []
    for t in states:
      top, left = off[0] - t.offset[0], off[1] - t.offset[1]
      kernels.append(_pad_kernel(t.kernel, top, ext[0] - top - t.kernel.shape[0], left,
                                 ext[1] - left - t.kernel.shape[1]))
    return kernels, off

  def _var(self, v):
    return tf.cast(self.read(v), self.dtype)

  # -- layers (method names are the Keras class names) ------------------------------------

  def _InputLayer(self, layer, operands):  # noqa: N802
    return operands[0]

  def _Conv2D(self, layer, operands):  # noqa: N802
    self._check_channels_last(layer)
    bias = self._var(layer.bias) if layer.use_bias else None
    return self._spatial(layer, operands[0], self._var(layer.kernel), layer.groups,
                         tuple(layer.strides), layer.padding, bias,
                         tuple(layer.dilation_rate))

  def _DepthwiseConv2D(self, layer, operands):  # noqa: N802
    self._check_channels_last(layer)
    kernel = getattr(layer, "depthwise_kernel", None)  # tf_keras; Keras 3: kernel
    w = self._var(layer.kernel if kernel is None else kernel)
    kh, kw, c, m = w.shape
    bias = self._var(layer.bias) if layer.use_bias else None
    return self._spatial(layer, operands[0], tf.reshape(w, [kh, kw, 1, c * m]), c,
                         tuple(layer.strides), layer.padding, bias,
                         tuple(layer.dilation_rate))

  def _SeparableConv2D(self, layer, operands):  # noqa: N802
    self._check_channels_last(layer)
    w = self._var(layer.depthwise_kernel)
    kh, kw, c, m = w.shape
    t = self._spatial(layer, operands[0], tf.reshape(w, [kh, kw, 1, c * m]), c,
                      tuple(layer.strides), layer.padding, None, tuple(layer.dilation_rate))
    bias = self._var(layer.bias) if layer.use_bias else None
    return self._spatial(layer, t, self._var(layer.pointwise_kernel), 1, (1, 1), "valid",
                         bias)

  def _BatchNormalization(self, layer, operands):  # noqa: N802
    t = operands[0]
    axis = layer.axis
    axis = axis[0] if isinstance(axis, (list, tuple)) and len(axis) == 1 else axis
    if axis not in (-1, 3):
      raise _Unfoldable(f"{_describe(layer)} normalises axis {layer.axis}: fold needs the "
                       "channel axis (-1)")
    inv = tf.math.rsqrt(self._var(layer.moving_variance) +
                        tf.constant(layer.epsilon, self.dtype))
    scale = inv * self._var(layer.gamma) if layer.scale else inv
    shift = -self._var(layer.moving_mean) * scale
    if layer.center:
      shift = shift + self._var(layer.beta)
    return self._scaled(layer, t, scale, shift)

  def _Add(self, layer, operands):  # noqa: N802
    terms = [(1.0, t) for t in operands if isinstance(t, _Affine)]
    consts = [v for v in operands if not isinstance(v, _Affine)]
    constant = None
    if consts:
      constant = sum(_channel_constant(v, terms[0][1].channels, _describe(layer))
                     for v in consts)
    return self._combine(layer, terms, constant)

  def _Subtract(self, layer, operands):  # noqa: N802
    if len(operands) != 2:
      raise _Unfoldable(f"{_describe(layer)} needs exactly two inputs")
    a, b = operands
    if not isinstance(a, _Affine):
      return self._combine(layer, [(-1.0, b)], _channel_constant(a, b.channels,
                                                                   _describe(layer)))
    if not isinstance(b, _Affine):
      return self._combine(layer, [(1.0, a)], -_channel_constant(b, a.channels,
                                                                   _describe(layer)))
    return self._combine(layer, [(1.0, a), (-1.0, b)])

  def _Average(self, layer, operands):  # noqa: N802
    return self._combine(layer, [(1.0 / len(operands), t) for t in operands])

  def _Negative(self, layer, operands):  # noqa: N802
    return self._combine(layer, [(-1.0, operands[0])])

  def _Multiply(self, layer, operands):  # noqa: N802
    tensors = [t for t in operands if isinstance(t, _Affine)]
    if len(tensors) != 1:
      raise _Unfoldable(f"{_describe(layer)} multiplies {len(tensors)} tensors: not linear")
    scale = np.ones(tensors[0].channels)
    for v in operands:
      if not isinstance(v, _Affine):
        scale = scale * _channel_constant(v, tensors[0].channels, _describe(layer))
    return self._scaled(layer, tensors[0], tf.constant(scale, self.dtype))

  def _TrueDivide(self, layer, operands):  # noqa: N802
    if not isinstance(operands[0], _Affine) or isinstance(operands[1], _Affine):
      raise _Unfoldable(f"{_describe(layer)} divides by a tensor: not linear")
    t = operands[0]
    scale = 1.0 / _channel_constant(operands[1], t.channels, _describe(layer))
    return self._scaled(layer, t, tf.constant(scale, self.dtype))

  def _Rescaling(self, layer, operands):  # noqa: N802
    t = operands[0]
    config = layer.get_config()
    scale = _channel_constant(config["scale"], t.channels, _describe(layer))
    offset = _channel_constant(config["offset"], t.channels, _describe(layer))
    return self._scaled(layer, t, tf.constant(scale, self.dtype),
                        tf.constant(offset, self.dtype) if np.any(offset) else None)

  def _Identity(self, layer, operands):  # noqa: N802
    return operands[0]

  def _Activation(self, layer, operands):  # noqa: N802
    return operands[0]  # linear (non-linear activations are refused before)

  def _Concatenate(self, layer, operands):  # noqa: N802
    axis = layer.axis
    if axis not in (-1, 3):
      raise _Unfoldable(f"{_describe(layer)} concatenates along axis {axis}: fold needs "
                       "the channel axis (-1)")
    first = operands[0]
    for t in operands[1:]:
      if t.size != first.size or t.stride != first.stride:
        raise ValueError(f"{_describe(layer)} concatenates tensors of different sizes or "
                         "strides")
    kernels, off = self._aligned(operands)
    kernel = tf.concat([_regroup(k, t.groups, 1) for k, t in zip(kernels, operands)], -1)
    bias = None
    if any(t.bias is not None for t in operands):
      bias = tf.concat([t.bias if t.bias is not None else tf.zeros([t.channels], self.dtype)
                        for t in operands], 0)
    return _Affine(kernel=kernel, groups=1, bias=bias, offset=off, size=first.size,
                   stride=first.stride,
                   bias_from=next((t.bias_from for t in operands if t.bias_from), None),
                   spill_from=next((t.spill_from for t in operands if t.spill_from), None),
                   stride_from=first.stride_from,
                   err=tf.concat([t.err for t in operands], -1) if self.count else None)

  def _ZeroPadding2D(self, layer, operands):  # noqa: N802
    self._check_channels_last(layer)
    t = operands[0]
    (pt, pb), (pl, pr) = _pairs(layer.get_config()["padding"])
    pads = (pt, pb, pl, pr)
    desc = _describe(layer)
    if any(pads):
      self._no_stride_before(t, desc, "zero padding")
    self._border(t, pads, desc, f"by {pads}")
    return dataclasses.replace(
        t, offset=(t.offset[0] + pt, t.offset[1] + pl),
        size=(t.size[0] + pt + pb, t.size[1] + pl + pr),
        err=self._padded_err(t, pads) if self.count else None)

  def _Cropping2D(self, layer, operands):  # noqa: N802
    self._check_channels_last(layer)
    t = operands[0]
    (ct, cb), (cl, cr) = _pairs(layer.get_config()["cropping"])
    if any((ct, cb, cl, cr)):
      self._no_stride_before(t, _describe(layer), "a crop")
    size = (t.size[0] - ct - cb, t.size[1] - cl - cr)
    return dataclasses.replace(
        t, offset=(t.offset[0] - ct, t.offset[1] - cl), size=size,
        spill_from=_describe(layer) if any((ct, cb, cl, cr)) else t.spill_from,
        err=t.err[:, ct: ct + size[0], cl: cl + size[1]] if self.count else None)

  def _Model(self, layer, operands):  # noqa: N802
    graph = _Graph(layer)
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
      raise _Unfoldable(f"nested {_describe(layer)} has {len(graph.inputs)} inputs and "
                       f"{len(graph.outputs)} outputs: fold needs one of each")
    return self.run(graph, operands[0], final=False)

  def _FoldedBlock(self, layer, operands):  # noqa: N802
    if not layer.exact:
      raise _Unfoldable(f"{_describe(layer)} was made with exact=False")
    return self._Model(layer.block, operands)


# ---------------------------------------------------------------------------------------
# Blocks: a graph (or a region of one) from one input tensor to one output tensor
# ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Block:
  nodes: list
  inputs: list      # [the input tensor's id]
  outputs: list     # [the output tensor's id]
  channels: int
  size: tuple       # (H, W): the real input size when known, else the stand-in
  known: bool
  name: str = "block"


def _block_of(graph, entry, output, input_size=None, nodes=None):
  shape = tuple(graph.tensors[entry].shape)
  if len(shape) != 4:
    raise ValueError(f"fold needs a 4-D (batch, height, width, channels) input, got shape "
                     f"{shape}")
  if shape[3] is None:
    raise ValueError("fold needs the input's channel count; the block's input has shape "
                     f"{shape}")
  size = tuple(input_size) if input_size is not None else shape[1:3]
  known = all(s is not None for s in size)
  size = tuple(int(s) if s is not None else _STAND_IN for s in size)
  return _Block(nodes=graph.nodes if nodes is None else nodes, inputs=[entry],
                outputs=[output], channels=int(shape[3]), size=size, known=known,
                name=graph.name)


def _model_block(model, input_size=None):
  graph = _Graph(model)
  if len(graph.inputs) != 1 or len(graph.outputs) != 1:
    raise ValueError(f"fold needs a model with one input and one output; '{graph.name}' has "
                     f"{len(graph.inputs)} inputs and {len(graph.outputs)} outputs")
  return _block_of(graph, graph.inputs[0], graph.outputs[0], input_size)


def _read64(variable):
  return tf.cast(tf.convert_to_tensor(variable), tf.float64)


def _compose(block, read, dtype, exact, count=False, final_activation_ok=False):
  """The block output's affine description, and the composer (reasons, activation)."""
  if count and not block.known:
    raise ValueError("exact=False counts the output pixels that differ for one input size, "
                     "and the block's input height and width are unknown: pass "
                     "input_size=(height, width)")
  composer = _Composer(read, dtype, block.size, block.known, exact, count,
                       final_activation_ok)
  state = _identity(block.channels, block.size, dtype)
  if count:
    probe = np.random.default_rng(0).standard_normal((1,) + block.size + (block.channels,))
    composer.probe = tf.constant(probe, tf.float64)
    state.err = tf.zeros_like(composer.probe)
  return composer.run(block, state), composer


def _report(state, composer, block):
  if not composer.count:
    return None
  # A pixel differs where the error is beyond float64 rounding (cancellations, e.g. a - a,
  # leave only rounding).
  err = np.abs(state.err.numpy()[0]).max(axis=-1)
  differs = err > 1e-9 * max(1.0, float(err.max()))
  return FoldReport(differing_pixels=int(differs.sum()), total_pixels=int(differs.size),
                    input_size=block.size, reasons=tuple(composer.reasons))


# ---------------------------------------------------------------------------------------
# One convolution of x that computes the block: padding and kernel extension
# ---------------------------------------------------------------------------------------

def _keras_extension(state, block, mode):
  """(top, bottom, left, right) zeros to add to the kernel so that a Keras convolution with
  padding `mode` ('SAME' or 'VALID') and the state's stride computes the state, or None."""
  ext = []
  for a in (0, 1):
    kh, oh, out, s, size = (state.kernel.shape[a], state.offset[a], state.size[a],
                            state.stride[a], block.size[a])
    found = None
    for kf in range(kh, kh + 2 * abs(oh) + 2 * s + kh + 2):
      try:
        pads, o = _geometry((size, size), (kf, kf), (s, s), mode)
      except ValueError:  # a 'valid' kernel larger than the input
        break
      top = pads[0] - oh
      if o[0] == out and 0 <= top <= kf - kh:
        found = (top, kf - kh - top)
        break
    if found is None:
      return None
    ext.extend(found)
  return tuple(ext)


def _keras_geometry(state, block):
  """('same' or 'valid', kernel extension) for the Keras layer, or a ValueError."""
  for mode in ("SAME", "VALID"):
    ext = _keras_extension(state, block, mode)
    if ext is not None:
      return mode.lower(), ext
  rows = state.size[0] - (block.size[0] if state.stride[0] == 1 else 0)
  cols = state.size[1] - (block.size[1] if state.stride[1] == 1 else 0)
  where = (f"is {rows:+d} rows and {cols:+d} columns the size of its input, reading from "
           f"offset {tuple(-o for o in state.offset)}" if state.stride == (1, 1)
           else f"has size {state.size} with stride {state.stride}")
  raise ValueError(f"the output of block '{block.name}' {where}: no convolution with "
                   "padding 'same' or 'valid' computes it (FoldedBlock, which pads "
                   "explicitly, can)")


def _explicit_geometry(state, block):
  """(explicit pads ((top, bottom), (left, right)), kernel extension) for conv2d."""
  pads, ext = [], []
  for a in (0, 1):
    kh, oh, out, s, size = (state.kernel.shape[a], state.offset[a], state.size[a],
                            state.stride[a], block.size[a])
    top_zeros = max(0, -oh)
    top = oh + top_zeros
    bottom = (out - 1) * s + kh + top_zeros - size - top
    bottom_zeros = max(0, -bottom)
    pads.append((top, bottom + bottom_zeros))
    ext.extend((top_zeros, bottom_zeros))
  return tuple(pads), tuple(ext)


# ---------------------------------------------------------------------------------------
# fold, reparameterize
# ---------------------------------------------------------------------------------------

def _large_layer(state, composer, block, flavour, dtype, algorithm, workspace_limit, name):
  """The Large layer computing `state` from the block input, with its weights set."""
  padding, ext = _keras_geometry(state, block)
  kernel = _pad_kernel(state.kernel, *ext).numpy()
  c0, c, g = block.channels, state.channels, state.groups
  kh, kw = kernel.shape[:2]
  common = dict(kernel_size=(kh, kw), strides=state.stride, padding=padding,
                use_bias=state.bias is not None, activation=composer.activation,
                algorithm=algorithm, workspace_limit=workspace_limit, dtype=dtype, name=name)
  if g == c0 and c0 > 1:
    layer = flavour.depthwise(depth_multiplier=c // c0, **common)
    kernel = kernel.reshape(kh, kw, c0, c // c0)
  else:
    layer = flavour.conv(filters=c, groups=g, **common)
  shape = tuple(s if block.known else None for s in block.size)
  layer.build((None,) + shape + (c0,))
  layer.set_weights([kernel] + ([state.bias.numpy()] if state.bias is not None else []))
  return layer


def fold(model, flavour, exact=True, input_size=None, dtype=None, algorithm="auto",
         workspace_limit=None, name=None):
  """See `tf_largeconv.keras.fold`."""
  block = _model_block(model, input_size)
  state, composer = _compose(block, _read64, tf.float64, exact, count=not exact)
  layer = _large_layer(state, composer, block, flavour, dtype, algorithm, workspace_limit,
                       name)
  report = _report(state, composer, block)
  if report is not None:
    layer.fold_report = report
    if report.differing_pixels:
      warnings.warn(f"fold(exact=False): {report.differing_pixels} of {report.total_pixels} "
                    f"output pixels differ from block '{model.name}' at the border (input "
                    f"size {report.input_size}): " + "; ".join(report.reasons),
                    FoldWarning, stacklevel=3)
  return layer


_CONV_KINDS = ("Conv2D", "DepthwiseConv2D", "SeparableConv2D", "Model", "FoldedBlock")
# A region of one of these alone is still worth replacing (a whole block in one layer).
_BLOCK_KINDS = ("Model", "FoldedBlock")


def _cone(graph, node, linear, cut=None):
  """The nodes behind `node` through linear ones (stopping at the tensor `cut`), and the
  tensors where it stops."""
  members, entries, stack = {id(node): node}, set(), list(node.inputs)
  while stack:
    t = stack.pop()
    producer = graph.producer.get(t)
    if t == cut or producer is None or not linear(producer):
      entries.add(t)
    elif id(producer) not in members:
      members[id(producer)] = producer
      stack.extend(producer.inputs)
  return members, entries


def _regions(graph, excluded):
  """Candidate linear regions, latest output first and largest first for each output:
  (nodes in order, entry id, output id).

  A region is the cone of linear layers (not `excluded`: folded already, or unfoldable)
  behind a tensor, whole or cut at one inner tensor, that reaches back to exactly one
  tensor (its entry); nothing outside it may use its inner tensors. It holds a convolution
  and at least two layers, or is one nested model or FoldedBlock. Its last layer may carry
  an activation (kept on the folded layer).
  """
  def linear(node, last=False):
    return (id(node) not in excluded and len(node.outputs) == 1 and
            _kind(node.layer) is not None and (last or _activation(node.layer) is None))

  model_outputs = set(graph.outputs)
  for node in reversed(graph.nodes):
    if not linear(node, last=True):
      continue
    whole, _ = _cone(graph, node, linear)
    cuts = [None] + [o for n in whole.values() if n is not node for o in n.outputs]
    found = {}
    for cut in cuts:
      members, entries = _cone(graph, node, linear, cut)
      inner = {o for n in members.values() for o in n.outputs} - {node.outputs[0]}
      alone = len(members) == 1 and _kind(node.layer) in _BLOCK_KINDS
      if (len(entries) != 1 or (len(members) < 2 and not alone) or inner & model_outputs or
          not any(_kind(n.layer) in _CONV_KINDS for n in members.values()) or
          any(id(c) not in members for t in inner for c in graph.consumers.get(t, []))):
        continue
      found.setdefault(frozenset(members), (members, next(iter(entries))))
    for members, entry in sorted(found.values(), key=lambda f: -len(f[0])):
      yield [n for n in graph.nodes if id(n) in members], entry, node.outputs[0]


def _fold_regions(graph, flavour, algorithm, workspace_limit):
  """{output id: (Large layer, entry id)} and the ids of the nodes they replace.

  Tensors are visited latest first, so a region is as large as can fold exactly; where a
  cone does not fold (say, a 'same' convolution after another), the cones inside it are
  tried, and passes repeat with the folded regions as boundaries until none is left.
  """
  folded, covered, blocked = {}, set(), set()
  progress = True
  while progress:
    progress = False
    for nodes, entry, output in list(_regions(graph, covered | blocked)):
      if any(id(n) in covered for n in nodes):
        continue
      block = _block_of(graph, entry, output, nodes=nodes)
      last = graph.producer[output].layer
      try:
        state, composer = _compose(block, _read64, tf.float64, exact=True,
                                   final_activation_ok=True)
        layer = _large_layer(state, composer, block, flavour, last.get_config().get("dtype"),
                             algorithm, workspace_limit, name=f"{last.name}_folded")
      except _Unfoldable as e:
        # A layer no region can hold (say `a * a`): a boundary from now on, so that later
        # candidates stop at it instead of composing up to it again (the cuts would find
        # the same regions, at the cost of a failed composition each).
        blocked.add(id(e.node))
        progress = True
        break
      except ValueError:
        continue  # not one exact convolution here: the cones inside it are tried next
      covered.update(id(n) for n in nodes)
      folded[output] = (layer, entry)
      progress = True
  return folded, covered


def _clone(layer):
  if not hasattr(layer, "get_weights"):  # a stateless Keras 3 operation (e.g. `a - b`)
    return layer
  return type(layer).from_config(layer.get_config())


def reparameterize(model, flavour, algorithm="auto", workspace_limit=None):
  """See `tf_largeconv.keras.reparameterize`."""
  graph = _Graph(model)
  folded, covered = _fold_regions(graph, flavour, algorithm, workspace_limit)
  tensors = {}
  inputs = []
  for i in graph.inputs:
    t = graph.tensors[i]
    inputs.append(flavour.input(batch_shape=tuple(t.shape), dtype=t.dtype,
                                name=t._keras_history[0].name))
    tensors[i] = inputs[-1]
  clones = {}
  for node in graph.nodes:
    if node.outputs[0] in folded:
      layer, entry = folded[node.outputs[0]]
      tensors[node.outputs[0]] = layer(tensors[entry])
      continue
    if id(node) in covered:
      continue
    fresh = id(node.layer) not in clones
    clone = clones.setdefault(id(node.layer), _clone(node.layer))
    mapped = lambda v: tensors[v.id] if isinstance(v, _Ref) else v  # noqa: E731
    out = clone(*tf.nest.map_structure(mapped, node.args),
                **tf.nest.map_structure(mapped, node.kwargs))
    tensors.update(zip(node.outputs, tf.nest.flatten(out)))
    if fresh and clone is not node.layer:
      clone.set_weights(node.layer.get_weights())
  outputs = [tensors[o] for o in graph.outputs]
  return flavour.model(inputs[0] if len(inputs) == 1 else inputs,
                       outputs[0] if len(outputs) == 1 else outputs, name=model.name)


# ---------------------------------------------------------------------------------------
# FoldedBlock: the block's own weights, folded at every call
# ---------------------------------------------------------------------------------------

class FoldedBlockBase:
  """The body of the FoldedBlock layers, mixed in before the Keras `Layer` of either flavour
  (which sets `_serialize_block` / `_deserialize_block`).

  At construction the block is folded once in float64 to check it and fix the geometry;
  each call composes the kernel again from the block's variables with TensorFlow ops (so
  gradients reach every original weight) and runs one `tf_largeconv.conv2d`. Only the
  block input (and kernel-sized tensors) are kept for the backward pass.
  """

  def __init__(self, block, exact=True, input_size=None, algorithm="auto",
               workspace_limit=None, **kwargs):
    super().__init__(**kwargs)
    self.algorithm = _args.normalize_algorithm(algorithm)
    _args.normalize_workspace_limit(workspace_limit)
    self.workspace_limit = workspace_limit
    self.block = block
    self.exact = bool(exact)
    self.input_size = None if input_size is None else tuple(int(s) for s in input_size)
    spec = _model_block(block, input_size)
    state, composer = _compose(spec, _read64, tf.float64, self.exact, count=not self.exact)
    self._fold_spec = (spec,) + _explicit_geometry(state, spec) + (state.stride,)
    self.fold_report = _report(state, composer, spec)
    self._out_channels = state.channels
    self._out_size = state.size
    # Under XLA, 'auto' runs conv2d's portable path (see call).
    self.supports_jit = _args.compiles_under_xla(self.algorithm)
    self.built = True

  def call(self, inputs):
    spec, pads, ext, strides = self._fold_spec
    state, _ = _compose(spec, lambda v: v, inputs.dtype, exact=False)
    kernel = _pad_kernel(state.kernel, *ext)
    padding = [[0, 0], list(pads[0]), list(pads[1]), [0, 0]]
    if _args.resolve_algorithm(self.algorithm) == "auto":
      # The op's own planner (direct or FFT), whose workspace stays within the limit.
      # conv2d's "auto" may hand the passes to TensorFlow's kernel, whose gradients take
      # temporaries growing with the image (170 MiB beyond the plan's estimate for the
      # founding block at K=7): not what a layer for lean training should do by default.
      # Under XLA, without the op library, or while exporting, conv2d's portable path runs.
      attrs = _args.conv_attrs(list(strides), padding, "NHWC", None, "auto",
                               self.workspace_limit)
      y = _loader.ops().large_conv_conv2d(inputs, kernel, **attrs)
    else:
      y = _ops.conv2d(inputs, kernel, list(strides), padding, algorithm=self.algorithm,
                      workspace_limit=self.workspace_limit)
    return y if state.bias is None else y + state.bias

  def compute_output_shape(self, input_shape):
    spec, _, _, strides = self._fold_spec
    size = list(self._out_size)
    for a in (0, 1):
      if strides[a] == 1:  # the size difference is independent of the input size
        h = input_shape[1 + a]
        size[a] = None if h is None else h + self._out_size[a] - spec.size[a]
    return (input_shape[0], size[0], size[1], self._out_channels)

  def get_config(self):
    config = super().get_config()
    config.update(block=self._serialize_block(self.block), exact=self.exact,
                  input_size=self.input_size, algorithm=self.algorithm,
                  workspace_limit=self.workspace_limit)
    return config

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    # Keras's deserialisation empties the dictionaries it reads: leave the caller's intact.
    config["block"] = cls._deserialize_block(copy.deepcopy(config["block"]))
    return cls(**config)
