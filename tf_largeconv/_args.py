"""The pieces of argument cleaning and the dtype lists: `ConvProblem`'s constructors
(`_problem.py`, the one cleaning path) clean each argument with these, so every entry
point raises the same errors; the algorithm's resolution under the current context and the
operands' conversion and dtype checks are here too.
"""

from __future__ import annotations

import collections.abc
import contextlib
import numbers
import threading
from collections.abc import Iterator
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_largeconv import _loader

# The dtypes the LargeConv ops are registered for, in the order error messages list them:
# the C++ list (cc/core/common/dtypes.h) that every kernel and registration is expanded from.
# Its integer types are summed exactly, by the direct kernels only.
DTYPES = tuple(tf.as_dtype(name) for name in _loader.core().DTYPES)
# The floating ones: what tf.nn.depthwise_conv2d takes, and what the FFT computes.
FLOAT_DTYPES = tuple(d for d in DTYPES if d.is_floating)


def _names(dtypes):
  return ", ".join(d.name for d in dtypes[:-1]) + " or " + dtypes[-1].name


# 'auto', 'direct', 'fft', 'tf': the C++ vocabulary's list (cc/core/common/vocabulary.h), what the
# ops take as their `algorithm` attribute.
OP_ALGORITHMS = tuple(_loader.core().ALGORITHMS)
# 'portable' is routed in Python (stock TF ops, `ops.portable`) and never reaches the ops.
PORTABLE = "portable"
ALGORITHMS = OP_ALGORITHMS + (PORTABLE,)


def in_xla_context():
  """True while tracing inside XLA compilation (tf.function(jit_compile=True), Keras with
  jit_compile=True), where the LargeConv ops cannot run: XLA compiles no custom ops."""
  return tf.__internal__.get_enclosing_xla_context() is not None


# Set by `portable_only()`: this thread's calls take the portable path whatever algorithm
# they name.
_FORCED = threading.local()


@contextlib.contextmanager
def portable_only() -> Iterator[None]:
  """Within this context every public op called from this thread runs algorithm='portable'.

  For tracing a graph that must hold no LargeConv op (`tf_largeconv.keras.export_portable`)
  without changing the layers or functions that name another algorithm. Ops traced or run
  before or after the context are unaffected; the previous state is restored on exit.
  """
  before = getattr(_FORCED, "on", False)
  _FORCED.on = True
  try:
    yield
  finally:
    _FORCED.on = before


def forced_portable():
  """True inside `portable_only()` on this thread."""
  return getattr(_FORCED, "on", False)


def compiles_under_xla(algorithm):
  """Whether a call with this algorithm compiles under XLA (a Keras layer's supports_jit):
  'auto' and 'portable' run the portable path there and 'tf' TensorFlow's convolution;
  'direct' and 'fft' need the op, which XLA cannot compile."""
  return algorithm not in ("direct", "fft")


def resolve_algorithm(algorithm):
  """The algorithm a call runs under the current context: 'portable' inside
  `portable_only()`, whatever was asked; under XLA compilation, or when the op library
  could not be loaded, 'auto' becomes 'portable' and 'direct' and 'fft' raise ValueError."""
  if forced_portable():
    return PORTABLE
  if _loader.failure() is not None:
    if algorithm in ("direct", "fft"):
      raise ValueError(
        f"algorithm={algorithm!r} needs the LargeConv op library, which could not be "
        f"loaded ({_loader.failure()}); use algorithm='auto' or 'portable'"
      )
    return PORTABLE if algorithm == "auto" else algorithm
  if not in_xla_context():
    return algorithm
  if algorithm in ("auto", PORTABLE):
    return PORTABLE
  if algorithm in ("direct", "fft"):
    raise ValueError(
      f"algorithm={algorithm!r} needs the LargeConv op library, and XLA (jit_compile=True) "
      "cannot compile custom ops; use algorithm='auto' or 'portable' under XLA"
    )
  return algorithm


def channel_index(data_format):
  """The position of the depth dimension in a 4-D tensor of this (normalised) layout."""
  return 1 if data_format == "NCHW" else 3


