"""The type aliases of the public API's annotations, defined once.

Annotations only: the modules that use them import `annotations` from `__future__`, so no
annotation is evaluated when a function is called. To a type checker without TensorFlow's
stubs the TensorFlow types are `Any`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tensorflow as tf

# A tensor operand: a tensor or variable, or what tf.convert_to_tensor takes (a numpy array,
# nested lists of numbers, a number).
TensorLike = tf.Tensor | tf.Variable | np.ndarray | Sequence | float | int

# A shape given in full: a list or tuple of ints, a numpy array or a tf.TensorShape.
ShapeLike = Sequence[int] | np.ndarray | tf.TensorShape

# strides or dilations: one int for every spatial dimension, or a list of them.
Window = int | Sequence[int]

# 'SAME', 'VALID', or explicit padding: one [before, after] pair per dimension.
Padding = str | Sequence[Sequence[int]]

# conv1d's padding: 'SAME', 'VALID', one [before, after] pair for the width, or three pairs.
Padding1d = str | Sequence[int] | Sequence[Sequence[int]]

# A dtype as tf.as_dtype takes it: tf.float32, np.float32, "float32", ...
DTypeLike = tf.DType | np.dtype | type | str
