"""When the op library cannot be loaded, `import tf_largeconv` still succeeds: it warns once
with the reason and the rebuild command, and every op runs the portable path (stock TF
ops), with the same results. Each case runs in a child process over a copy of the package
whose op library is broken the way users meet it: built against another TensorFlow
(a TF upgrade), or not a loadable library at all (an ABI mismatch, a truncated install)."""

import glob
import os
import re
import shutil

import pytest
import subproc

import tf_largeconv

CHILD = r"""
import warnings

import numpy as np
import tensorflow as tf

with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  import tf_largeconv as lc
  import tf_largeconv.keras  # noqa: F401  (the layers import the ops too)
ours = [str(w.message) for w in caught if "tf_largeconv" in str(w.message)]
assert len(ours) == 1, ours
print("WARNING:", ours[0])
print("FILE:", lc.__file__)
assert lc._loader.failure() is not None
report = lc.info()
assert report["fallback"] == lc._loader.failure() and not report["cpu_kernels"], report
assert not report["gpu_kernels"], report
print("BUILT:", report["tensorflow_built"])

rng = np.random.default_rng(0)
x = tf.constant(rng.standard_normal((2, 40, 37, 3)))
f = tf.constant(rng.standard_normal((9, 8, 3, 4)))
dw = tf.constant(rng.standard_normal((7, 7, 3, 2)))


def close(a, b):
  a, b = np.asarray(a), np.asarray(b)
  assert a.shape == b.shape, (a.shape, b.shape)
  np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9 * np.abs(b).max())


for kw in (dict(strides=1, padding="SAME"), dict(strides=[2, 3], padding="VALID"),
           dict(strides=1, padding="SAME", dilations=[2, 1])):
  close(lc.conv2d(x, f, **kw), tf.nn.conv2d(x, f, **kw))
close(lc.conv2d(x, f, 1, "SAME", algorithm="tf"), tf.nn.conv2d(x, f, 1, "SAME"))
close(lc.depthwise_conv2d(x, dw, [1, 2, 2, 1], "SAME"),
      tf.nn.depthwise_conv2d(x, dw, [1, 2, 2, 1], "SAME"))

dy = tf.constant(rng.standard_normal((2, 20, 13, 4)))
kw = dict(strides=[1, 2, 3, 1], padding="SAME")
close(lc.conv2d_backprop_input([2, 40, 37, 3], f, dy, **kw),
      tf.compat.v1.nn.conv2d_backprop_input([2, 40, 37, 3], f, dy, **kw))
close(lc.conv2d_backprop_filter(x, [9, 8, 3, 4], dy, **kw),
      tf.compat.v1.nn.conv2d_backprop_filter(x, [9, 8, 3, 4], dy, **kw))
with tf.GradientTape(persistent=True) as tape:
  tape.watch([x, f])
  y_ours = lc.conv2d(x, f, 2, "SAME")
  y_tf = tf.nn.conv2d(x, f, 2, "SAME")
for a, b in zip(tape.gradient(y_ours, [x, f]), tape.gradient(y_tf, [x, f])):
  close(a, b)

graph = tf.function(lambda a: lc.conv2d(a, f, 1, "SAME")).get_concrete_function(x).graph
types = {op.type for op in graph.get_operations()}
assert not any(t.startswith("LargeConv") for t in types), types

for algorithm in ("direct", "fft"):
  try:
    lc.conv2d(x, f, 1, "SAME", algorithm=algorithm)
    raise AssertionError(algorithm + " ran")
  except ValueError as e:
    assert "could not be loaded" in str(e) and "'portable'" in str(e), e

text = str(lc.plan([2, 40, 37, 3], [9, 8, 3, 4], 1, "SAME"))
assert "every pass runs the portable path" in text, text

import keras  # noqa: E402
layer = lc.keras.LargeConv2D(4, 9, padding="same", dtype="float64")
ref = keras.layers.Conv2D(4, 9, padding="same", dtype="float64")
out = layer(x)
ref(x)
ref.set_weights(layer.get_weights())
close(out, ref(x))
print("OK")
"""


def _broken_copy(tmp_path, breakage):
  """A copy of the package under test whose op library is broken as `breakage` says."""
  pkg = os.path.dirname(os.path.abspath(tf_largeconv.__file__))
  dst = tmp_path / "tf_largeconv"
  shutil.copytree(pkg, dst, ignore=shutil.ignore_patterns("__pycache__"))
  if breakage == "stale":
    (dst / "_build_info.py").write_text('TF_VERSION = "1.0.0"\n')
  else:
    (lib,) = glob.glob(str(dst / "_large_conv_ops*.so"))
    with open(lib, "wb") as out:
      out.write(b"not a shared object\n" * 64)
  return str(tmp_path)


@pytest.mark.parametrize(
  "breakage,reason",
  [
    ("stale", r"built against TensorFlow 1\.0\.0"),
    ("not_a_library", r"could not load .*_large_conv_ops"),
  ],
)
def test_ops_run_the_portable_path_when_the_library_cannot_load(tmp_path, breakage, reason):
  parent = _broken_copy(tmp_path, breakage)
  env = subproc.child_env()
  env["PYTHONPATH"] = os.pathsep.join([parent, subproc.TESTS_DIR])
  out = subproc.run(CHILD, timeout=300, env=env)
  assert out.stdout.rstrip().endswith("OK"), subproc.describe(out, out.stdout, out.stderr)
  warning = next(line for line in out.stdout.splitlines() if line.startswith("WARNING:"))
  assert "runs the portable path" in warning and "make build" in warning, warning
  assert re.search(reason, warning), warning
  # The child used the broken copy, not the package under test.
  assert f"FILE: {parent}" in out.stdout, out.stdout
  # info() says which TensorFlow the broken library was built against.
  want = "1.0.0" if breakage == "stale" else tf_largeconv.info()["tensorflow_built"]
  assert f"BUILT: {want}" in out.stdout, out.stdout


def test_info_of_a_loaded_library():
  import tensorflow as tf

  report = tf_largeconv.info()
  assert report["version"] == tf_largeconv.__version__
  assert report["fallback"] is None and report["cpu_kernels"], report
  assert report["tensorflow_built"] == report["tensorflow_running"] == tf.__version__
  assert os.path.isfile(report["op_library"]), report
  assert report["gpu_kernels"] == (
    report["cuda_built"] and bool(tf.config.list_logical_devices("GPU"))
  )
  # The GPU kernels' module (and its cuFFT loader) is built exactly where the op library
  # holds CUDA kernels: where nvcc was found.
  assert (report["cufft"] is not None) == report["cuda_built"], report
  assert report["tf_kernels_priced_as"] in ("onednn", "eigen")
  # TensorFlow's own word on its CPU allocator: figures where a pool serves tensors.
  tf.constant(1.0) + 1.0
  try:
    tf.config.experimental.get_memory_info("CPU:0")
    has_pool = True
  except ValueError:
    has_pool = False
  assert report["tf_cpu_allocator"] in ("onednn", "bfc", "malloc")
  assert (report["tf_cpu_allocator"] != "malloc") == has_pool, report
