"""Python API of the LargeConv op family: tf.nn.conv2d's signature, and its gradients.

The gradients themselves are registered by `tf_largeconv._gradients`, imported with the
package.
"""

import functools
import json
import threading
import weakref

import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv import _portable
from tf_largeconv import planning

_CORE = _loader.core()

# The context that sends every public op on this thread to the portable path (see _args).
portable_only = _args.portable_only
forced_portable = _args.forced_portable


def _known(static, dynamic):
  """The sizes of `static` (a TensorShape) as a list where all are known, else `dynamic`."""
  return static.as_list() if static.is_fully_defined() else dynamic


def _joined(*parts):
  """Shape parts (lists or int32 tensors) as one list, or one tensor if any is a tensor."""
  if all(isinstance(p, list) for p in parts):
    return sum(parts, [])
  return tf.concat(parts, 0)


def _merge_batch_dims(input, op):  # pylint: disable=redefined-builtin
  """Runs `op` on `input` with its batch dimensions merged into one.

  tf.nn.conv2d takes inputs of rank >= 4: batch_shape + 3 inner dimensions ([H, W, C] in
  NHWC, [C, H, W] in NCHW). The batch dimensions are merged by a reshape (no copy, and its
  gradient is a reshape too), and split again in `op`'s result. Inputs of rank 4 or of
  unknown rank go to `op` as they are.
  """
  rank = input.shape.rank
  if rank is None or rank <= 4:
    return op(input)
  batch_shape = input.shape[:-3]
  batch = _known(batch_shape, tf.shape(input)[:-3])
  # The merged size is given, never -1, which a reshape cannot infer for empty inputs.
  merged = [batch_shape.num_elements()] if isinstance(batch, list) else [tf.reduce_prod(batch)]
  inner = _known(input.shape[-3:], tf.shape(input)[-3:])
  output = op(tf.reshape(input, _joined(merged, inner)))
  out_inner = _known(output.shape[1:], tf.shape(output)[1:])
  result = tf.reshape(output, _joined(batch, out_inner))
  result.set_shape(batch_shape.concatenate(output.shape[1:]))
  return result


def conv2d(input, filters, strides, padding, data_format="NHWC", dilations=None,  # pylint: disable=redefined-builtin
           name=None, algorithm="auto", workspace_limit=None):
  """Computes a 2-D convolution with tf.nn.conv2d's semantics, lean for large filters.

  Same arguments and result as `tf.nn.conv2d`. Unlike TF's CPU kernels, NCHW and dilated
  gradients work on the CPU too, and a grouped convolution is computed when the filter's
  in-depth divides the input depth.

  Args:
    input: tensor of dtype float16, bfloat16, float32, float64 or int32 and rank >= 4:
      batch_shape + [height, width, channels] (NHWC) or batch_shape + [channels, height,
      width] (NCHW); extra leading batch dimensions are merged by a reshape, as
      tf.nn.conv2d does. int32 is summed exactly, wrapping modulo 2^32 as TensorFlow's
      kernel does, by the direct kernels.
    filters: tensor of the same dtype, shape [height, width, in_channels / groups,
      out_channels].
    strides: int or list of 1, 2 or 4 ints: the window stride (4 ints in data_format order,
      batch and depth entries 1).
    padding: 'SAME', 'VALID', or a list of four [before, after] pairs in data_format order
      (explicit padding; batch and depth pairs [0, 0]).
    data_format: 'NHWC' (default) or 'NCHW'.
    dilations: int or list of 1, 2 or 4 ints: the filter dilation; default 1.
    name: optional name for the operation.
    algorithm: 'auto' (the planner's choice per pass), 'direct', 'fft' (floating dtypes
      only), 'tf' or 'portable' (stock TF ops only: FFT overlap-save in `tf.signal`,
      floating dtypes, static image and filter shapes). Under XLA compilation
      (jit_compile=True) 'auto' runs 'portable' and 'direct'/'fft' raise ValueError.
      Gradients use the same setting. An eager 'auto' call whose filter tensor is among
      the last few of calls with the same shapes and arguments may run the forward pass
      through the op's FFT with the filter spectra it kept (see
      `planning.kept_spectra_bytes`), where the first call ran TensorFlow's kernel or the
      op's direct kernels: results then differ in the last bits.
    workspace_limit: hard bound in bytes on the temporary memory of each pass (forward and
      both gradients); None means 64 MiB. See `tf_largeconv.plan`.

  Returns:
    A tensor of input's dtype: batch_shape + [out_height, out_width, out_channels] for NHWC.

  Raises:
    ValueError: malformed strides, dilations, padding, data_format, algorithm or
      workspace_limit, algorithm='fft' with int32, or (while tracing a graph) shapes that
      do not fit together.
    TypeError: unsupported or mismatched dtypes.
    tf.errors.InvalidArgumentError: shapes that do not fit together (eager execution).
  """
  key = _eager_key(input, filters, (strides, padding, data_format, dilations, algorithm,
                                     workspace_limit))
  kernel = _EAGER_KERNELS.get(key) if key is not None else None
  if kernel is not None:
    return kernel(input, filters)
  attrs = _args.conv_attrs(strides, padding, data_format, dilations, algorithm, workspace_limit)
  attrs["algorithm"] = _args.resolve_algorithm(attrs["algorithm"])
  with tf.name_scope(name or "LargeConv2D"):
    input, filters = _args.as_tensors(input, filters)
    _args.check_algorithm(attrs["algorithm"], input.dtype)
    if attrs["algorithm"] == _args.PORTABLE:
      return _merge_batch_dims(input, lambda x: _portable_conv2d(x, filters, attrs))
    if key is not None and input.shape.rank == 4:
      kernel = _conv2d_kernel(input, filters, strides, padding, dilations, attrs, eager=True)
      if len(_EAGER_KERNELS) >= EAGER_KERNELS_MAX:
        _EAGER_KERNELS.clear()
      _EAGER_KERNELS[key] = kernel
      return kernel(input, filters)
    return _merge_batch_dims(
        input, lambda x: _conv2d_kernel(x, filters, strides, padding, dilations, attrs)(
            x, filters))


