"""conv2d and its two gradients on the portable path (algorithm='portable', and 'auto'
under XLA): `tf_largeconv.ops.portable`'s stock TF ops, after the same checks the ops
make, with the ops' messages. Eager calls raise InvalidArgumentError as the ops' kernels
do; traced ones ValueError, as their shape functions do.
"""

import functools

import tensorflow as tf

from tf_largeconv import _loader
from tf_largeconv.ops import portable

_CORE = _loader.core()


def op_error(error):
  """`error` (a ValueError or NotImplementedError of the geometry) as the op raises it."""
  if isinstance(error, NotImplementedError):
    return tf.errors.UnimplementedError(None, None, str(error))
  if tf.executing_eagerly():
    return tf.errors.InvalidArgumentError(None, None, str(error))
  return error


def _check_rank4(name, shape):
  if shape.rank is not None and shape.rank != 4:
    raise op_error(
      ValueError(
        f"{name} must be a 4-D tensor, got shape {shape}. convolution {name} must be "
        f"4-dimensional: {shape}. Shape must be rank 4 but is rank {shape.rank}"
      )
    )


def _portable_geometry(input_shape, filter_shape, problem):
  """The package's geometry of static shapes (an unknown batch planned as 1); raises the
  op's errors for shapes that do not fit together."""
  input_shape = [1 if v is None else v for v in input_shape]
  try:
    return problem.bind(input_shape, filter_shape).geometry()
  except (ValueError, NotImplementedError) as e:
    raise op_error(e) from None


def _portable_call(x, filters, problem):
  """`portable.conv2d` of a 4-D x for the ConvProblem `problem`."""
  return portable.conv2d(
    x,
    filters,
    problem.strides,
    problem.padding,
    problem.explicit_paddings,
    problem.data_format,
    problem.dilations,
    workspace_limit=problem.workspace_limit,
  )


@functools.lru_cache(maxsize=256)
def _traced_portable(problem):
  """`_portable_call` for this (unbound) problem as a tf.function; it retraces per input
  and filter shape and dtype."""
  return tf.function(lambda x, filters: _portable_call(x, filters, problem), autograph=False)


def conv2d(input, filters, problem):
  """conv2d of a 4-D input by `portable`. An unknown batch size goes image by image
  (tf.map_fn), so one loop step stays within workspace_limit whatever the batch."""
  _check_rank4("input", input.shape)
  _check_rank4("filter", filters.shape)
  if (
    input.shape.rank is None
    or None in input.shape.as_list()[1:]
    or not filters.shape.is_fully_defined()
  ):
    raise ValueError(
      "algorithm='portable' needs static image and filter shapes (only the "
      f"batch size may be unknown), got input shape {input.shape} and filter "
      f"shape {filters.shape}"
    )
  geometry = _portable_geometry(input.shape.as_list(), filters.shape.as_list(), problem)

  if input.shape[0] is not None:
    if tf.executing_eagerly():
      # Traced once per argument set, as eager dispatch of the path's ~40 ops costs about
      # as much as its transforms.
      return _traced_portable(problem.unbound())(input, filters)
    return _portable_call(input, filters, problem)
  return tf.map_fn(
    lambda image: _portable_call(image[None], filters, problem)[0],
    input,
    fn_output_signature=tf.TensorSpec(geometry["output_shape"][1:], input.dtype),
  )


def _static_sizes(name, sizes, spatial_ok, op):
  """`sizes` (input_sizes or filter_sizes) as a list of ints, checked as the op does."""
  value = tf.get_static_value(sizes)
  if value is None:
    raise ValueError(f"algorithm='portable' needs {name} known when the graph is traced")
  value = [int(v) for v in value.reshape(-1)] if value.ndim else None
  if value is None:
    raise op_error(
      ValueError(f"{name} must be a vector, got shape []. {op}: {name} input must be 1-dim, not 0")
    )
  if len(value) != 4 and not (spatial_ok and len(value) == 2):
    if spatial_ok:
      msg = (
        f"{name} must be a vector of 4 sizes (or 2: height and width), got "
        f"{len(value)}. {op} requires {name} to contain 4 values or 2 values, but got: "
        f"{len(value)}"
      )
    else:
      msg = f"{name} must be a vector of 4 sizes, got {len(value)}. filter must be 4-dimensional"
    raise op_error(ValueError(msg))
  for v in value:
    if v < 0:
      raise op_error(
        ValueError(f"{name} must be non-negative, got {v}. Dimension {v} must be >= 0")
      )
  return value


def _check_out_backprop(out_backprop, input_shape, filter_shape, problem):
  _check_rank4("out_backprop", out_backprop.shape)
  if None in input_shape[1:]:
    return  # conv2d names the unknown sizes
  want = _portable_geometry(input_shape, filter_shape, problem)["output_shape"]
  got = out_backprop.shape.as_list() if out_backprop.shape.rank is not None else None
  if got is not None and any(
    g is not None and w != g and not (i == 0 and input_shape[0] is None)
    for i, (g, w) in enumerate(zip(got, want))
  ):
    shown = [w if w is not None else "?" for w in want]
    raise op_error(ValueError(f"out_backprop has shape {got} but the convolution produces {shown}"))


def backprop_input(input_sizes, filters, out_backprop, problem):
  """TensorFlow's gradient of the portable conv2d with respect to its input (exact: the
  convolution is linear in it)."""
  sizes = _static_sizes("input_sizes", input_sizes, True, "Conv2DBackpropInput")
  _check_rank4("filter", filters.shape)
  if len(sizes) == 2:
    batch = out_backprop.shape[0] if out_backprop.shape.rank is not None else None
    depth = filters.shape[2]
    sizes = [batch, depth] + sizes if problem.channel_axis == 1 else [batch] + sizes + [depth]
  _check_out_backprop(out_backprop, sizes, filters.shape.as_list(), problem)
  if sizes[0] is None:
    shape = tf.concat([tf.shape(out_backprop)[:1], sizes[1:]], 0)
  else:
    shape = sizes
  x = tf.zeros(shape, out_backprop.dtype)
  x.set_shape(sizes)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = conv2d(x, filters, problem)
  return tape.gradient(y, x, output_gradients=out_backprop)


def backprop_filter(input, filter_sizes, out_backprop, problem):
  """TensorFlow's gradient of the portable conv2d with respect to its filter (exact: the
  convolution is linear in it)."""
  sizes = _static_sizes("filter_sizes", filter_sizes, False, "Conv2DBackpropFilter")
  _check_rank4("input", input.shape)
  if input.shape.rank is not None:
    _check_out_backprop(out_backprop, input.shape.as_list(), sizes, problem)
  w = tf.zeros(sizes, out_backprop.dtype)
  with tf.GradientTape() as tape:
    tape.watch(w)
    y = conv2d(input, w, problem)
  return tape.gradient(y, w, output_gradients=out_backprop)
