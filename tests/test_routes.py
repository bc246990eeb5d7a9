"""algorithm='auto' routes each pass on its own: TensorFlow's kernel where the planner prices
it lower for that pass, the op's otherwise (tf_largeconv.planning.routing). TF's forward kernel is
fast with small filters and many channels while its backprop kernels are not, so such a
convolution runs TF's forward kernel and the op's gradients. These tests check the routes
the plan reports are the kernels that run, and that every route gives TF's numbers, to the
second order, through tf.function, a SavedModel and conv2d_transpose."""

import functools
import gc
import inspect
import itertools
import json
import sys
import threading

import numpy as np
import pytest
import subproc
import tensorflow as tf

import tf_largeconv as lc
from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv import planning
from tf_largeconv._passes import PerPass
from tf_largeconv._problem import ConvProblem
from tf_largeconv.ops import _dispatch
from tf_largeconv.ops import _routing
from tf_largeconv.ops import _transpose

# (input NHWC, filter HWIO): a 7x7 16->16 filter on two images, where TF's forward kernel
# wins and its backprop kernels lose to the op's FFT passes.
MIXED = ((2, 64, 64, 16), (7, 7, 16, 16))
# TF's forward and input-gradient kernels, the op's filter gradient.
MIXED_INPUT = ((1, 64, 64, 16), (7, 7, 16, 32))
# A 5x5 16->16 filter on 48x48 images, whose routes change three times with the batch.
BATCHED = ((48, 48, 16), (5, 5, 16, 16))
BATCHED_SCHEDULE = (
  (1, (True, True, True)),
  (4, (True, True, False)),
  (8, (True, False, False)),
  (32, (False, False, False)),
)
TF_OPS = {"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"}
OUR_OPS = {"LargeConv>Conv2D", "LargeConv>Conv2DBackpropInput", "LargeConv>Conv2DBackpropFilter"}


def _routes(x_shape, w_shape, dtype=tf.float64):
  p = lc.plan(x_shape, w_shape, 1, "SAME", dtype=dtype)
  return PerPass.of(pp.algorithm == "tf" for pp in p.passes)


def _op_types(fn, *args):
  """Every op type in fn's graph for args, its functions' (the gradient's) included."""
  graph = fn.get_concrete_function(*args).graph
  names = {op.type for op in graph.get_operations()}
  for f in graph.as_graph_def().library.function:
    names |= {n.op for n in f.node_def}
  return names


def _conv_ops(fn, *args):
  return _op_types(fn, *args) & (TF_OPS | OUR_OPS)


def _step(conv, x, w, dy):
  """The forward pass, both gradients and the second-order gradients of
  |dx|^2 + |dw|^2 with respect to x and w."""
  with tf.GradientTape() as outer:
    outer.watch([x, w])
    with tf.GradientTape() as inner:
      inner.watch([x, w])
      y = conv(x, w)
    dx, dw = inner.gradient(y, [x, w], output_gradients=dy)
    norm = tf.reduce_sum(dx * dx) + tf.reduce_sum(dw * dw)
  return [y, dx, dw] + outer.gradient(norm, [x, w])


def _assert_close(got, want, what):
  for g, t, name in zip(got, want, ("y", "dx", "dw", "d2x", "d2w")):
    g, t = g.numpy(), t.numpy()
    np.testing.assert_allclose(
      g, t, rtol=1e-9, atol=1e-9 * np.abs(t).max(), err_msg=f"{what}: {name}"
    )


def test_the_mixed_case_is_routed_per_pass():
  # TF's forward kernel, the op's backprop passes; in float32 as in float64.
  assert _routes(*MIXED) == (True, False, False)
  assert _routes(*MIXED, dtype=tf.float32) == (True, False, False)
  assert _routes(*MIXED_INPUT) == (True, True, False)
  # Where TF's kernels win every pass, or none, the routes agree.
  assert _routes((4, 32, 32, 32), (3, 3, 32, 64)) == (True, True, True)
  assert _routes((1, 64, 64, 8), (31, 31, 8, 8)) == (False, False, False)