# An eager loop calls conv2d with the same shapes and arguments over and over, and the
# kernel a call runs (the op with its attributes, or a route through TensorFlow's kernels)
# depends on those alone: `_eager_key`'s. It is looked up by them, which takes 3 us where
# checking the arguments and choosing the route again took 20-70 us (a 15x15 filter on one
# 64x64 image runs in 130 us).
_EAGER_KERNELS = {}
EAGER_KERNELS_MAX = 1024


def _frozen(value):
  """`value` with its lists as tuples (hashable, if its leaves are), each leaf other than an
  int, a str or None tagged with its type: 1.0 and True equal 1 but are refused where 1 is
  taken, so they must not find 1's kernel."""
  if isinstance(value, (list, tuple)):
    return tuple(_frozen(v) for v in value)
  return value if type(value) in _PLAIN else (type(value), value)


_PLAIN = frozenset((int, str, type(None)))


def _eager_key(input, filters, args):  # pylint: disable=redefined-builtin
  """What decides an eager call's kernel: the two tensors' shapes, dtypes and device, and
  the arguments as given; None outside eager execution, for operands other than tensors
  (variables, arrays: converted by the full path), inside `portable_only()`, or for
  arguments that are not hashable."""
  if not (isinstance(input, tf.Tensor) and isinstance(filters, tf.Tensor) and
          tf.executing_eagerly()) or forced_portable():
    return None
  shapes = (input.shape, filters.shape, input.dtype, filters.dtype, input.device)
  if _PLAIN.issuperset(map(type, args)):  # as _frozen leaves them; each part hashable
    return shapes + (args,)
  key = shapes + (_frozen(args),)
  try:
    hash(key)
  except TypeError:
    return None
  return key


def _conv2d_kernel(input, filters, strides, padding, dilations, attrs, eager=False):  # pylint: disable=redefined-builtin
  """The function (input, filters) -> output that runs conv2d of this 4-D (or unknown-rank)
  input: each pass TensorFlow's kernel where the planner prefers it for that pass
  (planning.tf_routes), the op otherwise. With `eager`, for eager calls of input's shape
  and device alone (`_eager_routed`)."""
  if attrs["algorithm"] == "tf" and (_args.in_xla_context() or _loader.failure() is not None):
    # XLA compiles TensorFlow's own convolution, in every layout and grouping; without the
    # op library it is the only kernel 'tf' can name.
    return functools.partial(tf.nn.conv2d, strides=strides, padding=padding,
                             data_format=attrs["data_format"], dilations=dilations)
  schedule = ((1, (False,) * 3),)
  if attrs["algorithm"] in ("auto", "tf") and input.shape.rank == 4:
    schedule = planning.tf_kernel_routes(input.shape.as_list(), known_shape(filters),
                                         input.dtype, input, attrs)
  key = _args.attrs_key(attrs)
  eager = eager and not planning.runs_on_gpu(input)
  if not any(any(routes) for _, routes in schedule):
    if attrs["algorithm"] == "tf":
      raise ValueError(_TF_KERNEL_NEEDS)
    kernel = functools.partial(_loader.ops().large_conv_conv2d, **attrs)
  elif eager:
    kernel = _eager_routed(schedule, key, input.shape[0])
  else:
    return _routed(schedule, key)
  if eager and attrs["algorithm"] == "auto":
    routes = tuple(planning.routes_for(schedule, input.shape[0]))
    kept_bytes = planning.kept_spectra_bytes(tuple(input.shape), tuple(filters.shape), key,
                                             input.dtype.name, routes)
    if kept_bytes:
      return _KeptSpectraRoute(kernel, _kept_forward(key, routes), kept_bytes)
  return kernel


