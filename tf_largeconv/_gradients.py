"""Gradient functions of the LargeConv ops, registered with TensorFlow on import.

They mirror TF's _Conv2DGrad and its backprop-op gradients, so that second-order
derivatives work. The package imports this module, so the gradients exist as soon as
`tf_largeconv` is imported, also for ops in a loaded SavedModel that no Python API call
created.
"""

import tensorflow as tf

from tf_largeconv import _loader


def _attrs_of(op):
  return {k: op.get_attr(k) for k in ("strides", "padding", "explicit_paddings",
                                      "data_format", "dilations", "algorithm",
                                      "workspace_limit")}


def _decode(attrs):
  out = dict(attrs)
  for k in ("padding", "data_format", "algorithm"):
    if isinstance(out[k], bytes):
      out[k] = out[k].decode()
  return out


@tf.RegisterGradient("LargeConv>Conv2D")
def _conv2d_grad(op, grad):
  attrs = _decode(_attrs_of(op))
  ops = _loader.ops()
  shape_0, shape_1 = tf.shape_n([op.inputs[0], op.inputs[1]])
  return [
      ops.large_conv_conv2d_backprop_input(shape_0, op.inputs[1], grad, **attrs),
      ops.large_conv_conv2d_backprop_filter(op.inputs[0], shape_1, grad, **attrs),
  ]


@tf.RegisterGradient("LargeConv>Conv2DBackpropInput")
def _conv2d_backprop_input_grad(op, grad):
  attrs = _decode(_attrs_of(op))
  ops = _loader.ops()
  return [
      None,
      ops.large_conv_conv2d_backprop_filter(grad, tf.shape(op.inputs[1]), op.inputs[2],
                                            **attrs),
      ops.large_conv_conv2d(grad, op.inputs[1], **attrs),
  ]


@tf.RegisterGradient("LargeConv>Conv2DBackpropFilter")
def _conv2d_backprop_filter_grad(op, grad):
  attrs = _decode(_attrs_of(op))
  ops = _loader.ops()
  return [
      ops.large_conv_conv2d_backprop_input(tf.shape(op.inputs[0]), grad, op.inputs[2],
                                           **attrs),
      None,
      ops.large_conv_conv2d(op.inputs[0], grad, **attrs),
  ]