def test_routes_follow_the_batch():
  # A larger batch spreads the FFT's filter transforms over more images: MIXED's forward
  # pass runs TF's kernel for up to three images and the op's from four. Routes are
  # planned at powers of two and hold up to the next.
  image, w_shape = MIXED[0][1:], MIXED[1]
  for batch, want in ((1, True), (3, True), (4, False), (5, False), (1000, False)):
    assert _routes((batch,) + image, w_shape) == (want, False, False), batch
  attrs = ConvProblem.conv2d(1, "SAME", "NHWC", None)

  def schedule(x_shape, f_shape):
    return planning.routing.schedule(list(x_shape), list(f_shape), tf.float64, tf.zeros(()), attrs)

  assert schedule([None, *image], w_shape) == (
    (1, (True, False, False)),
    (4, (False, False, False)),
  )
  assert schedule([6, *image], w_shape) == ((1, (False, False, False)),)
  assert schedule([None, *BATCHED[0]], BATCHED[1]) == BATCHED_SCHEDULE
  # Where TF's kernels win every pass of any batch, one entry.
  assert schedule([None, 32, 32, 32], [3, 3, 32, 64]) == ((1, (True, True, True)),)


def test_a_mixed_route_must_pay_for_its_own_cost():
  # Per pass TF's kernel wins the forward pass and the op the others, by less in all than
  # a mixed route's own cost: every pass runs one way.
  penalty = planning.routing.MIXED_ROUTE_SECONDS * planning.routing._CORE.REFERENCE_SLOTS

  def cost(tf_s, ours):
    # A planner's dict prices every algorithm (< 0: not priced); here TF's kernel, the FFT
    # and the direct kernels.
    d = {"cost_" + a: -1.0 for a in _args.OP_ALGORITHMS if a != "auto"}
    d.update(cost_tf=tf_s, cost_fft=ours, cost_direct=10 * ours)
    return d

  mixed = (True, False, False)
  close = [
    cost(1.0e-3, 1.0e-3 + penalty / 4),
    cost(2e-3, 2e-3 - penalty / 4),
    cost(3e-3, 3e-3 - penalty / 4),
  ]
  assert planning.routing._unmixed(close, mixed) == (False, False, False)
  close[0]["cost_fft"] = 1.0e-3 + penalty  # TF's forward kernel now saves enough over ours
  assert planning.routing._unmixed(close, mixed) == (True, True, True)
  far = [cost(1e-3, 3e-3), cost(5e-3, 2e-3), cost(6e-3, 3e-3)]
  assert planning.routing._unmixed(far, mixed) == mixed


def test_an_unknown_batch_runs_the_routes_of_the_batch_it_gets(rng):
  # One graph for every batch holds every route's kernels and picks, at run time, the ones
  # an eager call with that batch runs: the same bits, to the second order, either side of
  # two boundaries (3 | 4 and 7 | 8 images), and with an empty batch.
  image, w_shape = BATCHED
  w = tf.constant(rng.standard_normal(w_shape))
  auto = lambda a, b: lc.conv2d(a, b, 1, "SAME")  # noqa: E731
  fn = tf.function(
    lambda a, b, c: _step(auto, a, b, c),
    input_signature=[
      tf.TensorSpec([None, *image], tf.float64),
      tf.TensorSpec(w_shape, tf.float64),
      tf.TensorSpec([None, *image[:2], w_shape[3]], tf.float64),
    ],
  )
  assert _conv_ops(fn) >= TF_OPS | {
    "LargeConv>Conv2DBackpropInput",
    "LargeConv>Conv2DBackpropFilter",
  }
  for batch in (1, 3, 4, 7, 8):
    x = tf.constant(rng.standard_normal((batch, *image)))
    dy = tf.constant(rng.standard_normal((batch, *image[:2], w_shape[3])))
    got, eager = fn(x, w, dy), _step(auto, x, w, dy)
    for g, e, name in zip(got, eager, ("y", "dx", "dw", "d2x", "d2w")):
      np.testing.assert_array_equal(g.numpy(), e.numpy(), err_msg=f"batch {batch}: {name}")
    _assert_close(
      got, _step(lambda a, b: tf.nn.conv2d(a, b, 1, "SAME"), x, w, dy), f"batch {batch}"
    )
  empty = fn(
    tf.zeros((0, *image), tf.float64), w, tf.zeros((0, *image[:2], w_shape[3]), tf.float64)
  )
  assert empty[0].shape == (0, *image[:2], w_shape[3]) and empty[1].shape == (0, *image)
  np.testing.assert_array_equal(empty[2].numpy(), 0)


