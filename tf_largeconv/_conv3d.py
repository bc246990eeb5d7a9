"""`tf_largeconv.conv3d`: tf.nn.conv3d's semantics on the LargeConv 3-D ops.

The ops run the core's 3-D kernels (direct, or FFT overlap-save over volumes, chosen per
pass by the planner under a hard workspace limit); their gradients, to second order, are
registered by `tf_largeconv._gradients`. `plan_conv3d` shows what the op will do for given
shapes: the same C++ planner the kernels call, per pass.
"""

import numbers

import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv import planning

_CORE = _loader.core()

DATA_FORMATS = ("NDHWC", "NCDHW")
PADDINGS = ("SAME", "VALID")


def _window(value, name):
  """strides or dilations as tf.nn.conv3d takes them: a list of 5 ints in data_format
  order (None: all ones, for dilations)."""
  if value is None:
    return [1] * 5
  values = _args.window_values(value, name, "5")
  if len(values) != 5:
    raise ValueError(f"{name} must have 5 entries (one per dimension of input), got "
                     f"{name}={value!r}")
  return values


def conv3d_attrs(strides, padding, data_format="NDHWC", dilations=None, algorithm="auto",
                 workspace_limit=None):
  """The LargeConv>Conv3D attributes for tf.nn.conv3d-style arguments (checked for form;
  the op checks the values against the shapes)."""
  if data_format not in DATA_FORMATS:
    raise ValueError(f"data_format must be 'NDHWC' or 'NCDHW', got data_format={data_format!r}")
  if padding not in PADDINGS:
    raise ValueError(f"padding must be 'SAME' or 'VALID' (tf.nn.conv3d has no explicit "
                     f"padding), got padding={padding!r}")
  return dict(strides=_window(strides, "strides"), padding=padding, data_format=data_format,
              dilations=_window(dilations, "dilations"),
              algorithm=_args.normalize_algorithm(algorithm),
              workspace_limit=_args.normalize_workspace_limit(workspace_limit))


def conv3d(input, filters, strides, padding, data_format="NDHWC", dilations=None,  # pylint: disable=redefined-builtin
           name=None, algorithm="auto", workspace_limit=None):
  """Computes a 3-D convolution with tf.nn.conv3d's semantics, lean for large filters.

  Same arguments and result as `tf.nn.conv3d`; a grouped convolution is computed when the
  filter's in-depth divides the input depth (depthwise when it is 1), and NCDHW, dilations
  and their gradients work on the CPU.

  Args:
    input: 5-D tensor of dtype float16, bfloat16, float32, float64 or int32: [batch, depth,
      height, width, channels] (NDHWC) or [batch, channels, depth, height, width] (NCDHW).
      int32 is summed exactly (modulo 2^32) by the direct kernels.
    filters: tensor of the same dtype, shape [depth, height, width, in_channels / groups,
      out_channels].
    strides: list of 5 ints in data_format order, batch and channel entries 1.
    padding: 'SAME' or 'VALID'.
    data_format: 'NDHWC' (default) or 'NCDHW'.
    dilations: list of 5 ints in data_format order (batch and channel entries 1); None
      means no dilation.
    name: optional name for the operation.
    algorithm: 'auto' (the planner's choice per pass), 'direct', 'fft' (floating dtypes
      only), or 'tf' / 'portable' (TensorFlow's own tf.nn.conv3d). Gradients use the same
      setting. Under XLA compilation 'auto' runs tf.nn.conv3d.
    workspace_limit: hard bound in bytes on the temporary memory of each pass (forward and
      both gradients); None means 64 MiB.

  Returns:
    A tensor of input's dtype: [batch, out_depth, out_height, out_width, out_channels] for
    NDHWC.

  Raises:
    ValueError: malformed strides, dilations, padding, data_format, algorithm or
      workspace_limit, or algorithm='fft' with int32.
    TypeError: unsupported or mismatched dtypes.
    tf.errors.InvalidArgumentError: shapes that do not fit together (eager execution).
  """
  attrs = conv3d_attrs(strides, padding, data_format, dilations, algorithm, workspace_limit)
  attrs["algorithm"] = _args.resolve_algorithm(attrs["algorithm"])
  with tf.name_scope(name or "LargeConv3D"):
    input, filters = _args.as_tensors(input, filters)
    if attrs["algorithm"] in ("tf", _args.PORTABLE):  # TensorFlow's own kernels
      return tf.nn.conv3d(input, filters, attrs["strides"], padding, data_format=data_format,
                          dilations=attrs["dilations"])
    _args.check_algorithm(attrs["algorithm"], input.dtype)
    return _loader.ops().large_conv_conv3d(input, filters, **attrs)


def _shape(value, name, form):
  """input_shape or filter_shape (a list, tuple, array or TensorShape) as 5 non-negative
  ints."""
  try:
    values = value.as_list() if isinstance(value, tf.TensorShape) else list(value)
  except (TypeError, ValueError):
    values = None
  if (values is None or len(values) != 5 or
      not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 0
              for v in values)):
    raise ValueError(f"{name} must be 5 non-negative ints, {form}, got {name}={value!r}")
  return [int(v) for v in values]


