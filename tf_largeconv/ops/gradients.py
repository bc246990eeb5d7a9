"""Gradient functions of the LargeConv ops, registered with TensorFlow on import.

They mirror TF's _Conv2DGrad / _Conv3DGrad and their backprop-op gradients, so that
second-order derivatives work. The package imports this module, so the gradients exist as
soon as `tf_largeconv` is imported, also for ops in a loaded SavedModel that no Python API
call created.
"""

import tensorflow as tf

from tf_largeconv import _loader
from tf_largeconv._problem import ConvProblem
from tf_largeconv.ops import _routing
from tf_largeconv.ops import _transpose

# The attributes each op family's ops share (a ConvProblem's), passed on unchanged to the
# gradient's ops.
_CONV2D_ATTRS = tuple(ConvProblem.conv2d(1, "SAME").attrs())
_CONV3D_ATTRS = tuple(ConvProblem.conv3d([1] * 5, "SAME").attrs())


def _decode(attrs):
  """An op's attributes with its strings (bytes from get_attr) as str."""
  return {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}


def _register_family(op_name, wrapper, attr_names):
  """Registers the gradients of LargeConv>{op_name} and its two backprop ops, whose Python
  wrappers are large_conv_{wrapper}, large_conv_{wrapper}_backprop_input and
  large_conv_{wrapper}_backprop_filter."""

  def attrs_of(op):
    return _decode({k: op.get_attr(k) for k in attr_names})

  def run(suffix, *args, op):
    return getattr(_loader.ops(), f"large_conv_{wrapper}{suffix}")(*args, **attrs_of(op))

  @tf.RegisterGradient(f"LargeConv>{op_name}")
  def _forward_grad(op, grad):
    shape_0, shape_1 = tf.shape_n([op.inputs[0], op.inputs[1]])
    return [
      run("_backprop_input", shape_0, op.inputs[1], grad, op=op),
      run("_backprop_filter", op.inputs[0], shape_1, grad, op=op),
    ]

  @tf.RegisterGradient(f"LargeConv>{op_name}BackpropInput")
  def _backprop_input_grad(op, grad):
    return [
      None,
      run("_backprop_filter", grad, tf.shape(op.inputs[1]), op.inputs[2], op=op),
      run("", grad, op.inputs[1], op=op),
    ]

  @tf.RegisterGradient(f"LargeConv>{op_name}BackpropFilter")
  def _backprop_filter_grad(op, grad):
    return [
      run("_backprop_input", tf.shape(op.inputs[0]), grad, op.inputs[2], op=op),
      None,
      run("", op.inputs[0], grad, op=op),
    ]


_register_family("Conv2D", "conv2d", _CONV2D_ATTRS)
_register_family("Conv3D", "conv3d", _CONV3D_ATTRS)


@tf.RegisterGradient("LargeConv>Conv2DRoute")
def _route_grad(op, grad):
  """The input's and filter's gradients by the kernels the op's route names (of conv2d, or
  of conv2d_transpose); none for its first input, the convolution's output, so that the
  kernel which computed it takes no part in the gradient."""
  problem, routes, transposed = _routing.parse_route(op.get_attr("route"))
  module = _transpose if transposed else _routing
  _, x, w = op.inputs
  return [
    None,
    module.routed_input_gradient(x, w, grad, routes, problem),
    module.routed_filter_gradient(x, w, grad, routes, problem),
  ]