def channel_axis_from_end(data_format):
  """The depth dimension's position counted from the end (negative), which holds for
  inputs with extra leading batch dimensions too (batch_shape + [H, W, C] or + [C, H, W])."""
  return channel_index(data_format) - 4


def normalize_data_format(data_format):
  """Returns 'NHWC' or 'NCHW'; None means NHWC, as in tf.nn.conv2d."""
  if data_format is None:
    return "NHWC"
  if not isinstance(data_format, str) or data_format.upper() not in ("NHWC", "NCHW"):
    raise ValueError(f"data_format must be 'NHWC' or 'NCHW', got data_format={data_format!r}")
  return data_format.upper()


def window_values(value, name, lengths):
  """strides/dilations given as an int or a list of ints, as a list of ints (`lengths`
  names the list lengths the caller takes, for the message)."""
  if isinstance(value, numbers.Integral):
    values = [value]
  elif isinstance(value, collections.abc.Sized) and not isinstance(value, (str, bytes)):
    values = list(value)
  else:
    raise ValueError(f"{name} must be an int or a list of {lengths} ints, got {name}={value!r}")
  for v in values:
    if not isinstance(v, numbers.Integral) or isinstance(v, bool):
      raise ValueError(f"{name} must contain only ints, got {name}={value!r}")
  return [int(v) for v in values]


def normalize_window(value, name, data_format):
  """Expands strides/dilations given as an int or a list of 1, 2 or 4 ints to 4 ints.

  Mirrors tf.nn.conv2d: a length-4 list is taken in data_format order as is; 1 or 2 values
  are the spatial ones.
  """
  if value is None:
    return [1, 1, 1, 1]
  values = window_values(value, name, "1, 2 or 4")
  if len(values) == 4:
    return values
  if len(values) == 1:
    values = values * 2
  elif len(values) != 2:
    # tf.nn.conv2d's own words.
    raise ValueError(
      f"{name} should be of length 1, 2 or 4. Received: {name}={values} of length {len(values)}"
    )
  if channel_index(data_format) == 1:
    return [1, 1] + values
  return [1] + values + [1]


def normalize_padding(padding):
  """Returns (padding string, explicit_paddings) as the op takes them.

  `padding` is 'SAME' or 'VALID' (any case), or a list of four [before, after] pairs in
  data_format order (explicit padding), as in tf.nn.conv2d.
  """
  # The messages of malformed padding are tf.nn.conv2d's own.
  if isinstance(padding, str):
    upper = padding.upper()
    if upper in ("SAME", "VALID"):
      return upper, []
    if upper == "EXPLICIT":
      raise ValueError(
        "'EXPLICIT' is not a valid value for `padding`. To use explicit "
        "padding, `padding` must be a list."
      )
    raise ValueError(
      f"padding must be 'SAME', 'VALID' or a list of four [before, after] pairs, "
      f"got padding={padding!r}"
    )
  if isinstance(padding, (list, tuple)):
    flat = []
    for i, pair in enumerate(padding):
      if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        what = (
          f"of size {len(pair)}" if isinstance(pair, (list, tuple)) else f"of type {type(pair)}"
        )
        raise ValueError(
          "When `padding` is a list, each element of `padding` must be a "
          f"list/tuple of size 2. Received: padding={padding} with element at "
          f"index {i} {what}"
        )
      for p in pair:
        if not isinstance(p, numbers.Integral) or isinstance(p, bool):
          raise ValueError(f"padding must contain only ints, got padding={padding!r}")
        flat.append(int(p))
    if len(padding) != 4:
      raise ValueError(
        f"When padding is a list, it must be of size 4. Received: "
        f"padding={padding} of size {len(padding)}"
      )
    return "EXPLICIT", flat
  raise ValueError(
    f"padding must be 'SAME', 'VALID' or a list of four [before, after] pairs, got "
    f"padding={padding!r}"
  )


def normalize_algorithm(algorithm):
  """Returns 'auto', 'direct', 'fft', 'tf' or 'portable'; None means 'auto'."""
  if algorithm is None:
    return "auto"
  if not isinstance(algorithm, str) or algorithm.lower() not in ALGORITHMS:
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got algorithm={algorithm!r}")
  return algorithm.lower()