def tf_kernel_eligible(input_shape, filter_shape, attrs, dtype):
  """Whether TensorFlow's CPU Conv3D kernels (and their gradients) run this convolution:
  NDHWC, dilations 1, floating dtypes, no groups (TF's CPU kernel refuses each of these)."""
  return (attrs["data_format"] == "NDHWC" and all(d == 1 for d in attrs["dilations"]) and
          dtype.is_floating and input_shape[4] == filter_shape[3])


def plan_conv3d(input_shape, filter_shape, strides, padding, data_format="NDHWC",
                dilations=None, dtype=tf.float32, algorithm="auto", workspace_limit=None,
                num_threads=None):
  """Plans `conv3d` without running it: what each of its three passes will do.

  The same C++ planner the LargeConv 3-D kernels call (on the CPU), so the plan is the
  op's: per pass the algorithm, the 3-D transform size (depth x height x width), the tile
  of outputs each transform yields and the tiles per dimension, channel blocks, slots, the
  exact workspace bytes (what the op takes through TensorFlow's allocator, never more than
  workspace_limit), GFLOP, and the cost model's single-thread estimate of each algorithm
  (why it chose what it chose). `print()` it for a table.

  Args:
    input_shape: 5 ints in data_format order: [batch, depth, height, width, channels]
      (NDHWC) or [batch, channels, depth, height, width] (NCDHW).
    filter_shape: [depth, height, width, in_channels / groups, out_channels].
    strides, padding, data_format, dilations, algorithm, workspace_limit: as for
      `tf_largeconv.conv3d`. algorithm='tf' (tf.nn.conv3d) plans TensorFlow's kernel,
      where its CPU kernel runs the convolution; its temporary memory is TensorFlow's, shown
      as an estimate.
    dtype: the tensors' dtype (float16/bfloat16/float32 compute in float32; int32 is summed
      exactly, by the direct kernels only).
    num_threads: threads to plan for; default: TensorFlow's intra-op thread count.

  Returns:
    A `tf_largeconv.Plan` whose output_shape is conv3d's result shape; its passes' sizes
    (fft_size, tile, tiles) have 3 entries (depth, height, width).

  Raises:
    ValueError: malformed arguments (naming the argument), shapes that do not fit together,
      algorithm='fft' with int32, algorithm='portable' (stock TF ops, which the plan does
      not describe), algorithm='tf' where TensorFlow's CPU kernel cannot run the
      convolution, or a workspace_limit that even the smallest FFT plan exceeds when
      algorithm='fft' (the message gives the minimum).
    NotImplementedError: strides or dilations other than 1 in the batch or channel
      dimension, as TensorFlow (the op raises UnimplementedError).
  """
  attrs = conv3d_attrs(strides, padding, data_format, dilations, algorithm, workspace_limit)
  if attrs["algorithm"] == _args.PORTABLE:
    raise ValueError("algorithm='portable' runs stock TensorFlow ops, not the LargeConv ops "
                     "that plan_conv3d() describes; plan with algorithm='auto', 'direct', "
                     "'fft' or 'tf'")
  x = _shape(input_shape, "input_shape", "[batch, depth, height, width, channels] (NDHWC) "
             "or [batch, channels, depth, height, width] (NCDHW)")
  f = _shape(filter_shape, "filter_shape",
             "[depth, height, width, in_channels / groups, out_channels]")
  dtype = _args.normalize_dtype(dtype)
  threads = int(num_threads) if num_threads else planning.intra_op_threads()
  args = (x, f, attrs["strides"], attrs["padding"], attrs["data_format"], attrs["dilations"])
  try:
    geometry = _CORE.geometry3d(*args)
    allow_tf = False
    if attrs["algorithm"] == "tf":
      as_ndhwc = x if attrs["data_format"] == "NDHWC" else [x[0], x[2], x[3], x[4], x[1]]
      allow_tf = tf_kernel_eligible(as_ndhwc, f, attrs, dtype)
      if not allow_tf:
        raise ValueError(
            "algorithm='tf' runs tf.nn.conv3d, whose CPU kernel needs NDHWC, dilations 1, a "
            "floating dtype and no groups; got "
            f"data_format={attrs['data_format']!r}, dilations={attrs['dilations']}, dtype "
            f"{dtype.name}, input channels {as_ndhwc[4]} and filter in-channels {f[3]}")
    passes = _CORE.plan3d(*args, algorithm=attrs["algorithm"],
                          workspace_limit=attrs["workspace_limit"], num_threads=threads,
                          dtype=dtype.name, allow_tf=allow_tf)
  except (ValueError, NotImplementedError) as e:
    raise type(e)(f"input_shape {x}, filter_shape {f}: {e}") from None
  limit = attrs["workspace_limit"]
  if limit < 0:
    limit = _CORE.DEFAULT_WORKSPACE_LIMIT
  return planning.Plan([planning.PassPlan(d) for d in passes], geometry["output_shape"], limit,
                       threads, _loader.failure())
