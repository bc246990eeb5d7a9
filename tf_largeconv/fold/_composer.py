"""Walks a block from its input's affine description to its output's: each node's layer
goes to its handler (`_layers`), which builds on the steps here (a spatial kernel, a
per-channel scale and shift, a linear combination), and every padding is checked for
exactness at the border."""

import dataclasses
import math

import numpy as np
import tensorflow as tf

from tf_largeconv import ops as _ops
from tf_largeconv.fold import _affine
from tf_largeconv.fold import _geometry
from tf_largeconv.fold import _graph
from tf_largeconv.fold import _kernels
from tf_largeconv.fold import _layer_kinds
from tf_largeconv.fold import _layers
from tf_largeconv.fold import _report


class Composer:
  """Walks a graph from its input's affine description to its output's.

  read(variable) -> tensor gives a layer weight in the composing dtype; with `count`, the
  difference between the formula and the block on a probe input is propagated (it is a
  linear function of the differences padding brings in, so `exact=False` reports count
  exactly the pixels that differ); `final_activation_ok` lets the last
  node carry a non-linear activation (reparameterize moves it to the Large layer).
  """

  def __init__(
    self, read, dtype, in_size, known, exact=True, count=False, final_activation_ok=False
  ):
    self.read, self.dtype, self.in_size, self.known = read, dtype, tuple(in_size), known
    self.exact, self.count = exact, count
    self.final_activation_ok = final_activation_ok
    self.reasons = []
    self.activation = None
    self.probe = None  # (counting) the random input the error is propagated on

  def run(self, graph, state, final=True):
    """The description of graph's output, given its input's (`state`)."""
    output = graph.outputs[0]
    states = {graph.inputs[0]: state}
    for node in graph.nodes:
      try:
        states[node.outputs[0]] = self._node(node, states, final and output in node.outputs)
      except _report.Unfoldable as e:
        e.node = node  # set last by the outermost graph: a nested model's node, for its layers
        raise
    return states[output]

  def _node(self, node, states, last):
    layer = node.layer
    kind = _layer_kinds.kind(layer)
    if kind is None:
      raise _layer_kinds.not_linear(layer)
    act = _layer_kinds.activation(layer)
    if act is not None:
      if not (last and self.final_activation_ok):
        raise _layer_kinds.not_linear(layer)
      self.activation = act
    if len(node.outputs) != 1:
      raise _report.Unfoldable(
        f"{_graph.describe(layer)} has {len(node.outputs)} outputs: fold needs one tensor per layer"
      )

    def resolve(v):
      return states[v.id] if isinstance(v, _graph.Ref) else v

    operands = [resolve(v) for v in tf.nest.flatten(node.args)] + [
      resolve(v) for v in tf.nest.flatten(node.kwargs) if isinstance(v, _graph.Ref)
    ]
    if kind not in _layers.TAKES_CONSTANTS and not isinstance(operands[0], _affine.Affine):
      raise _report.Unfoldable(
        f"{_graph.describe(layer)}: its first argument is not a graph tensor"
      )
    return _layers.HANDLERS[kind](self, layer, operands)

  # -- the steps the layer handlers build on -------------------------------------------

  def var(self, v):
    """A layer weight in the composing dtype."""
    return tf.cast(self.read(v), self.dtype)

  def padded_err(self, t, pads):
    """(counting) The error of t zero-padded by pads: t's inside, the formula outside."""
    if not any(pads):
      return t.err
    paddings = [[0, 0], [pads[0], pads[1]], [pads[2], pads[3]], [0, 0]]
    outside = tf.pad(tf.zeros_like(t.err[:1, :, :, :1]), paddings, constant_values=1.0)
    return tf.pad(t.err, paddings) + outside * t.formula(self.probe, pads)

  def border(self, t, pads, desc, how):
    """Checks that padding t by pads is exact; else raises, or (exact=False) notes it."""
    issue = t.border_issue(pads, self.in_size)
    if issue is None:
      return
    message = (
      f"{desc} pads its input ({how}), but {issue}: at the border the block is not one convolution"
    )
    if self.exact:
      raise ValueError(
        message + ". fold(block, exact=False) folds it anyway and counts "
        "the output pixels that differ"
      )
    self.reasons.append(message)

  def spatial(self, layer, t, w, groups, strides, padding, bias=None, dilation=(1, 1)):
    """t -> conv(t, w) (+ bias) for a Keras convolution's kernel, strides and padding."""
    desc = _graph.describe(layer)
    if tuple(strides) != (1, 1) and not self.known:
      raise ValueError(
        f"{desc} has strides {tuple(strides)}: a strided fold needs the "
        "block's input height and width (pass input_size=(height, width))"
      )
    w = _kernels.dilate(tf.cast(w, self.dtype), dilation)
    kh, kw = w.shape[:2]
    pads, size = _geometry.geometry(t.size, (kh, kw), strides, padding.upper())
    if t.stride != (1, 1) and (kh > 1 or kw > 1 or any(pads)):
      _affine.check_no_stride_before(t, desc, f"a {kh}x{kw} kernel")
    self.border(t, pads, desc, f"padding='{padding.lower()}'")
    err = None
    if self.count:
      err = _ops.conv2d(self.padded_err(t, pads), w, list(strides), "VALID")
    kernel, g = _kernels.compose_kernels(t.kernel, t.groups, w, groups)
    out_bias = None if t.bias is None else _kernels.bias_through(t.bias, w, groups)
    if bias is not None:
      out_bias = bias if out_bias is None else out_bias + bias
    stride = (t.stride[0] * strides[0], t.stride[1] * strides[1])
    return _affine.Affine(
      kernel=kernel,
      groups=g,
      bias=out_bias,
      offset=(t.offset[0] + pads[0], t.offset[1] + pads[2]),
      size=size,
      stride=stride,
      bias_from=t.bias_from or (desc if bias is not None else None),
      spill_from=desc if (kh > 1 or kw > 1) else t.spill_from,
      stride_from=desc if tuple(strides) != (1, 1) else t.stride_from,
      err=err,
    )

  def scaled(self, layer, t, scale=None, shift=None):
    """t * scale + shift, per channel (scale and shift: tensors, or None)."""
    kernel, bias = t.kernel, t.bias
    if scale is not None:
      kernel = kernel * scale
      bias = None if bias is None else bias * scale
    if shift is not None:
      bias = shift if bias is None else bias + shift
    err = t.err if t.err is None or scale is None else t.err * scale
    return dataclasses.replace(
      t,
      kernel=kernel,
      bias=bias,
      err=err,
      bias_from=t.bias_from or (_graph.describe(layer) if shift is not None else None),
    )

  def combine(self, layer, terms, constant=None):
    """sum of coef * t over terms [(coef, t)] (+ a per-channel constant)."""
    desc = _graph.describe(layer)
    states = [t for _, t in terms]
    first = states[0]
    for t in states[1:]:
      if t.size != first.size or t.stride != first.stride or t.channels != first.channels:
        raise ValueError(f"{desc} adds tensors of different sizes, strides or channels")
    kernels, off = _affine.aligned(states)
    g_all = math.gcd(*[t.groups for t in states]) if len(states) > 1 else first.groups
    kernel = sum(c * _kernels.regroup(k, t.groups, g_all) for (c, t), k in zip(terms, kernels))
    biases = [c * t.bias for c, t in terms if t.bias is not None]
    bias = tf.add_n(biases) if biases else None
    if constant is not None:
      const = tf.constant(constant, self.dtype)
      bias = const if bias is None else bias + const
    bias_from = next((t.bias_from for t in states if t.bias_from), None)
    return _affine.Affine(
      kernel=kernel,
      groups=g_all,
      bias=bias,
      offset=off,
      size=first.size,
      stride=first.stride,
      bias_from=bias_from or (desc if constant is not None else None),
      spill_from=next((t.spill_from for t in states if t.spill_from), None),
      stride_from=first.stride_from,
      err=(tf.add_n([c * t.err for c, t in terms]) if self.count else None),
    )


