"""Routed passes: conv2d as a function of (input, filters) whose forward pass and two
gradients each run TensorFlow's kernel or the op, as a schedule
(`tf_largeconv.planning.routing`) says.
"""

import functools
import json

import tensorflow as tf

from tf_largeconv import _loader
from tf_largeconv._passes import PerPass
from tf_largeconv._problem import ConvProblem
from tf_largeconv.planning import device
from tf_largeconv.planning import routing


def by_batch(x, schedule, run):
  """run(routes) for the routes `schedule` (routing.schedule) gives x's batch:
  chosen now where the batch is known or there is one entry; where the batch is known only
  at run time, by one tf.switch_case on it (whose branches must hold no further condition:
  TensorFlow cannot take the second-order gradient of a custom gradient or a condition
  inside a condition)."""
  batch = x.shape[0] if x.shape.rank else None
  if batch is not None or len(schedule) == 1:
    return run(routing.at_batch(schedule, batch or 0))
  batch = tf.shape(x)[0]
  index = tf.constant(0)
  for first, _ in schedule[1:]:
    index += tf.cast(batch >= first, tf.int32)
  return tf.switch_case(index, [lambda routes=routes: run(routes) for _, routes in schedule])


def known_shape(t):
  """t's static shape as a list (None where a size is unknown), or None for unknown rank."""
  return t.shape.as_list() if t.shape.rank is not None else None


@functools.lru_cache(maxsize=256)
def routed(schedule, problem):
  """conv2d as a function of (input, filters) whose passes run TensorFlow's kernel or the
  op's as the routes (forward, backprop_input, backprop_filter) that `schedule`
  (routing.schedule) gives the input's batch say (`by_batch`). Where they
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
  ours = problem.replace(algorithm="auto")  # the op's own choice

  def forward(x, w):
    return by_batch(x, schedule, lambda routes: _forward_pass(problem, routes.forward)(x, w))

  if all(all(routes) for _, routes in schedule):  # TensorFlow's kernel and its own gradients
    return forward

  @tf.custom_gradient
  def traced(x, w):
    def grad(dy):
      dx = by_batch(x, schedule, lambda routes: routed_input_gradient(x, w, dy, routes, ours))
      dw = by_batch(x, schedule, lambda routes: routed_filter_gradient(x, w, dy, routes, ours))
      return dx, dw

    return forward(x, w), grad

  def run(x, w):
    if not tf.executing_eagerly() or device.runs_on_gpu(x):
      return traced(x, w)
    return eager_routed(schedule, problem, x.shape[0])(x, w)

  return run


@functools.lru_cache(maxsize=256)
def eager_routed(schedule, problem, batch):
  """`routed`'s function for eager calls on the CPU with `batch` images: its routes
  chosen once, the passes' attributes bound, and a mixed route recorded on one
  LargeConv>Conv2DRoute op, so that an eager call that looks it up (the eager kernel cache
  in `_dispatch`) runs little more Python than its ops' own calls."""
  routes = routing.at_batch(schedule, batch)
  forward = _forward_pass(problem, routes.forward)
  if all(routes):  # TensorFlow's kernel and its own gradients
    return forward
  route, spec = _loader.ops().large_conv_conv2d_route, route_spec(problem, routes)
  return lambda x, w: route(forward(x, w), x, w, route=spec)


@functools.lru_cache(maxsize=256)
def _forward_pass(problem, on_tf):
  """The routed forward pass (x, w) -> y with its attributes bound: TensorFlow's raw
  Conv2D with `on_tf`, the op with algorithm 'auto' otherwise."""
  if on_tf:
    raw = tf_attrs(problem)
    return lambda x, w: tf.raw_ops.Conv2D(input=x, filter=w, **raw)
  attrs = problem.replace(algorithm="auto").attrs()  # the op's own choice
  return functools.partial(_loader.ops().large_conv_conv2d, **attrs)


def route_op(y, x, w, schedule, problem, transpose=False):
  """y, the forward pass of x and w (conv2d's, or conv2d_transpose's with `transpose`),
  through a LargeConv>Conv2DRoute op whose gradient runs the routes `schedule` gives x's
  batch: how eager calls on the CPU record a mixed route."""
  routes = routing.at_batch(schedule, x.shape[0])
  return _loader.ops().large_conv_conv2d_route(
    y, x, w, route=route_spec(problem, routes, transpose=transpose)
  )