class _KeptSpectraRoute:
  """An eager kernel that runs `first` for a filter tensor that is not among the FILTERS
  distinct filter tensors it ran last, and `again` (the op's FFT, `_kept_forward`) for one
  that is, where the spectrum cache's budget holds its spectra (`kept_bytes`, see
  planning.kept_spectra_bytes) beside those of every other filter that moved and is still
  alive. Which kernel a call runs depends only on the calls before it (in the order they
  took the lock, where threads share the kernel), never on timing.

  The budget is shared as the cache is, process-wide: a filter that moved holds its share
  while its tensor lives, and one that does not fit beside them stays on `first`, so that
  moved filters never evict each other's spectra (two 40 MiB entries under a 64 MiB budget
  would, and each call would then transform its filter again at the FFT's full price). The
  op keeps a filter's spectra from its second sight of it, so the first two calls that
  move still transform the filter."""

  __slots__ = ("_first", "_again", "_kept_bytes", "_seen")
  FILTERS = 4  # filter tensors remembered (weakly): a few layers' worth per shape
  _LOCK = threading.Lock()
  _MOVED = {}  # id(filter) -> (weak reference, kept bytes): every filter that moved

  def __init__(self, first, again, kept_bytes):
    self._first, self._again, self._kept_bytes = first, again, kept_bytes
    self._seen = []  # weak references, the filter run last at the end

  def __call__(self, x, w):
    with self._LOCK:
      again = self._saw(w) and self._fits(w)
    return (self._again if again else self._first)(x, w)

  def _saw(self, w):
    """Whether w is among the FILTERS distinct filter tensors run last; makes it the last."""
    live = [r for r in self._seen if r() is not None]
    others = [r for r in live if r() is not w]
    self._seen = (others + [weakref.ref(w)])[-self.FILTERS:]
    return len(others) < len(live)

  def _fits(self, w):
    """Whether w's spectra fit the budget beside those of the other live filters that
    moved (recording w among them if so)."""
    moved = self._MOVED
    for key in [k for k, (ref, _) in moved.items() if ref() is None]:
      del moved[key]
    held = sum(b for _, b in moved.values())
    budget = _CORE.spectrum_cache_budget()
    if id(w) in moved:
      return held <= budget
    if held + self._kept_bytes > budget:
      return False
    moved[id(w)] = (weakref.ref(w), self._kept_bytes)
    return True


@functools.lru_cache(maxsize=256)
def _kept_forward(attrs_key, routes):
  """conv2d as the op's FFT forward pass, whose filter spectra the op keeps from call to
  call, recorded on a LargeConv>Conv2DRoute op whose gradient runs the passes `routes`
  name, as the call without kept spectra would."""
  attrs = dict(_args.attrs_from_key(attrs_key), algorithm="fft")
  fft = functools.partial(_loader.ops().large_conv_conv2d, **attrs)
  route, spec = _loader.ops().large_conv_conv2d_route, route_spec(attrs_key, routes)
  return lambda x, w: route(fft(x, w), x, w, route=spec)


def by_batch(x, schedule, run):
  """run(routes) for the routes `schedule` (planning.tf_kernel_routes) gives x's batch:
  chosen now where the batch is known or there is one entry; where the batch is known only
  at run time, by one tf.switch_case on it (whose branches must hold no further condition:
  TensorFlow cannot take the second-order gradient of a custom gradient or a condition
  inside a condition)."""
  batch = x.shape[0] if x.shape.rank else None
  if batch is not None or len(schedule) == 1:
    return run(planning.routes_for(schedule, batch or 0))
  batch = tf.shape(x)[0]
  index = tf.constant(0)
  for first, _ in schedule[1:]:
    index += tf.cast(batch >= first, tf.int32)
  return tf.switch_case(index, [lambda routes=routes: run(routes) for _, routes in schedule])