def read64(variable):
  """A layer weight as a float64 constant (fold and reparameterize compose on these)."""
  return tf.cast(tf.convert_to_tensor(variable), tf.float64)


def compose(block, read, dtype, exact, count=False, final_activation_ok=False):
  """The block output's affine description, and the composer (reasons, activation).

  Args:
    block: a `_graph.Block`.
    read: variable -> tensor, a layer weight as the composition reads it.
    dtype: the dtype to compose in.
    exact: whether a padding that is not exact at the border raises.
    count: whether to count the output pixels that differ (needs a known input size).
    final_activation_ok: whether the last layer may carry a non-linear activation.

  Returns:
    (the output's `_affine.Affine`, the `Composer`).

  Raises:
    ValueError: the block is not one convolution (`_report.Unfoldable` for a layer no fold
      can hold).
  """
  if count and not block.known:
    raise ValueError(
      "exact=False counts the output pixels that differ for one input size, "
      "and the block's input height and width are unknown: pass "
      "input_size=(height, width)"
    )
  composer = Composer(read, dtype, block.size, block.known, exact, count, final_activation_ok)
  state = _affine.identity(block.channels, block.size, dtype)
  if count:
    probe = np.random.default_rng(0).standard_normal((1,) + block.size + (block.channels,))
    composer.probe = tf.constant(probe, tf.float64)
    state.err = tf.zeros_like(composer.probe)
  return composer.run(block, state), composer
