"""Python API of the LargeConv op family: tf.nn.conv2d's signature, and its gradients."""

import collections.abc
import functools
import numbers

import tensorflow as tf

from tf_largeconv import _loader


def _channel_index(data_format):
  return 1 if data_format == "NCHW" else 3


def normalize_data_format(data_format):
  """Returns 'NHWC' or 'NCHW'; None means NHWC, as in tf.nn.conv2d."""
  if data_format is None:
    return "NHWC"
  if not isinstance(data_format, str) or data_format.upper() not in ("NHWC", "NCHW"):
    raise ValueError(
        f"data_format must be 'NHWC' or 'NCHW', got data_format={data_format!r}")
  return data_format.upper()


def normalize_window(value, name, data_format):
  """Expands strides/dilations given as an int or a list of 1, 2 or 4 ints to 4 ints.

  Mirrors tf.nn.conv2d: a length-4 list is taken in data_format order as is; 1 or 2 values
  are the spatial ones.
  """
  if value is None:
    return [1, 1, 1, 1]
  if isinstance(value, numbers.Integral):
    values = [value]
  elif isinstance(value, collections.abc.Sized) and not isinstance(value, (str, bytes)):
    values = list(value)
  else:
    raise ValueError(
        f"{name} must be an int or a list of 1, 2 or 4 ints, got {name}={value!r}")
  for v in values:
    if not isinstance(v, numbers.Integral) or isinstance(v, bool):
      raise ValueError(f"{name} must contain only ints, got {name}={value!r}")
  values = [int(v) for v in values]
  if len(values) == 4:
    return values
  if len(values) == 1:
    values = values * 2
  elif len(values) != 2:
    raise ValueError(
        f"{name} must have length 1, 2 or 4, got {name}={value!r} of length {len(values)}")
  if _channel_index(data_format) == 1:
    return [1, 1] + values
  return [1] + values + [1]


def normalize_padding(padding):
  """Returns (padding string, explicit_paddings) as the op takes them.

  `padding` is 'SAME' or 'VALID' (any case), or a list of four [before, after] pairs in
  data_format order (explicit padding), as in tf.nn.conv2d.
  """
  if isinstance(padding, str):
    upper = padding.upper()
    if upper in ("SAME", "VALID"):
      return upper, []
    if upper == "EXPLICIT":
      raise ValueError("padding='EXPLICIT' is not accepted directly: pass padding as a list "
                       "of four [before, after] pairs instead")
    raise ValueError(
        f"padding must be 'SAME', 'VALID' or a list of four [before, after] pairs, "
        f"got padding={padding!r}")
  if isinstance(padding, (list, tuple)):
    if len(padding) != 4:
      raise ValueError(
          f"padding as a list must have 4 [before, after] pairs (one per dimension), got "
          f"padding={padding!r} of length {len(padding)}")
    flat = []
    for pair in padding:
      if not isinstance(pair, (list, tuple)) or len(pair) != 2:
        raise ValueError(
            f"each entry of padding must be a [before, after] pair, got padding={padding!r}")
      for p in pair:
        if not isinstance(p, numbers.Integral) or isinstance(p, bool):
          raise ValueError(f"padding must contain only ints, got padding={padding!r}")
        flat.append(int(p))
    return "EXPLICIT", flat
  raise ValueError(
      f"padding must be 'SAME', 'VALID' or a list of four [before, after] pairs, got "
      f"padding={padding!r}")


ALGORITHMS = ("auto", "direct", "fft", "tf")


def normalize_algorithm(algorithm):
  """Returns 'auto', 'direct', 'fft' or 'tf'; None means 'auto'."""
  if algorithm is None:
    return "auto"
  if not isinstance(algorithm, str) or algorithm.lower() not in ALGORITHMS:
    raise ValueError(f"algorithm must be one of {ALGORITHMS}, got algorithm={algorithm!r}")
  return algorithm.lower()