def known_shape(t):
  """t's static shape as a list (None where a size is unknown), or None for unknown rank."""
  return t.shape.as_list() if t.shape.rank is not None else None


@functools.lru_cache(maxsize=256)
def _routed(schedule, attrs_key):
  """conv2d as a function of (input, filters) whose passes run TensorFlow's kernel or the
  op's as the routes (forward, backprop_input, backprop_filter) that `schedule`
  (planning.tf_kernel_routes) gives the input's batch say (`by_batch`). Where they
  differ, the gradients are TensorFlow's backprop ops or the LargeConv ones with algorithm
  'auto' (`routed_input_gradient`, `routed_filter_gradient`), whose registered gradients
  give higher orders. An eager call on the CPU records them as the gradient of one
  LargeConv>Conv2DRoute op; a traced one wraps the passes in tf.custom_gradient, which costs
  an eager call several times as much but a graph nothing at run time, and keeps the
  graph free of the op (for serving and XLA where the forward pass is TensorFlow's). The
  choice by batch stays outside tf.custom_gradient's functions, as TensorFlow cannot take
  a second-order gradient through a custom gradient inside a condition. Cached: eager
  code calls conv2d with the same attributes over and over, and wrapping a function in
  tf.custom_gradient costs more than a small call."""
  attrs = dict(_args.attrs_from_key(attrs_key), algorithm="auto")  # the op's own choice

  def forward(x, w):
    return by_batch(x, schedule, lambda routes: _forward_pass(attrs_key, routes[0])(x, w))

  if all(all(routes) for _, routes in schedule):  # TensorFlow's kernel and its own gradients
    return forward

  @tf.custom_gradient
  def traced(x, w):
    def grad(dy):
      dx = by_batch(x, schedule, lambda routes: routed_input_gradient(x, w, dy, routes, attrs))
      dw = by_batch(x, schedule, lambda routes: routed_filter_gradient(x, w, dy, routes, attrs))
      return dx, dw

    return forward(x, w), grad

  def run(x, w):
    if not tf.executing_eagerly() or planning.runs_on_gpu(x):
      return traced(x, w)
    return _eager_routed(schedule, attrs_key, x.shape[0])(x, w)

  return run


@functools.lru_cache(maxsize=256)
def _eager_routed(schedule, attrs_key, batch):
  """`_routed`'s function for eager calls on the CPU with `batch` images: its routes
  chosen once, the passes' attributes bound, and a mixed route recorded on one
  LargeConv>Conv2DRoute op. An eager call that looks it up (conv2d's `_EAGER_KERNELS`)
  runs little more Python than its ops' own calls: choosing the routes on every call cost
  a small one 35 us (a 7x7 1->8 filter on one 128x128 image, 2 threads: 299 us, now 263,
  its two ops called bare 261, tf.nn.conv2d 268)."""
  routes = tuple(planning.routes_for(schedule, batch))
  forward = _forward_pass(attrs_key, routes[0])
  if all(routes):  # TensorFlow's kernel and its own gradients
    return forward
  route, spec = _loader.ops().large_conv_conv2d_route, route_spec(attrs_key, routes)
  return lambda x, w: route(forward(x, w), x, w, route=spec)


@functools.lru_cache(maxsize=256)
def _forward_pass(attrs_key, on_tf):
  """The routed forward pass (x, w) -> y with its attributes bound: TensorFlow's raw
  Conv2D with `on_tf`, the op with algorithm 'auto' otherwise."""
  attrs = dict(_args.attrs_from_key(attrs_key), algorithm="auto")  # the op's own choice
  if on_tf:
    raw = tf_attrs(attrs)
    return lambda x, w: tf.raw_ops.Conv2D(input=x, filter=w, **raw)
  return functools.partial(_loader.ops().large_conv_conv2d, **attrs)


def route_op(y, x, w, schedule, attrs_key, transpose=False):
  """y, the forward pass of x and w (conv2d's, or conv2d_transpose's with `transpose`),
  through a LargeConv>Conv2DRoute op whose gradient runs the routes `schedule` gives x's
  batch: how eager calls on the CPU record a mixed route."""
  routes = planning.routes_for(schedule, x.shape[0])
  return _loader.ops().large_conv_conv2d_route(
      y, x, w, route=route_spec(attrs_key, routes, transpose=transpose))