@functools.lru_cache(maxsize=1024)
def route_spec(problem, routes, transpose=False):
  """The `route` attribute of LargeConv>Conv2DRoute: JSON of the convolution's op
  attributes (of the unbound ConvProblem `problem`; the op's own algorithm in
  'algorithm'), its routes (forward, backprop_input, backprop_filter; True for
  TensorFlow's kernel) and whether it is transposed. `parse_route` reads it back."""
  attrs = problem.replace(algorithm="auto").attrs()
  return json.dumps(
    {"attrs": attrs, "routes": [bool(r) for r in routes], "transpose": bool(transpose)},
    sort_keys=True,
  )


@functools.lru_cache(maxsize=1024)
def parse_route(route):
  """(ConvProblem, routes, transpose) of a `route` attribute (str or bytes) written by
  `route_spec`. Raises ValueError naming it where it is not such JSON."""
  try:
    spec = json.loads(route)
    key = ConvProblem.from_attrs(spec["attrs"])
    routes, transpose = tuple(spec["routes"]), spec["transpose"]
  except (ValueError, KeyError, TypeError, AttributeError):
    raise ValueError(f"route must be the JSON that `route_spec` writes, got {route!r}") from None
  if len(routes) != len(PerPass._fields) or not all(
    isinstance(r, bool) for r in routes + (transpose,)
  ):
    raise ValueError(
      "route must hold one route per pass (forward, backprop_input, "
      f"backprop_filter) and transpose as booleans, got {route!r}"
    )
  return key, PerPass.of(routes), transpose


def tf_attrs(problem):
  """The attributes of TensorFlow's raw Conv2D ops for a ConvProblem. A routed pass calls
  the raw op (or the LargeConv op with the problem's attributes) itself: the problem is
  cleaned and the route says the kernel can run it, so the public functions' checks (a
  sizeable share of a small eager call) would only repeat themselves; the ops are the ones
  those create."""
  attrs = problem.attrs()
  return {
    k: attrs[k] for k in ("strides", "padding", "explicit_paddings", "data_format", "dilations")
  }


def routed_input_gradient(x, w, dy, routes, problem):
  """conv2d's gradient with respect to its input x (whose height and width must be static,
  as routed passes have them; the batch may be unknown), by TensorFlow's kernel where
  routes.backprop_input holds, otherwise by the op with the ConvProblem's algorithm
  (`routes`: a PerPass)."""
  sizes = [x.shape[i] for i in problem.spatial_axes]
  if routes.backprop_input:
    return tf.raw_ops.Conv2DBackpropInput(
      input_sizes=sizes, filter=w, out_backprop=dy, **tf_attrs(problem)
    )
  return _loader.ops().large_conv_conv2d_backprop_input(sizes, w, dy, **problem.attrs())


def routed_filter_gradient(x, w, dy, routes, problem):
  """conv2d's gradient with respect to its filter w, by TensorFlow's kernel where
  routes.backprop_filter holds, otherwise by the op (as `routed_input_gradient`)."""
  if routes.backprop_filter:
    return tf.raw_ops.Conv2DBackpropFilter(
      input=x, filter_sizes=tf.shape(w), out_backprop=dy, **tf_attrs(problem)
    )
  return _loader.ops().large_conv_conv2d_backprop_filter(x, tf.shape(w), dy, **problem.attrs())


TF_KERNEL_NEEDS = (
  "algorithm='tf' needs what TensorFlow's kernels support: no groups and "
  "static image shapes, and on the CPU NHWC, dilations 1 and "
  "float32/float64 (on a GPU float16/bfloat16/float32)"
)


def check_tf_kernel(x_shape, f_shape, dtype, placed, problem):
  """Raises ValueError unless TensorFlow's own kernels take this convolution (shapes in
  data_format order, None where not known statically), as conv2d's 'tf' requires."""
  if not routing.tf_kernel_runs(x_shape, f_shape, dtype, placed, problem):
    raise ValueError(TF_KERNEL_NEEDS)
