"""'auto' on a GPU: the route between TensorFlow's own kernel (cuDNN) and the CUDA kernels,
checked on the CPU against the step times measured on an H100 (benchmarks/results/gpu/, from
benchmarks/gpu/bench.py), and the graph it builds for a tensor placed on a GPU."""

import glob
import json
import os

import pytest
import tensorflow as tf

import tf_largeconv as lc
from benchmarks.gpu.cases import CASES
from benchmarks.gpu.cases import STRIDES
from tf_largeconv import planning
from tf_largeconv._problem import ConvProblem

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GPU_RESULTS = os.path.join(ROOT, "benchmarks", "results", "gpu")


def _measured():
  """{case: {method: median ms}} from the latest run of each case (file names sort by run)."""
  rows = {}
  for path in sorted(glob.glob(os.path.join(GPU_RESULTS, "bench_h100_*.json"))):
    run = {}
    with open(path) as f:
      for r in json.load(f):
        if "ms" in r:
          run.setdefault(r["case"], {})[r["method"]] = r["ms"][1]
    rows.update(run)
  return rows


MEASURED = _measured()


def _route(name, algorithm="auto"):
  x_shape, w_shape, padding, _, dtype = CASES[name]
  s = STRIDES.get(name, 1)
  attrs = ConvProblem.conv2d([1, 1, s, s], padding, "NCHW", None, algorithm=algorithm)
  image = (1,) + tuple(x_shape[1:])
  if not planning.routing.tf_kernel_eligible(image, w_shape, attrs, tf.as_dtype(dtype), "GPU"):
    return None
  return planning.routing.device_routes(image, tuple(w_shape), attrs, dtype, "GPU").forward


@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_route_takes_the_faster_of_cudnn_and_ours_as_measured(name):
  times = MEASURED[name]
  # TensorFlow runs cuDNN with TF32 on for float32: the bench's "cudnn tf32" row.
  cudnn = times.get("cudnn tf32", times["cudnn"])
  ours = next(ms for method, ms in times.items() if method.startswith("ours auto:"))
  route = _route(name)
  if route is None:  # grouped (depthwise): TF's kernel is not weighed, ours runs
    assert CASES[name][1][2] != CASES[name][0][1]
    assert ours < cudnn, (name, ours, cudnn)
    return
  assert route == (cudnn < ours), (
    name,
    "routes to",
    "cuDNN" if route else "ours",
    "measured ms: cuDNN",
    cudnn,
    "ours",
    ours,
  )


def test_the_measurements_cover_both_routes():
  routes = {name: _route(name) for name in CASES}
  assert {n for n, r in routes.items() if r} == {
    "k3_train",
    "k7_train_f16",
    "k15_train_f16",
    "k31_c64_train",
    "k31_c64_train_f16",
    "transpose31_train",
  }
  assert routes["seed_forward"] is False and routes["k63_train"] is False


def test_gpu_route_of_an_explicit_tf_request():
  assert _route("k63_train", algorithm="tf") is True


class _Placed:
  def __init__(self, device):
    self.device = device


def test_runs_on_gpu_follows_the_tensors_device():
  assert planning.device.runs_on_gpu(_Placed("/job:localhost/replica:0/task:0/device:GPU:0"))
  assert not planning.device.runs_on_gpu(_Placed("/job:localhost/replica:0/task:0/device:CPU:0"))
  assert planning.device.runs_on_gpu(_Placed("")) == bool(tf.config.list_logical_devices("GPU"))
  with tf.device("/CPU:0"):
    assert not planning.device.runs_on_gpu(tf.constant(1.0))


def test_gpu_eligibility():
  attrs = ConvProblem.conv2d(1, "SAME", "NCHW", 2)
  x, w = (1, 64, 56, 56), (3, 3, 64, 64)
  # NCHW, dilated, float16: cuDNN runs it; TF's CPU kernels do not.
  assert planning.routing.tf_kernel_eligible(x, w, attrs, tf.float16, "GPU")
  assert not planning.routing.tf_kernel_eligible(x, w, attrs, tf.float16, "CPU")
  assert not planning.routing.tf_kernel_eligible(x, w, attrs, tf.float64, "GPU")
  assert not planning.routing.tf_kernel_eligible(x, (3, 3, 32, 64), attrs, tf.float32, "GPU")


def _graph_kernels(w_shape, device):
  """The convolution op types in conv2d's graph for an input placed on `device`."""
  x_spec = tf.TensorSpec([2, 56, 56, w_shape[2]], tf.float16)

  def f(x):
    with tf.device(device):
      x = tf.identity(x)
    w = tf.zeros(w_shape, tf.float16)
    return lc.conv2d(x, w, 1, "SAME")

  graph = tf.function(f).get_concrete_function(x_spec).graph
  return sorted({op.type for op in graph.get_operations() if "Conv2D" in op.type})


def test_graph_on_a_gpu_routes_medium_filters_to_tensorflows_kernel():
  # float16 is never TF's kernel on the CPU: only the GPU route can pick it. The graph is
  # only built here (the CPU wheel has no GPU to run it on).
  assert _graph_kernels((15, 15, 64, 64), "/GPU:0") == ["Conv2D"]
  assert _graph_kernels((15, 15, 64, 64), "/CPU:0") == ["LargeConv>Conv2D"]
  assert _graph_kernels((63, 63, 16, 16), "/GPU:0") == ["LargeConv>Conv2D"]