def test_an_eager_call_runs_the_kernel_the_full_path_picks(rng):
  # Eager calls look their kernel up by shapes, dtypes, device and arguments
  # (_dispatch.eager_key). In this order each call finds the kernel of the call before it where
  # a key left out a shape, a dtype or an argument: the op's kernel (BATCHED at 32 images),
  # TF's (at one image; in float16 the op's again), routes per pass, other algorithms and
  # layouts. A looked-up kernel must give the bits the full path gives, to second order.
  image, w_shape = BATCHED
  calls = [
    ((32, *image), w_shape, tf.float32, {}),
    ((1, *image), w_shape, tf.float32, {}),
    ((1, *image), w_shape, tf.float16, {}),
    (MIXED[0], MIXED[1], tf.float32, {}),
    (MIXED[0], MIXED[1], tf.float32, {"algorithm": "fft"}),
    (MIXED[0], MIXED[1], tf.float32, {"algorithm": "tf"}),
    (MIXED[0], MIXED[1], tf.float32, {"dilations": 2}),
    (MIXED[0], MIXED[1], tf.float32, {"dilations": [2, 1]}),
    ((2, 16, 64, 64), MIXED[1], tf.float32, {"data_format": "NCHW"}),
  ]
  # Each call takes a filter tensor of its own: a filter tensor seen before may move a call
  # to the op's FFT with kept spectra (test_a_filter_tensor_seen_again_...).
  for x_shape, w_shape, dtype, kwargs in calls:
    x = tf.constant(rng.standard_normal(x_shape), dtype)
    w = tf.constant(rng.standard_normal(w_shape) / w_shape[0], dtype)
    conv = lambda a, b, kwargs=kwargs: lc.conv2d(  # noqa: E731
      a, tf.identity(b), strides=1, padding="SAME", **kwargs
    )
    dy = tf.ones(conv(x, w).shape, dtype)
    first = _step(conv, x, w, dy)
    _dispatch.EAGER_KERNELS.clear()
    want = _step(conv, x, w, dy)
    again = _step(conv, x, w, dy)
    for f, t, a, name in zip(first, want, again, ("y", "dx", "dw", "d2x", "d2w")):
      what = f"{x_shape} {w_shape} {dtype.name} {kwargs}: {name}"
      np.testing.assert_array_equal(f.numpy(), t.numpy(), err_msg=what)
      np.testing.assert_array_equal(a.numpy(), t.numpy(), err_msg=what)


def test_each_pass_runs_the_kernel_its_route_names(rng):
  x = tf.constant(rng.standard_normal(MIXED[0]))
  w = tf.constant(rng.standard_normal(MIXED[1]))
  dy = tf.constant(rng.standard_normal(MIXED[0][:3] + MIXED[1][3:]))

  def grads(algorithm):
    def fn(a, b, c):
      with tf.GradientTape() as tape:
        tape.watch([a, b])
        y = lc.conv2d(a, b, 1, "SAME", algorithm=algorithm)
      return tape.gradient(y, [a, b], output_gradients=c)

    return tf.function(fn)

  assert _conv_ops(grads("auto"), x, w, dy) == {
    "Conv2D",
    "LargeConv>Conv2DBackpropInput",
    "LargeConv>Conv2DBackpropFilter",
  }
  assert _conv_ops(grads("tf"), x, w, dy) == TF_OPS
  assert _conv_ops(grads("fft"), x, w, dy) == OUR_OPS


@pytest.mark.parametrize("case", [MIXED, MIXED_INPUT], ids=["tf-op-op", "tf-tf-op"])
def test_mixed_routes_give_tensorflows_values_to_the_second_order(rng, case):
  x_shape, w_shape = case
  x = tf.constant(rng.standard_normal(x_shape))
  w = tf.constant(rng.standard_normal(w_shape))
  dy = tf.constant(rng.standard_normal(x_shape[:3] + w_shape[3:]))
  want = _step(lambda a, b: tf.nn.conv2d(a, b, 1, "SAME"), x, w, dy)
  auto = lambda a, b: lc.conv2d(a, b, 1, "SAME")  # noqa: E731
  _assert_close(_step(auto, x, w, dy), want, "eager")
  _assert_close(tf.function(lambda a, b, c: _step(auto, a, b, c))(x, w, dy), want, "tf.function")
  # Unknown batch size: the routes are chosen at run time, by the batch; an empty one too.
  spec = tf.TensorSpec([None] + list(x_shape[1:]), tf.float64)
  fn = tf.function(
    lambda a, b, c: _step(auto, a, b, c),
    input_signature=[
      spec,
      tf.TensorSpec(w_shape, tf.float64),
      tf.TensorSpec([None] + list(dy.shape[1:]), tf.float64),
    ],
  )
  _assert_close(fn(x, w, dy), want, "unknown batch")
  empty = fn(x[:0], w, dy[:0])
  assert empty[0].shape == (0,) + tuple(dy.shape[1:]) and empty[1].shape == (0,) + x_shape[1:]
  np.testing.assert_array_equal(empty[2].numpy(), 0)