def normalize_workspace_limit(workspace_limit):
  """Returns the limit in bytes as the op takes it (-1: the default, 64 MiB)."""
  if workspace_limit is None:
    return -1
  if (not isinstance(workspace_limit, numbers.Integral) or isinstance(workspace_limit, bool)
      or workspace_limit < 0):
    raise ValueError("workspace_limit must be None or a non-negative number of bytes, got "
                     f"workspace_limit={workspace_limit!r}")
  return int(workspace_limit)


def conv_attrs(strides, padding, data_format, dilations, algorithm="auto",
               workspace_limit=None):
  """The op attributes for tf.nn.conv2d-style arguments (validated for form only)."""
  data_format = normalize_data_format(data_format)
  padding, explicit_paddings = normalize_padding(padding)
  return dict(
      strides=normalize_window(strides, "strides", data_format),
      padding=padding,
      explicit_paddings=explicit_paddings,
      data_format=data_format,
      dilations=normalize_window(dilations, "dilations", data_format),
      algorithm=normalize_algorithm(algorithm),
      workspace_limit=normalize_workspace_limit(workspace_limit),
  )


_DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)


def _as_tensors(input, filters):  # pylint: disable=redefined-builtin
  input = tf.convert_to_tensor(input, name="input")
  dtype = input.dtype
  if isinstance(filters, tf.Tensor) or isinstance(filters, tf.Variable):
    filters = tf.convert_to_tensor(filters, name="filters")
  else:
    filters = tf.convert_to_tensor(filters, dtype=dtype, name="filters")
  if dtype not in _DTYPES:
    raise TypeError(f"input must have dtype float16, bfloat16, float32 or float64, got "
                    f"{dtype.name}")
  if filters.dtype != dtype:
    raise TypeError(f"filters must have the same dtype as input ({dtype.name}), got "
                    f"{filters.dtype.name}")
  return input, filters


def conv2d(input, filters, strides, padding, data_format="NHWC", dilations=None,  # pylint: disable=redefined-builtin
           name=None, algorithm="auto", workspace_limit=None):
  """Computes a 2-D convolution with tf.nn.conv2d's semantics, lean for large filters.

  Same arguments and result as `tf.nn.conv2d`. Unlike TF's CPU kernels, NCHW and dilated
  gradients work on the CPU too, and a grouped convolution is computed when the filter's
  in-depth divides the input depth.

  Args:
    input: 4-D tensor of dtype float16, bfloat16, float32 or float64, in data_format order.
    filters: tensor of the same dtype, shape [height, width, in_channels / groups,
      out_channels].
    strides: int or list of 1, 2 or 4 ints: the window stride (4 ints in data_format order,
      batch and depth entries 1).
    padding: 'SAME', 'VALID', or a list of four [before, after] pairs in data_format order
      (explicit padding; batch and depth pairs [0, 0]).
    data_format: 'NHWC' (default) or 'NCHW'.
    dilations: int or list of 1, 2 or 4 ints: the filter dilation; default 1.
    name: optional name for the operation.
    algorithm: 'auto' (the planner's choice per pass), 'direct' or 'fft'. Gradients use
      the same setting.
    workspace_limit: hard bound in bytes on the temporary memory of each pass (forward and
      both gradients); None means 64 MiB. See `tf_largeconv.plan`.

  Returns:
    A tensor of input's dtype, [batch, out_height, out_width, out_channels] for NHWC.

  Raises:
    ValueError: malformed strides, dilations, padding, data_format, algorithm or
      workspace_limit, or (while tracing a graph) shapes that do not fit together.
    TypeError: unsupported or mismatched dtypes.
    tf.errors.InvalidArgumentError: shapes that do not fit together (eager execution).
  """
  attrs = conv_attrs(strides, padding, data_format, dilations, algorithm, workspace_limit)
  with tf.name_scope(name or "LargeConv2D"):
    input, filters = _as_tensors(input, filters)
    if attrs["algorithm"] in ("auto", "tf") and _use_tf_kernel(input, filters, attrs):
      def tf_kernel():
        return tf.nn.conv2d(input, filters, strides, padding,
                            data_format=attrs["data_format"], dilations=dilations)

      def ours():
        return _loader.ops().large_conv_conv2d(input, filters,
                                               **dict(attrs, algorithm="auto"))

      # TF's oneDNN kernel returns a wrongly shaped tensor for an empty batch.
      batch = input.shape[0]
      if batch is None:
        return tf.cond(tf.shape(input)[0] > 0, tf_kernel, ours)
      return tf_kernel() if batch > 0 else ours()
    if attrs["algorithm"] == "tf":
      raise ValueError("algorithm='tf' needs what TensorFlow's CPU kernels support: NHWC, "
                       "dilations 1, no groups, float32/float64 and static image shapes")
    return _loader.ops().large_conv_conv2d(input, filters, **attrs)


