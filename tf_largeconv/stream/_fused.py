"""A Keras convolution's tf.nn.conv2d, BiasAdd and ReLU as one traced function, which
TensorFlow's graph optimizer runs as one kernel: what `_windowed`'s calls run outside a
gradient tape (`conv`), and which layers do (`fuses`)."""

from __future__ import annotations

import functools
from typing import Any

import keras
import tensorflow as tf

from tf_largeconv.stream import _pool


@functools.lru_cache(maxsize=1024)
def conv(
  strides: tuple[int, ...],
  dilations: tuple[int, ...],
  padding: Any,
  relu: bool,
  dtype: tf.DType,
  kernel_shape: tuple[int, ...],
) -> Any:
  """tf.nn.conv2d, BiasAdd and (`relu`) Relu as one function traced once for any batch and
  window size (`padding`: 'SAME', 'VALID' or the NHWC pairs as tuples). TensorFlow's graph
  optimizer runs the three as one fused kernel, which adds the bias and takes the maximum on
  each sum as it is stored: the same values as the three ops one after another (the tests
  hold them equal bit for bit), with one tensor the size of the output instead of three,
  and two passes over it saved (a 3x3 convolution of 3 to 8 channels on 4096^2 with its
  bias and ReLU: 0.069 s traced against 0.160 s eagerly, 2 threads). The function holds no
  weights or model (they are its arguments), so one serves every layer and model of the
  same shape: a first streamed call of the U-Net of `benchmarks/cpu/stream_networks.py`
  (9 tiles) took 4.2 s with this cache against 5.1 s with one per layer's call (3.3 s
  unfused; 2.5 s each later call)."""
  pad = padding if isinstance(padding, str) else [list(pair) for pair in padding]

  def run(x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    y = tf.nn.conv2d(x, kernel, [1, *strides, 1], pad, dilations=list(dilations))
    y = tf.nn.bias_add(y, bias)
    return tf.nn.relu(y) if relu else y

  spec = [
    tf.TensorSpec([None, None, None, kernel_shape[2]], dtype),
    tf.TensorSpec(kernel_shape, dtype),
    tf.TensorSpec([kernel_shape[3]], dtype),
  ]
  return tf.function(run, input_signature=spec)


def fuses(op: Any, conv: Any) -> bool:
  """Whether a Keras convolution's call runs as `conv` outside the tape: tf.nn.conv2d
  in float32 or float64 (a 16-bit fused kernel would round once where the ops round twice)
  with a bias and Keras's own linear or ReLU activation, where TensorFlow's pool serves
  tensors (`_windowed.fused_outside_tape`). Decided once, when the call is made, so that the plan
  (`Sliding.fused`) and the runs agree."""
  return (
    conv is tf.nn.conv2d
    and tf.as_dtype(op.compute_dtype) in (tf.float32, tf.float64)
    and bool(op.use_bias)
    and op.activation in (keras.activations.linear, keras.activations.relu)
    and _pool.pooled()
  )