def test_mixed_routes_through_a_savedmodel(rng, tmp_path):
  x = tf.constant(rng.standard_normal(MIXED[0]))
  w = tf.Variable(rng.standard_normal(MIXED[1]))

  class Module(tf.Module):
    def __init__(self):
      super().__init__()
      self.w = w

    @tf.function(input_signature=[tf.TensorSpec([None] + list(MIXED[0][1:]), tf.float64)])
    def __call__(self, a):
      return lc.conv2d(a, self.w, 1, "SAME")

  tf.saved_model.save(Module(), str(tmp_path / "m"))
  loaded = tf.saved_model.load(str(tmp_path / "m"))

  def grads(fn):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = fn(x)
      loss = tf.reduce_sum(y * y)
    return [y] + tape.gradient(loss, [x, loaded.w if fn is loaded else w])

  want = grads(lambda a: tf.nn.conv2d(a, w, 1, "SAME"))
  for got, ref, name in zip(grads(loaded), want, ("y", "dx", "dw")):
    np.testing.assert_allclose(
      got.numpy(), ref.numpy(), rtol=1e-9, atol=1e-9 * np.abs(ref.numpy()).max(), err_msg=name
    )


def test_conv2d_transpose_routes_its_passes_as_the_conv2d_it_transposes(rng):
  # The transpose's forward pass is the conv2d's backprop_input pass: the op's here; its
  # input gradient is the conv2d's forward pass: TF's kernel.
  out_shape = MIXED[0]
  x = tf.constant(rng.standard_normal(out_shape[:3] + MIXED[1][3:]))
  w = tf.constant(rng.standard_normal(MIXED[1]))
  dy = tf.constant(rng.standard_normal(out_shape))
  fn = tf.function(
    lambda a, b, c: _step(lambda p, q: lc.conv2d_transpose(p, q, out_shape, 1), a, b, c)
  )
  assert _conv_ops(fn, x, w, dy) >= {
    "Conv2D",
    "LargeConv>Conv2DBackpropInput",
    "LargeConv>Conv2DBackpropFilter",
  }
  want = _step(lambda p, q: tf.nn.conv2d_transpose(p, q, out_shape, 1), x, w, dy)
  _assert_close(fn(x, w, dy), want, "conv2d_transpose")


def _recorded(fn, log, entry):
  """fn, appending entry(its keyword arguments) to `log` on each call."""

  def call(*args, **kwargs):
    log.append(entry(kwargs))
    return fn(*args, **kwargs)

  return call