@functools.lru_cache(maxsize=1024)
def route_spec(attrs_key, routes, transpose=False):
  """The `route` attribute of LargeConv>Conv2DRoute: JSON of the convolution's attributes
  (`attrs_key`, as _args.attrs_key makes it; the op's own algorithm in 'algorithm'), its
  routes (forward, backprop_input, backprop_filter; True for TensorFlow's kernel) and
  whether it is transposed. `parse_route` reads it back."""
  attrs = dict(_args.attrs_from_key(attrs_key), algorithm="auto")
  return json.dumps({"attrs": attrs, "routes": [bool(r) for r in routes],
                     "transpose": bool(transpose)}, sort_keys=True)


@functools.lru_cache(maxsize=1024)
def parse_route(route):
  """(attrs key, routes, transpose) of a `route` attribute (str or bytes) written by
  `route_spec`. Raises ValueError naming it where it is not such JSON."""
  try:
    spec = json.loads(route)
    key = _args.attrs_key(spec["attrs"])
    routes, transpose = tuple(spec["routes"]), spec["transpose"]
  except (ValueError, KeyError, TypeError, AttributeError):
    raise ValueError(f"route must be the JSON that tf_largeconv.ops.route_spec writes, got "
                     f"{route!r}") from None
  if len(routes) != 3 or not all(isinstance(r, bool) for r in routes + (transpose,)):
    raise ValueError("route must hold 3 routes (forward, backprop_input, backprop_filter) "
                     f"and transpose as booleans, got {route!r}")
  return key, routes, transpose


def tf_attrs(attrs):
  """The attributes of TensorFlow's raw Conv2D ops for normalised ones. A routed pass calls
  the raw op (or the LargeConv op with `attrs`) itself: its attributes are normalised and
  the route says the kernel can run them, so the public functions' checks (15-20 us an
  eager call each) would only repeat themselves; the ops are the ones those create."""
  return {k: attrs[k] for k in ("strides", "padding", "explicit_paddings", "data_format",
                                "dilations")}


def routed_input_gradient(x, w, dy, routes, attrs):
  """conv2d's gradient with respect to its input x (whose height and width must be static,
  as routed passes have them; the batch may be unknown), by TensorFlow's kernel where
  routes[1] holds, otherwise by the op with attrs' algorithm (`routes`: forward,
  backprop_input, backprop_filter; `attrs`: normalised)."""
  sizes = (x.shape[2:4] if attrs["data_format"] == "NCHW" else x.shape[1:3]).as_list()
  if routes[1]:
    return tf.raw_ops.Conv2DBackpropInput(input_sizes=sizes, filter=w, out_backprop=dy,
                                          **tf_attrs(attrs))
  return _loader.ops().large_conv_conv2d_backprop_input(sizes, w, dy, **attrs)


def routed_filter_gradient(x, w, dy, routes, attrs):
  """conv2d's gradient with respect to its filter w, by TensorFlow's kernel where routes[2]
  holds, otherwise by the op (as `routed_input_gradient`)."""
  if routes[2]:
    return tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=tf.shape(w), out_backprop=dy,
                                           **tf_attrs(attrs))
  return _loader.ops().large_conv_conv2d_backprop_filter(x, tf.shape(w), dy, **attrs)


_TF_KERNEL_NEEDS = ("algorithm='tf' needs what TensorFlow's kernels support: no groups and "
                    "static image shapes, and on the CPU NHWC, dilations 1 and "
                    "float32/float64 (on a GPU float16/bfloat16/float32)")


def tf_padding(attrs):
  """The padding argument of TF's own backprop functions for normalised attributes."""
  if attrs["padding"] != "EXPLICIT":
    return attrs["padding"]
  ex = attrs["explicit_paddings"]
  return [ex[i:i + 2] for i in range(0, 8, 2)]


def _check_tf_kernel(x_shape, f_shape, dtype, placed, attrs):
  """Raises ValueError unless TensorFlow's own kernels take this convolution (shapes in
  data_format order, None where not known statically), as conv2d's 'tf' requires."""
  if not planning.tf_kernel_runs(x_shape, f_shape, dtype, placed, attrs):
    raise ValueError(_TF_KERNEL_NEEDS)


def _static_list(t):
  value = tf.get_static_value(t)
  return None if value is None else [int(v) for v in value]


