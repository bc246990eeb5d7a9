"""The TensorFlow ops on a GPU: conv2d, conv3d and their gradients placed on /GPU:0 run the
CUDA kernels (direct and FFT) and match the float64 oracles. Skipped, with the reason, where
TensorFlow sees no GPU (the CPU wheel); LARGECONV_REQUIRE_GPU=1 makes that a failure."""

import pytest
import tensorflow as tf
from cases import attrs
from cases import gpu_required
from reference import Conv
from reference import planned_fft

import tf_largeconv as lc

GPUS = tf.config.list_physical_devices("GPU")


@pytest.fixture(autouse=True)
def _gpu():
  if GPUS:
    return
  reason = "TensorFlow sees no GPU"
  if gpu_required():
    pytest.fail(f"LARGECONV_REQUIRE_GPU is set but {reason}")
  pytest.skip(reason)


CASES = [
  ((2, 40, 37, 3), (31, 29, 3, 4), (1, 1), "SAME", (1, 1)),
  ((1, 33, 30, 4), (5, 4, 2, 6), (2, 1), ((2, 1), (0, 3)), (2, 1)),  # grouped, explicit
]


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("dtype_name", ["float32", "float16"])
@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("case", CASES)
def test_ops_on_the_gpu_match_the_oracle(rng, case, data_format, dtype_name, algorithm):
  from tf_largeconv import _cuda

  x_shape, w_shape, strides, padding, dilations = case
  if data_format == "NCHW":
    x_shape = (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
  s, pad, ex, d = attrs(strides, padding, dilations, data_format)
  pad_arg = pad if pad != "EXPLICIT" else [ex[i : i + 2] for i in range(0, 8, 2)]
  ref = Conv(x_shape, w_shape, strides, padding, dilations, data_format)
  dtype = tf.as_dtype(dtype_name)
  with tf.device("/GPU:0"):
    x = tf.cast(rng.standard_normal(x_shape), dtype)
    w = tf.cast(rng.standard_normal(w_shape), dtype)
    dy = tf.cast(rng.standard_normal(ref.output_shape()), dtype)
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = lc.conv2d(x, w, s, pad_arg, data_format=data_format, dilations=d, algorithm=algorithm)
    dx, dw = tape.gradient(y, [x, w], output_gradients=dy)
  for t in (y, dx, dw):
    assert t.device.endswith("GPU:0"), t.device
  fft = planned_fft(
    _cuda.plan(
      list(x_shape),
      list(w_shape),
      s,
      pad,
      explicit_paddings=ex,
      data_format=data_format,
      dilations=d,
      algorithm=algorithm,
      dtype=dtype_name,
    )
  )
  assert all((f is not None) == (algorithm == "fft") for f in fft.values()), fft
  as64 = lambda t: tf.cast(t, tf.float64).numpy()  # noqa: E731
  ref.check_passes(
    dtype_name,
    fft,
    as64(x),
    as64(w),
    as64(dy),
    as64(y),
    as64(dx),
    as64(dw),
    what=f"GPU ({algorithm}) ",
  )


@pytest.mark.parametrize(
  "w_shape,kernel", [((3, 3, 16, 16), "Conv2D"), ((41, 41, 2, 2), "LargeConv>Conv2D")]
)
def test_auto_on_the_gpu_routes_by_the_cuda_planner(rng, w_shape, kernel):
  # cuDNN for a small filter with channels, ours for a large one; both match TF's own conv.
  x_shape = (2, 64, 64, w_shape[2])
  with tf.device("/GPU:0"):
    x = tf.constant(rng.standard_normal(x_shape), tf.float32)
    w = tf.constant(rng.standard_normal(w_shape) / (w_shape[0] * w_shape[1]), tf.float32)
    f = tf.function(lambda a, b: lc.conv2d(a, b, 1, "SAME"))
    graph = f.get_concrete_function(x, w).graph
    kernels = {op.type for op in graph.get_operations() if "Conv2D" in op.type}
    assert kernels == {kernel}, kernels
    got = f(x, w)
    want = tf.nn.conv2d(x, w, 1, "SAME")
  assert float(tf.reduce_max(tf.abs(got - want))) <= 1e-3 * float(tf.reduce_max(tf.abs(want)))


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("case", ["grouped_ncdhw", "strided_dilated_ncdhw", "same_strided"])
def test_conv3d_ops_on_the_gpu_match_the_oracle(rng, case, algorithm):
  """The Conv3D ops placed on /GPU:0 run the CUDA kernels' 3-D passes."""
  from reference3d import PASSES
  from reference3d import check
  from reference3d import problem

  from tf_largeconv import _cuda

  oracle, x, w, dy, a = problem(case, rng, "float32")
  with tf.device("/GPU:0"):
    xt, wt, dyt = (tf.constant(v) for v in (x, w, dy))
    with tf.GradientTape() as tape:
      tape.watch([xt, wt])
      y = lc.conv3d(
        xt,
        wt,
        a["strides"],
        a["padding"],
        data_format=a["data_format"],
        dilations=a["dilations"],
        algorithm=algorithm,
      )
    dx, dw = tape.gradient(y, [xt, wt], output_gradients=dyt)
  plans = _cuda.plan3d(list(x.shape), list(w.shape), **a, algorithm=algorithm)
  fft = {p["pass"]: (p["fft"] if p["algorithm"] == "fft" else None) for p in plans}
  for pass_name, got in zip(PASSES, (y, dx, dw)):
    assert got.device.endswith("GPU:0"), got.device
    check(oracle, pass_name, got.numpy(), x, w, dy, "float32", fft[pass_name])