def test_the_route_op_passes_its_input_on_and_routes_each_gradient(rng, monkeypatch):
  # LargeConv>Conv2DRoute returns its first input as it is and gives it no gradient, so
  # the kernel that computed it takes no part; the input's and filter's gradients run on
  # the kernels its routes name.
  x_shape, w_shape = MIXED_INPUT
  x = tf.constant(rng.standard_normal(x_shape))
  w = tf.constant(rng.standard_normal(w_shape))
  dy = tf.constant(rng.standard_normal(x_shape[:3] + w_shape[3:]))
  y = tf.nn.conv2d(x, w, 1, "SAME")
  attrs = ConvProblem.conv2d(1, "SAME", "NHWC", None)
  calls = []
  for module, name in (
    (tf.raw_ops, "Conv2DBackpropInput"),
    (tf.raw_ops, "Conv2DBackpropFilter"),
    (_loader.ops(), "large_conv_conv2d_backprop_input"),
    (_loader.ops(), "large_conv_conv2d_backprop_filter"),
  ):
    monkeypatch.setattr(
      module, name, _recorded(getattr(module, name), calls, lambda _, name=name: name)
    )
  route = _loader.ops().large_conv_conv2d_route
  spec = _routing.route_spec(attrs, (True, True, False))
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([y, x, w])
    out = route(y, x, w, route=spec)
  np.testing.assert_array_equal(out.numpy(), y.numpy())
  got = tape.gradient(out, [y, x, w], output_gradients=dy)
  assert got[0] is None
  assert calls == ["Conv2DBackpropInput", "large_conv_conv2d_backprop_filter"]
  with tf.GradientTape() as t:
    t.watch([x, w])
    z = tf.nn.conv2d(x, w, 1, "SAME")
  want = t.gradient(z, [x, w], output_gradients=dy)
  for g, e, name in zip(got[1:], want, ("dx", "dw")):
    np.testing.assert_allclose(
      g.numpy(), e.numpy(), rtol=1e-9, atol=1e-9 * np.abs(e.numpy()).max(), err_msg=name
    )
  with pytest.raises(tf.errors.InvalidArgumentError, match="route must be the JSON"):
    route(y, x, w, route="")
  for bad, message in (
    ("{", "route must be the JSON"),
    (spec.replace("true, true, false", "true, false"), "one route per pass"),
    (spec.replace("true, true, false", "1, 1, 0"), "as booleans"),
    (spec.replace('"transpose": false', '"transpose": 0'), "as booleans"),
  ):
    assert bad != spec
    with tf.GradientTape() as tape:
      tape.watch([y, x, w])
      out = route(y, x, w, route=bad)
    with pytest.raises(ValueError, match=message):
      tape.gradient(out, [x, w], output_gradients=dy)


def test_eager_mixed_routes_take_their_gradient_from_the_route_op(rng, monkeypatch):
  # An eager call records the gradient as the route op's (which costs an eager call a
  # fifth of what tf.custom_gradient costs); a traced one as tf.custom_gradient's, which
  # costs a graph nothing at run time and keeps the op out of it.
  x = tf.constant(rng.standard_normal(MIXED[0]))
  w = tf.constant(rng.standard_normal(MIXED[1]))
  dy = tf.constant(rng.standard_normal(MIXED[0][:3] + MIXED[1][3:]))
  callers = []
  for name in ("routed_input_gradient", "routed_filter_gradient"):
    monkeypatch.setattr(
      _routing,
      name,
      _recorded(getattr(_routing, name), callers, lambda _: inspect.stack()[2].function),
    )
  auto = lambda a, b: lc.conv2d(a, b, 1, "SAME")  # noqa: E731

  def grads(a, b, c):
    with tf.GradientTape() as tape:
      tape.watch([a, b])
      y = auto(a, b)
    return tape.gradient(y, [a, b], output_gradients=c)

  eager = grads(x, w, dy)
  assert callers == ["_route_grad"] * 2
  callers.clear()
  fn = tf.function(grads)
  traced = fn(x, w, dy)
  assert callers == ["<lambda>"] * 2
  assert "LargeConv>Conv2DRoute" not in _op_types(fn, x, w, dy)
  for e, t, name in zip(eager, traced, ("dx", "dw")):
    np.testing.assert_array_equal(e.numpy(), t.numpy(), err_msg=name)


def test_an_eager_conv2d_transpose_takes_its_gradient_from_the_route_op(rng, monkeypatch):
  # As conv2d's: the route op (with `transpose`) in eager execution, tf.custom_gradient when
  # traced, the same kernels and bits either way, to the second order.
  out_shape = MIXED[0]
  x = tf.constant(rng.standard_normal(out_shape[:3] + MIXED[1][3:]))
  w = tf.constant(rng.standard_normal(MIXED[1]))
  dy = tf.constant(rng.standard_normal(out_shape))
  callers = []
  for name in ("routed_input_gradient", "routed_filter_gradient"):
    monkeypatch.setattr(
      _transpose,
      name,
      _recorded(getattr(_transpose, name), callers, lambda _: inspect.stack()[2].function),
    )
  conv = lambda p, q: lc.conv2d_transpose(p, q, out_shape, 1)  # noqa: E731
  eager = _step(conv, x, w, dy)
  assert callers == ["_route_grad"] * 2
  callers.clear()
  traced = tf.function(lambda a, b, c: _step(conv, a, b, c))(x, w, dy)
  assert callers == ["<lambda>"] * 2
  for e, t, name in zip(eager, traced, ("y", "dx", "dw", "d2x", "d2w")):
    np.testing.assert_array_equal(e.numpy(), t.numpy(), err_msg=name)
  want = _step(lambda p, q: tf.nn.conv2d_transpose(p, q, out_shape, 1), x, w, dy)
  _assert_close(eager, want, "eager conv2d_transpose")