def depthwise_conv2d(input, filter, strides, padding, data_format=None, dilations=None,  # pylint: disable=redefined-builtin
                     name=None, algorithm="auto", workspace_limit=None):
  """Depthwise 2-D convolution with tf.nn.depthwise_conv2d's semantics.

  Each input channel c is convolved with its own `channel_multiplier` filters; output
  channel c * channel_multiplier + m comes from filter[:, :, c, m]. Unlike
  tf.nn.depthwise_conv2d this also supports unequal strides, strides together with
  dilations (which TF computes wrongly, with a warning) and extra leading batch dimensions
  (as tf.nn.conv2d does), on the CPU in NHWC and NCHW. It is the grouped convolution with
  one group per input channel.

  Args:
    input: tensor of rank >= 4 in data_format order (batch_shape + 3 dimensions),
      float16/bfloat16/float32/float64 (as tf.nn.depthwise_conv2d, no int32).
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
    ValueError: malformed arguments, an input of rank < 4, or a filter whose in_channels
      differs from the input's depth (or whose rank is not 4).
    TypeError: a dtype tf.nn.depthwise_conv2d does not take, or mismatched dtypes.
    tf.errors.InvalidArgumentError: the same mismatch found only at run time.
  """
  data_format = _args.normalize_data_format(data_format)
  with tf.name_scope(name or "LargeDepthwiseConv2D"):
    input, filter = _args.as_tensors(input, filter)
    _args.check_dtype("input", input.dtype, _args.FLOAT_DTYPES)
    if filter.shape.rank is not None and filter.shape.rank != 4:
      raise ValueError("filter must be 4-D [height, width, in_channels, channel_multiplier], "
                       f"got shape {filter.shape}")
    if input.shape.rank is not None and input.shape.rank < 4:
      raise ValueError("input must be 4-dimensional (or have more leading batch dimensions), "
                       f"got shape {input.shape}")
    axis = _args.channel_axis_from_end(data_format)
    depth = input.shape[axis] if input.shape.rank is not None else None
    if depth is not None and filter.shape[2] is not None and depth != filter.shape[2]:
      raise ValueError(f"filter in_channels (dimension 2) {filter.shape[2]} must equal the "
                       f"input depth {depth}")
    shape = tf.shape(filter)
    checks = []
    if depth is None or filter.shape[2] is None:
      checks.append(tf.debugging.assert_equal(
          tf.shape(input)[axis], shape[2],
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
    input_sizes: int32 vector of 4: the shape of the convolution's input; or of 2, its
      height and width (batch from out_backprop, depth from the filter's dimension 2), as
      tf.nn.conv2d_backprop_input accepts.
    filters: the convolution's filter (float16, bfloat16, float32, float64 or int32).
    out_backprop: gradient with respect to the convolution's output.
    strides, padding, data_format, dilations, algorithm, workspace_limit: as for `conv2d`.
    name: optional name for the operation.

  Returns:
    Gradient with respect to the input, shaped `input_sizes`.
  """
  attrs = _args.conv_attrs(strides, padding, data_format, dilations, algorithm, workspace_limit)
  attrs["algorithm"] = _args.resolve_algorithm(attrs["algorithm"])
  with tf.name_scope(name or "LargeConv2DBackpropInput"):
    out_backprop, filters = _args.as_tensors(out_backprop, filters)
    _args.check_algorithm(attrs["algorithm"], out_backprop.dtype)
    input_sizes = tf.convert_to_tensor(input_sizes, dtype=tf.int32, name="input_sizes")
    if attrs["algorithm"] == _args.PORTABLE:
      return _portable_backprop_input(input_sizes, filters, out_backprop, attrs)
    if attrs["algorithm"] == "tf":
      sizes = _static_list(input_sizes)
      f_shape = filters.shape.as_list() if filters.shape.rank is not None else None
      if sizes is not None and len(sizes) == 2 and f_shape:  # batch and depth implied
        nchw = attrs["data_format"] == "NCHW"
        sizes = ([0, f_shape[2]] + sizes) if nchw else ([0] + sizes + [f_shape[2]])
      _check_tf_kernel(sizes, f_shape, out_backprop.dtype, out_backprop, attrs)
      return tf.compat.v1.nn.conv2d_backprop_input(
          input_sizes, filters, out_backprop, attrs["strides"], tf_padding(attrs),
          data_format=attrs["data_format"], dilations=attrs["dilations"])
    return _loader.ops().large_conv_conv2d_backprop_input(input_sizes, filters, out_backprop,
                                                          **attrs)


def conv2d_backprop_filter(input, filter_sizes, out_backprop, strides, padding,  # pylint: disable=redefined-builtin
                           data_format="NHWC", dilations=None, name=None, algorithm="auto",
                           workspace_limit=None):
  """Gradient of `conv2d` with respect to its filter (cf. tf.nn.conv2d_backprop_filter).

  Args:
    input: the convolution's input (float16, bfloat16, float32, float64 or int32).
    filter_sizes: int32 vector of 4: the filter's shape.
    out_backprop: gradient with respect to the convolution's output.
    strides, padding, data_format, dilations, algorithm, workspace_limit: as for `conv2d`.
    name: optional name for the operation.

  Returns:
    Gradient with respect to the filter, shaped `filter_sizes`.
  """
  attrs = _args.conv_attrs(strides, padding, data_format, dilations, algorithm, workspace_limit)
  attrs["algorithm"] = _args.resolve_algorithm(attrs["algorithm"])
  with tf.name_scope(name or "LargeConv2DBackpropFilter"):
    input, out_backprop = _args.as_tensors(input, out_backprop)
    _args.check_algorithm(attrs["algorithm"], input.dtype)
    filter_sizes = tf.convert_to_tensor(filter_sizes, dtype=tf.int32, name="filter_sizes")
    if attrs["algorithm"] == _args.PORTABLE:
      return _portable_backprop_filter(input, filter_sizes, out_backprop, attrs)
    if attrs["algorithm"] == "tf":
      x_shape = input.shape.as_list() if input.shape.rank == 4 else None
      _check_tf_kernel(x_shape, _static_list(filter_sizes), input.dtype, input, attrs)
      return tf.compat.v1.nn.conv2d_backprop_filter(
          input, filter_sizes, out_backprop, attrs["strides"], tf_padding(attrs),
          data_format=attrs["data_format"], dilations=attrs["dilations"])
    return _loader.ops().large_conv_conv2d_backprop_filter(input, filter_sizes, out_backprop,
                                                           **attrs)


# The portable path (algorithm='portable', and 'auto' under XLA): `_portable`'s stock TF
# ops, after the same checks the ops make, with the ops' messages. Eager calls raise
# InvalidArgumentError as the ops' kernels do; traced ones ValueError, as their shape
# functions do.


def _op_error(error):
  """`error` (a ValueError or NotImplementedError of the geometry) as the op raises it."""
  if isinstance(error, NotImplementedError):
    return tf.errors.UnimplementedError(None, None, str(error))
  if tf.executing_eagerly():
    return tf.errors.InvalidArgumentError(None, None, str(error))
  return error


def _check_rank4(name, shape):
  if shape.rank is not None and shape.rank != 4:
    raise _op_error(ValueError(
        f"{name} must be a 4-D tensor, got shape {shape}. convolution {name} must be "
        f"4-dimensional: {shape}. Shape must be rank 4 but is rank {shape.rank}"))


def _portable_geometry(input_shape, filter_shape, attrs):
  """The package's geometry of static shapes (an unknown batch planned as 1); raises the
  op's errors for shapes that do not fit together."""
  input_shape = [1 if v is None else v for v in input_shape]
  try:
    return _CORE.geometry(input_shape, list(filter_shape), attrs["strides"],
                          attrs["padding"], attrs["explicit_paddings"],
                          attrs["data_format"], attrs["dilations"])
  except (ValueError, NotImplementedError) as e:
    raise _op_error(e) from None


def _portable_call(x, filters, attrs):
  """`_portable.conv2d` of a 4-D x with the op attributes `attrs`."""
  return _portable.conv2d(x, filters, attrs["strides"], attrs["padding"],
                          attrs["explicit_paddings"], attrs["data_format"], attrs["dilations"],
                          workspace_limit=attrs["workspace_limit"])


@functools.lru_cache(maxsize=256)
def _traced_portable(attrs_key):
  """`_portable_call` for these (hashable) attributes as a tf.function; it retraces per
  input and filter shape and dtype."""
  attrs = _args.attrs_from_key(attrs_key)
  return tf.function(lambda x, filters: _portable_call(x, filters, attrs), autograph=False)


def _portable_conv2d(input, filters, attrs):  # pylint: disable=redefined-builtin
  """conv2d of a 4-D input by `_portable`. An unknown batch size goes image by image
  (tf.map_fn), so one loop step stays within workspace_limit whatever the batch."""
  _check_rank4("input", input.shape)
  _check_rank4("filter", filters.shape)
  if (input.shape.rank is None or None in input.shape.as_list()[1:]
      or not filters.shape.is_fully_defined()):
    raise ValueError("algorithm='portable' needs static image and filter shapes (only the "
                     f"batch size may be unknown), got input shape {input.shape} and filter "
                     f"shape {filters.shape}")
  geometry = _portable_geometry(input.shape.as_list(), filters.shape.as_list(), attrs)

  if input.shape[0] is not None:
    if tf.executing_eagerly():
      # One traced function per argument set: eager dispatch of the path's ~40 ops cost as
      # much as its transforms (the seed case: 53 ms eagerly, 31 ms traced).
      return _traced_portable(_args.attrs_key(attrs))(input, filters)
    return _portable_call(input, filters, attrs)
  return tf.map_fn(lambda image: _portable_call(image[None], filters, attrs)[0], input,
                   fn_output_signature=tf.TensorSpec(geometry["output_shape"][1:],
                                                     input.dtype))


def _static_sizes(name, sizes, spatial_ok, op):
  """`sizes` (input_sizes or filter_sizes) as a list of ints, checked as the op does."""
  value = tf.get_static_value(sizes)
  if value is None:
    raise ValueError(f"algorithm='portable' needs {name} known when the graph is traced")
  value = [int(v) for v in value.reshape(-1)] if value.ndim else None
  if value is None:
    raise _op_error(ValueError(f"{name} must be a vector, got shape []. {op}: {name} input "
                               "must be 1-dim, not 0"))
  if len(value) != 4 and not (spatial_ok and len(value) == 2):
    if spatial_ok:
      msg = (f"{name} must be a vector of 4 sizes (or 2: height and width), got "
             f"{len(value)}. {op} requires {name} to contain 4 values or 2 values, but got: "
             f"{len(value)}")
    else:
      msg = f"{name} must be a vector of 4 sizes, got {len(value)}. filter must be 4-dimensional"
    raise _op_error(ValueError(msg))
  for v in value:
    if v < 0:
      raise _op_error(ValueError(f"{name} must be non-negative, got {v}. Dimension {v} must "
                                 "be >= 0"))
  return value


def _check_out_backprop(out_backprop, input_shape, filter_shape, attrs):
  _check_rank4("out_backprop", out_backprop.shape)
  if None in input_shape[1:]:
    return  # _portable_conv2d names the unknown sizes
  want = _portable_geometry(input_shape, filter_shape, attrs)["output_shape"]
  got = out_backprop.shape.as_list() if out_backprop.shape.rank is not None else None
  if got is not None and any(g is not None and w != g and not (i == 0 and input_shape[0] is None)
                             for i, (g, w) in enumerate(zip(got, want))):
    shown = [w if w is not None else "?" for w in want]
    raise _op_error(ValueError(f"out_backprop has shape {got} but the convolution produces "
                               f"{shown}"))


def _portable_backprop_input(input_sizes, filters, out_backprop, attrs):
  """TensorFlow's gradient of the portable conv2d with respect to its input (exact: the
  convolution is linear in it)."""
  sizes = _static_sizes("input_sizes", input_sizes, True, "Conv2DBackpropInput")
  _check_rank4("filter", filters.shape)
  if len(sizes) == 2:
    batch = out_backprop.shape[0] if out_backprop.shape.rank is not None else None
    depth = filters.shape[2]
    sizes = ([batch, depth] + sizes if attrs["data_format"] == "NCHW"
             else [batch] + sizes + [depth])
  _check_out_backprop(out_backprop, sizes, filters.shape.as_list(), attrs)
  if sizes[0] is None:
    shape = tf.concat([tf.shape(out_backprop)[:1], sizes[1:]], 0)
  else:
    shape = sizes
  x = tf.zeros(shape, out_backprop.dtype)
  x.set_shape(sizes)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = _portable_conv2d(x, filters, attrs)
  return tape.gradient(y, x, output_gradients=out_backprop)


def _portable_backprop_filter(input, filter_sizes, out_backprop, attrs):  # pylint: disable=redefined-builtin
  """TensorFlow's gradient of the portable conv2d with respect to its filter (exact: the
  convolution is linear in it)."""
  sizes = _static_sizes("filter_sizes", filter_sizes, False, "Conv2DBackpropFilter")
  _check_rank4("input", input.shape)
  if input.shape.rank is not None:
    _check_out_backprop(out_backprop, input.shape.as_list(), sizes, attrs)
  w = tf.zeros(sizes, out_backprop.dtype)
  with tf.GradientTape() as tape:
    tape.watch(w)
    y = _portable_conv2d(input, w, attrs)
  return tape.gradient(y, w, output_gradients=out_backprop)
