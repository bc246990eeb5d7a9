"""The ops: tf.nn's convolution functions on the LargeConv op library.

- `_conv2d`: `conv2d`, `depthwise_conv2d`, `conv2d_backprop_input`,
  `conv2d_backprop_filter`; `_conv1d`: `conv1d`, `plan_conv1d`; `_conv3d`: `conv3d`;
  `_transpose`: `conv2d_transpose`, `plan_transpose`.
- `_dispatch`: which kernel a 2-D call runs, and the eager cache of that choice;
  `_routing`: passes routed to TensorFlow's kernels or the op's.
- `gradients`: the ops' registered gradients (imported here, so they exist with the
  package).
- `portable`: the stock-TF convolution of the portable path; `_portable2d`: the 2-D ops
  on it, with the ops' checks.
"""

from tf_largeconv._args import portable_only
from tf_largeconv.ops import gradients
from tf_largeconv.ops._conv1d import conv1d
from tf_largeconv.ops._conv1d import plan_conv1d
from tf_largeconv.ops._conv2d import conv2d
from tf_largeconv.ops._conv2d import conv2d_backprop_filter
from tf_largeconv.ops._conv2d import conv2d_backprop_input
from tf_largeconv.ops._conv2d import depthwise_conv2d
from tf_largeconv.ops._conv3d import conv3d
from tf_largeconv.ops._transpose import conv2d_transpose
from tf_largeconv.ops._transpose_shapes import plan_transpose

__all__ = [
  "conv1d",
  "conv2d",
  "conv2d_backprop_filter",
  "conv2d_backprop_input",
  "conv2d_transpose",
  "conv3d",
  "depthwise_conv2d",
  "gradients",
  "plan_conv1d",
  "plan_transpose",
  "portable_only",
]