@pytest.mark.parametrize(
  "routes",
  list(itertools.product([True, False], repeat=3)),
  ids=lambda r: "".join("t" if v else "o" for v in r),
)
def test_every_route_gives_tensorflows_values_with_strides_and_padding(rng, routes):
  # Each of the eight routes, whatever the planner would pick, eager (the route op) and
  # traced (tf.custom_gradient): TF's values to the second order and the same bits, with
  # strides, odd sizes and explicit padding.
  x = tf.constant(rng.standard_normal((2, 11, 13, 3)))
  w = tf.constant(rng.standard_normal((3, 4, 3, 5)))
  for strides, padding in ((2, "SAME"), ([2, 1], [[0, 0], [1, 2], [3, 0], [0, 0]]), (1, "VALID")):
    attrs = ConvProblem.conv2d(strides, padding, "NHWC", None)
    conv = _routing.routed(((1, PerPass.of(routes)),), attrs)
    tf_conv = functools.partial(tf.nn.conv2d, strides=strides, padding=padding)
    dy = tf.constant(rng.standard_normal(tf_conv(x, w).shape))
    what = f"routes {routes}, strides {strides}, padding {padding}"
    eager = _step(conv, x, w, dy)
    _assert_close(eager, _step(tf_conv, x, w, dy), what)
    traced = tf.function(lambda a, b, c, conv=conv: _step(conv, a, b, c))(x, w, dy)
    for e, t, name in zip(eager, traced, ("y", "dx", "dw", "d2x", "d2w")):
      np.testing.assert_array_equal(e.numpy(), t.numpy(), err_msg=f"{what}: {name}")


# A 9x9 16->16 filter on one 32x32 image: TF's kernels win every pass of a first call, and
# the op's FFT wins the forward pass once the filter's spectra are kept.
KEPT = ((1, 32, 32, 16), (9, 9, 16, 16))
SPECTRUM_ENV = "LARGECONV_SPECTRUM_CACHE_MIB"


def _kept_bytes(x_shape, w_shape, dtype, routes):
  key = ConvProblem.conv2d(1, "SAME", "NHWC", None)
  return planning.kept_spectra.kept_spectra_bytes(
    tuple(x_shape), tuple(w_shape), key, dtype.name, routes
  )


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_a_filter_tensor_seen_again_runs_the_ffts_kept_spectra(rng, dtype, monkeypatch):
  # A first call runs TF's kernel; a call with a filter tensor seen among the last few
  # (eager tensors are immutable) runs the op's FFT, whose spectra the op keeps: its bits,
  # and TF's gradients (the route's), to the second order. A new tensor of the same values
  # is a first sight again.
  monkeypatch.setenv(SPECTRUM_ENV, "64")
  x_shape, w_shape = KEPT
  routes = _routes(x_shape, w_shape, dtype)
  assert routes[0]
  kept_bytes = _kept_bytes(x_shape, w_shape, dtype, routes)
  assert 0 < kept_bytes < 64 * 2**20
  x = tf.constant(rng.standard_normal(x_shape), dtype)
  w = tf.constant(rng.standard_normal(w_shape) / 9, dtype)
  dy = tf.constant(rng.standard_normal(x_shape[:3] + w_shape[3:]), dtype)
  on_tf = tf.nn.conv2d(x, w, 1, "SAME").numpy()
  on_fft = lc.conv2d(x, w, 1, "SAME", algorithm="fft").numpy()
  assert not np.array_equal(on_tf, on_fft)  # the two kernels are told apart by their bits
  np.testing.assert_allclose(
    on_fft,
    on_tf,
    rtol=1e-4 if dtype == tf.float32 else 1e-9,
    atol=(1e-4 if dtype == tf.float32 else 1e-9) * np.abs(on_tf).max(),
  )
  auto = lambda a, b: lc.conv2d(a, b, 1, "SAME")  # noqa: E731
  np.testing.assert_array_equal(auto(x, w).numpy(), on_tf)  # first sight
  for _ in range(3):
    np.testing.assert_array_equal(auto(x, w).numpy(), on_fft)
  np.testing.assert_array_equal(auto(x, tf.identity(w)).numpy(), on_tf)
  # The gradients are the route's, as a first sight's; the forward pass the FFT's.
  got = _step(auto, x, w, dy)
  want = _step(lambda a, b: auto(a, tf.identity(b)), x, w, dy)
  np.testing.assert_array_equal(got[0].numpy(), on_fft)
  np.testing.assert_array_equal(want[0].numpy(), on_tf)
  for g, t, name in zip(got[1:], want[1:], ("dx", "dw", "d2x", "d2w")):
    np.testing.assert_array_equal(g.numpy(), t.numpy(), err_msg=name)
  # An explicit algorithm never moves: 'tf' runs TF's kernel on every call.
  for _ in range(2):
    np.testing.assert_array_equal(lc.conv2d(x, w, 1, "SAME", algorithm="tf").numpy(), on_tf)


