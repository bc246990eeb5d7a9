"""tf_largeconv: memory-lean, fast 1-D, 2-D and 3-D convolution with large filters for TensorFlow.

`tf_largeconv.conv2d` is a drop-in for `tf.nn.conv2d`, `tf_largeconv.conv1d` for
`tf.nn.conv1d`, `tf_largeconv.conv3d` for `tf.nn.conv3d`. Importing this package registers
the LargeConv ops, so import it before loading a SavedModel or .keras file that uses them.
"""

from tf_largeconv import _loader
from tf_largeconv._info import VERSION
from tf_largeconv._info import info
from tf_largeconv.ops import conv1d
from tf_largeconv.ops import conv2d
from tf_largeconv.ops import conv2d_backprop_filter
from tf_largeconv.ops import conv2d_backprop_input
from tf_largeconv.ops import conv2d_transpose
from tf_largeconv.ops import conv3d
from tf_largeconv.ops import depthwise_conv2d
from tf_largeconv.ops import plan_conv1d
from tf_largeconv.ops import plan_transpose
from tf_largeconv.planning import Plan
from tf_largeconv.planning import plan
from tf_largeconv.planning import plan_conv3d

__version__ = VERSION

# Load at import: it registers the op kernels (needed before deserialising graphs). A
# library that cannot be loaded is reported once, with the reason, and the ops then run the
# portable path (stock TensorFlow ops) instead of failing.
_loader.load_or_fall_back()

# Registers the Keras layers as serializable, so saved models load after this import.
try:
  from tf_largeconv import keras
except ImportError:  # Keras 3 not installed: the ops still work
  keras = None  # type: ignore[assignment]


def __getattr__(name: str) -> object:
  """`tf_largeconv.memory`, imported on first use (it needs Keras)."""
  if name == "memory":
    import importlib

    return importlib.import_module("tf_largeconv.memory")
  raise AttributeError(f"module 'tf_largeconv' has no attribute {name!r}")


__all__ = [
  "Plan",
  "__version__",
  "conv1d",
  "conv2d",
  "conv2d_backprop_filter",
  "conv2d_backprop_input",
  "conv2d_transpose",
  "conv3d",
  "depthwise_conv2d",
  "info",
  "plan",
  "plan_conv1d",
  "plan_conv3d",
  "plan_transpose",
]