def normalize_workspace_limit(workspace_limit):
  """Returns the limit in bytes as the op takes it (-1: the default, 64 MiB)."""
  if workspace_limit is None:
    return -1
  if (
    not isinstance(workspace_limit, numbers.Integral)
    or isinstance(workspace_limit, bool)
    or workspace_limit < 0
  ):
    raise ValueError(
      "workspace_limit must be None or a non-negative number of bytes, got "
      f"workspace_limit={workspace_limit!r}"
    )
  return int(workspace_limit)


def normalize_keep_memory(keep_memory):
  """Returns keep_memory as the op takes it: a bool (numpy's too)."""
  if not isinstance(keep_memory, (bool, np.bool_)):
    raise ValueError(f"keep_memory must be True or False, got keep_memory={keep_memory!r}")
  return bool(keep_memory)


def normalize_dtype(dtype):
  """Returns `dtype` as a tf.DType, if the ops support it.

  Raises:
    ValueError: a dtype outside `DTYPES`.
  """
  dtype = tf.as_dtype(dtype)
  if dtype not in DTYPES:
    raise ValueError(f"dtype must be {_names(DTYPES)}, got {dtype.name}")
  return dtype


def check_dtype(name, dtype, allowed=DTYPES):
  """Raises TypeError naming `name` unless `dtype` is in `allowed`, followed by TensorFlow's
  own message for an op input of a dtype outside its list."""
  if dtype not in allowed:
    raise TypeError(
      f"{name} must have dtype {_names(allowed)}, got {dtype.name}. Value passed to "
      f"parameter '{name}' has DataType {dtype.name} not in list of allowed values: "
      f"{', '.join(d.name for d in allowed)}"
    )


def check_algorithm(algorithm, dtype):
  """Raises ValueError where `algorithm` cannot compute `dtype`: integers are summed
  exactly, which only the direct kernels do."""
  if algorithm in ("fft", PORTABLE) and dtype.is_integer:
    raise ValueError(
      f"algorithm={algorithm!r} cannot compute {dtype.name} exactly: integer "
      "convolutions run the direct kernels; use algorithm='direct' or 'auto'"
    )


def as_tensors(input, filters):
  """Converts an op's two data operands to tensors of one supported dtype.

  `filters` takes input's dtype unless it already is a tensor or variable, whose dtype must
  then match.

  Raises:
    TypeError: input's dtype is not in `DTYPES`, or filters' differs from it.
  """
  if not isinstance(input, tf.Tensor):  # a tensor is taken as it is (a small call's cost)
    input = tf.convert_to_tensor(input, name="input")
  dtype = input.dtype
  if isinstance(filters, tf.Variable):
    filters = tf.convert_to_tensor(filters, name="filters")
  elif not isinstance(filters, tf.Tensor):
    filters = tf.convert_to_tensor(filters, dtype=dtype, name="filters")
  check_dtype("input", dtype)
  if filters.dtype != dtype:
    raise TypeError(
      f"filters must have the same dtype as input ({dtype.name}), got {filters.dtype.name}"
    )
  return input, filters


# The 3-D convolution (tf.nn.conv3d): its layouts and paddings, and its op attributes.

DATA_FORMATS_3D = ("NDHWC", "NCDHW")
PADDINGS_3D = ("SAME", "VALID")


def window3d(value, name):
  """strides or dilations as tf.nn.conv3d takes them: a list of 5 ints in data_format
  order (None: all ones, for dilations)."""
  if value is None:
    return [1] * 5
  values = window_values(value, name, "5")
  if len(values) != 5:
    raise ValueError(
      f"{name} must have 5 entries (one per dimension of input), got {name}={value!r}"
    )
  return values


# conv1d's arguments, as those of the conv2d of height 1 it runs as.

# conv1d: its layouts and the 2-D layouts it runs as (TF's conv1d also takes the 2-D names).
FORMATS_1D = {"NWC": "NHWC", "NCW": "NCHW", "NHWC": "NHWC", "NCHW": "NCHW"}


def _insert_height(values: Sequence[Any], format_2d: str, height_value: Any) -> list[Any]:
  """3 entries in a 1-D layout's order (N, W, C or N, C, W) as the 4 of the 2-D layout."""
  if format_2d == "NHWC":
    return [values[0], height_value, values[1], values[2]]
  return [values[0], values[1], height_value, values[2]]