def test_kept_spectra_need_the_budget_and_a_recent_filter(rng, monkeypatch):
  # The move needs the cache's budget (read on every call, as the op reads it) to hold the
  # spectra, and the filter among the last FILTERS seen for the same shapes: a cycle of
  # that many filters moves, one more does not.
  x_shape, w_shape = KEPT
  kept_bytes = _kept_bytes(x_shape, w_shape, tf.float32, _routes(x_shape, w_shape, tf.float32))
  x = tf.constant(rng.standard_normal(x_shape), tf.float32)
  filters = [tf.constant(rng.standard_normal(w_shape) / 9, tf.float32) for _ in range(5)]
  on_tf = [tf.nn.conv2d(x, w, 1, "SAME").numpy() for w in filters]
  auto = lambda w: lc.conv2d(x, w, 1, "SAME").numpy()  # noqa: E731
  monkeypatch.setenv(SPECTRUM_ENV, str(kept_bytes // 2**20))  # whole MiB below the bytes
  assert kept_bytes > (kept_bytes // 2**20) * 2**20
  for _ in range(2):
    np.testing.assert_array_equal(auto(filters[0]), on_tf[0])
  monkeypatch.setenv(SPECTRUM_ENV, str(kept_bytes // 2**20 + 1))
  assert not np.array_equal(auto(filters[0]), on_tf[0])
  # Filters that moved share the budget: while filters[0] lives, filters[1] does not fit
  # beside it, and moves once filters[0] is gone.
  for _ in range(3):
    np.testing.assert_array_equal(auto(filters[1]), on_tf[1])
  del filters[0], on_tf[0]
  gc.collect()
  auto(filters[0])
  assert not np.array_equal(auto(filters[0]), on_tf[0])
  # The last FILTERS distinct filter tensors: a cycle of that many moves from its second
  # round, one more never does; a filter run again becomes the last.
  monkeypatch.setenv(SPECTRUM_ENV, "64")
  remembered = _dispatch.KeptSpectraRoute.FILTERS
  assert remembered == 4

  def fresh(count):
    ws = [tf.constant(rng.standard_normal(w_shape) / 9, tf.float32) for _ in range(count)]
    return ws, [tf.nn.conv2d(x, w, 1, "SAME").numpy() for w in ws]

  for rounds, count in ((2, remembered), (3, remembered + 1)):
    ws, want = fresh(count)
    for i in range(rounds * count):
      moved = not np.array_equal(auto(ws[i % count]), want[i % count])
      assert moved == (count <= remembered and i >= count), (count, i)
  ws, want = fresh(5)
  sequence = [0, 4, 0, 1, 0, 2, 0, 3, 0]  # 0 stays among the last four throughout
  moved = [not np.array_equal(auto(ws[j]), want[j]) for j in sequence]
  assert moved == [False, False, True, False, True, False, True, False, True]


def test_kept_spectra_are_weighed_against_the_forward_route():
  # The move is priced against the route's forward pass: TF's kernel, or the op's direct
  # kernels; where the op's own choice is the FFT its spectra are kept anyway.
  for shape, moves in (
    (KEPT, True),
    # A 31x31 filter: the op's choice is its FFT, spectra kept or not.
    (((1, 64, 64, 8), (31, 31, 8, 8)), False),
    # A 3x3 filter on 32 channels: TF's kernel beats the FFT even with
    # kept spectra.
    (((4, 32, 32, 32), (3, 3, 32, 64)), False),
  ):
    routes = _routes(*shape, tf.float32)
    assert (_kept_bytes(*shape, tf.float32, routes) > 0) == moves, shape


# kept_spectra_bytes for each (input, filter, padding) of argv[1], priced as oneDNN's kernels
# (TF's default on CPUs with AVX512_VNNI and the like) on two threads, with the routes an
# eager call of that batch runs (routing.schedule).
_KEPT_UNDER_ONEDNN_CHILD = """
import json
import sys
import tensorflow as tf
tf.config.threading.set_intra_op_parallelism_threads(2)
from tf_largeconv._problem import ConvProblem
from tf_largeconv import _loader
from tf_largeconv.planning import kept_spectra
from tf_largeconv.planning import routing
with tf.device("CPU:0"):
  placed = tf.zeros(())
kept = []
for x_shape, f_shape, padding in json.loads(sys.argv[1]):
  attrs = ConvProblem.conv2d(1, padding, "NHWC", None)
  schedule = routing.schedule(x_shape, f_shape, tf.float32, placed, attrs)
  kept.append(kept_spectra.kept_spectra_bytes(
      tuple(x_shape), tuple(f_shape), attrs, "float32",
      routing.at_batch(schedule, x_shape[0])))
print(json.dumps({"kernels": _loader.core().tf_kernels(), "kept": kept}))
"""


def test_kept_spectra_move_only_past_the_models_error():
  # Priced as oneDNN's kernels, a small filter bank over a grayscale photograph (5x5 1->3
  # on 2x321x481) has the op's FFT with kept spectra a few percent under TF's forward
  # kernel: less than the model's own error (KEPT_SPECTRA_MARGIN), so the forward pass
  # stays on TF's kernel. 7x7 128->128 on one 64x64 image, priced at half of it, moves.
  cases = [
    (((2, 321, 481, 1), (5, 5, 1, 3), "VALID"), False),
    (((2, 321, 481, 1), (5, 5, 1, 3), "SAME"), False),
    (((1, 64, 64, 128), (7, 7, 128, 128), "SAME"), True),
  ]
  env = subproc.child_env(TF_ENABLE_ONEDNN_OPTS="1")
  got = json.loads(
    subproc.run(
      _KEPT_UNDER_ONEDNN_CHILD, json.dumps([c for c, _ in cases]), timeout=300, env=env
    ).stdout
  )
  assert got["kernels"] == "onednn"
  assert [kept > 0 for kept in got["kept"]] == [moves for _, moves in cases], got["kept"]


def _in_threads(work, count=4):
  """Runs work(t) in `count` threads at once, switching between any two bytecodes so that
  races show, each bounded in time; raises the first exception a thread raised."""
  errors = []

  def run(t):
    try:
      work(t)
    except Exception as e:
      errors.append(e)

  threads = [threading.Thread(target=run, args=(t,)) for t in range(count)]
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)
  try:
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=120)
  finally:
    sys.setswitchinterval(interval)
  assert not any(t.is_alive() for t in threads)
  assert not errors, errors[0]


def test_threads_share_a_kept_spectra_route(rng, monkeypatch):
  # Threads serving one model call one eager kernel: each call runs one of the two kernels
  # and gives TF's values to the FFT's accuracy, whatever the others do meanwhile.
  monkeypatch.setenv(SPECTRUM_ENV, "64")
  x_shape, w_shape = KEPT
  x = tf.constant(rng.standard_normal(x_shape), tf.float32)
  filters = [tf.constant(rng.standard_normal(w_shape) / 9, tf.float32) for _ in range(3)]
  want = [tf.nn.conv2d(x, w, 1, "SAME").numpy() for w in filters]

  def serve(t):
    for i in range(40):
      j = (t + i) % len(filters)
      w = filters[j] if i % 2 else tf.identity(filters[j])  # first sights between
      got = lc.conv2d(x, w, 1, "SAME").numpy()
      np.testing.assert_allclose(got, want[j], rtol=1e-4, atol=1e-4 * np.abs(want[j]).max())

  _in_threads(serve)
  # The route's own bookkeeping, alone and fast, so that threads collide in it: a filter
  # seen for the first time always runs the first kernel.
  route = _dispatch.KeptSpectraRoute(lambda x, w: "first", lambda x, w: "again", 1)

  class Filter:  # a weakly referable stand-in
    pass

  def churn(_):
    kept = Filter()
    for _ in range(2000):
      assert route(None, Filter()) == "first"
      route(None, kept)

  _in_threads(churn)