def depthwise_conv2d(input, filter, strides, padding, data_format=None, dilations=None,  # pylint: disable=redefined-builtin
                     name=None, algorithm="auto", workspace_limit=None):
  """Depthwise 2-D convolution with tf.nn.depthwise_conv2d's semantics.

  Each input channel c is convolved with its own `channel_multiplier` filters; output
  channel c * channel_multiplier + m comes from filter[:, :, c, m]. Unlike
  tf.nn.depthwise_conv2d this also supports unequal strides, and strides together with
  dilations (which TF computes wrongly, with a warning), on the CPU in NHWC and NCHW.
  It is the grouped convolution with one group per input channel.

  Args:
    input: 4-D tensor in data_format order, float16/bfloat16/float32/float64.
    filter: tensor of the same dtype, [height, width, in_channels, channel_multiplier].
    strides: int or list of 1, 2 or 4 ints (4 in data_format order).
    padding: 'SAME', 'VALID', or four [before, after] pairs in data_format order.
    data_format: 'NHWC' (default when None) or 'NCHW'.
    dilations: int or list of 1, 2 (TF's `rate`) or 4 ints; default 1.
    name: optional name for the operation.
    algorithm, workspace_limit: as for `conv2d`.

  Returns:
    A tensor with in_channels * channel_multiplier output channels.

  Raises:
    ValueError: malformed arguments, or a filter whose in_channels differs from the input's
      depth (or whose rank is not 4).
    tf.errors.InvalidArgumentError: the same mismatch found only at run time.
  """
  data_format = normalize_data_format(data_format)
  with tf.name_scope(name or "LargeDepthwiseConv2D"):
    input, filter = _as_tensors(input, filter)
    if filter.shape.rank is not None and filter.shape.rank != 4:
      raise ValueError("filter must be 4-D [height, width, in_channels, channel_multiplier], "
                       f"got shape {filter.shape}")
    if input.shape.rank is not None and input.shape.rank != 4:
      raise ValueError(f"input must be a 4-D tensor, got shape {input.shape}")
    depth = input.shape[_channel_index(data_format)]
    if depth is not None and filter.shape[2] is not None and depth != filter.shape[2]:
      raise ValueError(f"filter in_channels (dimension 2) {filter.shape[2]} must equal the "
                       f"input depth {depth}")
    shape = tf.shape(filter)
    checks = []
    if depth is None or filter.shape[2] is None:
      checks.append(tf.debugging.assert_equal(
          tf.shape(input)[_channel_index(data_format)], shape[2],
          message="filter in_channels (dimension 2) must equal the input depth"))
    with tf.control_dependencies(checks):
      static = filter.shape.as_list()
      if all(v is not None for v in static):
        grouped = tf.reshape(filter, [static[0], static[1], 1, static[2] * static[3]])
      else:
        grouped = tf.reshape(filter, tf.stack([shape[0], shape[1], 1, shape[2] * shape[3]]))
    return conv2d(input, grouped, strides, padding, data_format=data_format,
                  dilations=dilations, algorithm=algorithm, workspace_limit=workspace_limit)