def window_1d(value: Any, name: str, format_2d: str) -> list[int]:
  """conv1d's `stride` or `dilations` (an int, or 1 or 3 ints) as conv2d's 4 ints."""
  values = window_values(1 if value is None else value, name, "1 or 3")
  if len(values) == 1:
    values = [1, values[0], 1] if format_2d == "NHWC" else [1, 1, values[0]]
  elif len(values) != 3:
    raise ValueError(
      f"{name} should be of length 1 or 3. Received: {name}={values} of length {len(values)}"
    )
  return _insert_height(values, format_2d, 1)


def padding_1d(padding: Any, format_2d: str) -> Any:
  """conv1d's padding: strings as they are, explicit padding (one pair for the width, or
  three in data_format order) as conv2d's four pairs."""
  if not isinstance(padding, (list, tuple)):
    return padding  # strings (and malformed values) are checked as conv2d's
  pairs = list(padding)
  if len(pairs) == 1:
    pairs = [[0, 0], pairs[0], [0, 0]] if format_2d == "NHWC" else [[0, 0], [0, 0], pairs[0]]
  elif len(pairs) != 3:
    raise ValueError(
      "padding must be 'SAME', 'VALID', one [before, after] pair for the width or three "
      f"pairs in data_format order, got padding={padding!r}"
    )
  return _insert_height(pairs, format_2d, [0, 0])


def grouped_filter(filters, depth):
  """A depthwise filter [h, w, in_channels, multiplier] (numpy array or
  tensor) as the grouped conv2d's [h, w, 1, in_channels * multiplier], after checking
  its rank and (where `depth`, the input's channels, is known) its in_channels."""
  if isinstance(filters, (tf.Tensor, tf.Variable)) and filters.shape.rank is None:
    s = tf.shape(filters)
    return tf.reshape(filters, tf.stack([s[0], s[1], 1, s[2] * s[3]]))
  shape = list(filters.shape)
  if len(shape) != 4:
    raise ValueError(
      "filter must be 4-D [height, width, in_channels, channel_multiplier], got shape "
      f"{tuple(shape)}"
    )
  if depth is not None and shape[2] is not None and shape[2] != depth:
    raise ValueError(
      f"filter in_channels (dimension 2) {shape[2]} must equal the input depth {depth}"
    )
  if isinstance(filters, (tf.Tensor, tf.Variable)):
    if None in shape:
      s = tf.shape(filters)
      return tf.reshape(filters, tf.stack([s[0], s[1], 1, s[2] * s[3]]))
    return tf.reshape(filters, [shape[0], shape[1], 1, shape[2] * shape[3]])
  return filters.reshape(shape[0], shape[1], 1, shape[2] * shape[3])


def window_2d(strides, padding, data_format="NHWC", dilations=None):
  """tf.nn.conv2d's strides, padding, data_format and dilations, cleaned, as a 2-D
  ConvProblem holds them: (strides, padding, explicit paddings, data_format, dilations)."""
  data_format = normalize_data_format(data_format)
  padding, explicit = normalize_padding(padding)
  strides = tuple(normalize_window(strides, "strides", data_format))
  dilations = tuple(normalize_window(dilations, "dilations", data_format))
  return strides, padding, tuple(explicit), data_format, dilations


def window_3d(strides, padding, data_format="NDHWC", dilations=None):
  """tf.nn.conv3d's strides, padding, data_format and dilations, cleaned, as a 3-D
  ConvProblem holds them (no explicit paddings)."""
  if data_format not in DATA_FORMATS_3D:
    raise ValueError(f"data_format must be 'NDHWC' or 'NCDHW', got data_format={data_format!r}")
  if padding not in PADDINGS_3D:
    raise ValueError(
      "padding must be 'SAME' or 'VALID' (tf.nn.conv3d has no explicit "
      f"padding), got padding={padding!r}"
    )
  strides, dilations = window3d(strides, "strides"), window3d(dilations, "dilations")
  return tuple(strides), padding, (), data_format, tuple(dilations)