def conv2d_backprop_input(input_sizes, filters, out_backprop, strides, padding,
                          data_format="NHWC", dilations=None, name=None, algorithm="auto",
                          workspace_limit=None):
  """Gradient of `conv2d` with respect to its input (cf. tf.nn.conv2d_backprop_input).

  Args:
    input_sizes: int32 vector of 4: the shape of the convolution's input.
    filters: the convolution's filter.
    out_backprop: gradient with respect to the convolution's output.
    strides, padding, data_format, dilations, algorithm, workspace_limit: as for `conv2d`.
    name: optional name for the operation.

  Returns:
    Gradient with respect to the input, shaped `input_sizes`.
  """
  attrs = conv_attrs(strides, padding, data_format, dilations, algorithm, workspace_limit)
  with tf.name_scope(name or "LargeConv2DBackpropInput"):
    out_backprop, filters = _as_tensors(out_backprop, filters)
    input_sizes = tf.convert_to_tensor(input_sizes, dtype=tf.int32, name="input_sizes")
    return _loader.ops().large_conv_conv2d_backprop_input(input_sizes, filters, out_backprop,
                                                          **attrs)


def conv2d_backprop_filter(input, filter_sizes, out_backprop, strides, padding,  # pylint: disable=redefined-builtin
                           data_format="NHWC", dilations=None, name=None, algorithm="auto",
                           workspace_limit=None):
  """Gradient of `conv2d` with respect to its filter (cf. tf.nn.conv2d_backprop_filter).

  Args:
    input: the convolution's input.
    filter_sizes: int32 vector of 4: the filter's shape.
    out_backprop: gradient with respect to the convolution's output.
    strides, padding, data_format, dilations, algorithm, workspace_limit: as for `conv2d`.
    name: optional name for the operation.

  Returns:
    Gradient with respect to the filter, shaped `filter_sizes`.
  """
  attrs = conv_attrs(strides, padding, data_format, dilations, algorithm, workspace_limit)
  with tf.name_scope(name or "LargeConv2DBackpropFilter"):
    input, out_backprop = _as_tensors(input, out_backprop)
    filter_sizes = tf.convert_to_tensor(filter_sizes, dtype=tf.int32, name="filter_sizes")
    return _loader.ops().large_conv_conv2d_backprop_filter(input, filter_sizes, out_backprop,
                                                           **attrs)


TF_KERNEL_DTYPES = (tf.float32, tf.float64)


def tf_kernel_eligible(input_shape, filter_shape, attrs, dtype):
  """Whether TensorFlow's own CPU kernels can run this convolution, gradients included."""
  return (len(input_shape) == 4 and len(filter_shape) == 4 and
          attrs["data_format"] == "NHWC" and all(d == 1 for d in attrs["dilations"]) and
          dtype in TF_KERNEL_DTYPES and input_shape[3] == filter_shape[2])


def _use_tf_kernel(input, filters, attrs):  # pylint: disable=redefined-builtin
  """True where the planner, asked with static image and filter shapes, prefers
  TensorFlow's own kernel (small filters with many channels, where oneDNN's tuned code
  wins). The batch size may be unknown: the choice is made per image."""
  if input.shape.rank != 4 or not filters.shape.is_fully_defined():
    return False
  x_shape, f_shape = [1] + input.shape.as_list()[1:], filters.shape.as_list()
  if None in x_shape or not tf_kernel_eligible(x_shape, f_shape, attrs, input.dtype):
    return False
  key = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(attrs.items()))
  return _plans_tf_kernel(tuple(x_shape), tuple(f_shape), key, input.dtype.name)


@functools.lru_cache(maxsize=1024)
def _plans_tf_kernel(x_shape, f_shape, attrs_key, dtype_name):
  # Cached: eager code calls conv2d with the same shapes over and over, and the decision
  # depends only on these arguments (and the thread count, fixed once TF is initialised).
  from tf_largeconv import planning  # pylint: disable=g-import-not-at-top
  attrs = {k: list(v) if isinstance(v, tuple) else v for k, v in attrs_key}
  try:
    p = planning.plan_from_attrs(list(x_shape), list(f_shape), attrs, dtype_name)
  except ValueError:
    return False  # bad shapes: our op raises the error, the same in every mode
  return p.forward.algorithm == "tf"


# Gradients, mirroring TF's _Conv2DGrad and its backprop-op gradients so that second-order
# derivatives work.


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
