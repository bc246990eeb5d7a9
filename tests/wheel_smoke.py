"""The smoke run of an installed wheel, in an environment that holds TensorFlow, numpy and the
wheel only (tests/test_wheel.py makes it). Checks, against TensorFlow's own kernels:
conv2d forward and both gradients, a Keras LargeConv2D fit step, a SavedModel loaded in a
fresh process; prints info() and what the import warned.

    python wheel_smoke.py loaded|fallback WORKDIR

`loaded`: the op library must load and run (its ops appear in the graphs); `fallback`: it
must not, and every op runs the portable path (stock TensorFlow ops). Prints OK at the end;
any failed check raises.
"""

import json
import os
import shutil
import subprocess
import sys
import warnings

import numpy as np
import tensorflow as tf

MODE, WORK = sys.argv[1], sys.argv[2]
LOADED = MODE == "loaded"
COMPILERS = ("cc", "gcc", "g++", "c++", "clang", "clang++", "nvcc", "make", "ld")

# Every warning of the run is recorded, so that the package's are counted: at import, and
# after it (there must be none: the import's warning is the only one).
caught = warnings.catch_warnings(record=True).__enter__()
warnings.simplefilter("always")


def our_warnings():
  return [str(w.message) for w in caught if "tf_largeconv" in str(w.message)]


import tf_largeconv as lc  # noqa: E402
import tf_largeconv.keras  # noqa: E402, F401  (the layers, which import the ops too)

at_import = our_warnings()
print("WARNINGS:", json.dumps(at_import))
print("FILE:", lc.__file__)
print("INFO:", json.dumps(lc.info()))
print("COMPILERS:", json.dumps({c: shutil.which(c) for c in COMPILERS}))
assert (lc.info()["fallback"] is None) == LOADED, lc.info()

rng = np.random.default_rng(7)


def close(ours, ref, rtol):
  """|ours - ref| within rtol of ref's largest magnitude, elementwise everywhere."""
  ours, ref = np.asarray(ours), np.asarray(ref)
  assert ours.shape == ref.shape, (ours.shape, ref.shape)
  err, scale = np.abs(ours - ref).max(), np.abs(ref).max()
  assert scale > 0 and err <= rtol * scale, (err, scale, rtol)


def op_types(fn, *args):
  return {op.type for op in tf.function(fn).get_concrete_function(*args).graph.get_operations()}


def large_conv_ops(types):
  return {t for t in types if t.startswith("LargeConv")}


# conv2d forward and both gradients against tf.nn.conv2d, in float64 and float32.
CASES = [
  dict(strides=1, padding="SAME"),
  dict(strides=[2, 3], padding="VALID"),
  dict(strides=[1, 2], padding="SAME"),
]
ALGORITHMS = ("auto", "fft", "direct") if LOADED else ("auto",)
for dtype, shape_x, shape_f, rtol in (
  (np.float64, (2, 37, 41, 3), (15, 13, 3, 4), 1e-9),
  (np.float32, (1, 64, 70, 2), (31, 31, 2, 3), 1e-4),
):
  x = tf.constant(rng.standard_normal(shape_x).astype(dtype))
  f = tf.constant(rng.standard_normal(shape_f).astype(dtype))
  for kw in CASES:
    ref_y = tf.nn.conv2d(x, f, **kw)
    dy = tf.constant(rng.standard_normal(ref_y.shape).astype(dtype))
    with tf.GradientTape() as tape:
      tape.watch([x, f])
      ref = tf.nn.conv2d(x, f, **kw)
    ref_dx, ref_df = tape.gradient(ref, [x, f], output_gradients=dy)
    for algorithm in ALGORITHMS:

      def forward_and_gradients(x, f, dy, algorithm=algorithm, kw=kw):
        with tf.GradientTape() as tape:
          tape.watch([x, f])
          y = lc.conv2d(x, f, algorithm=algorithm, **kw)
        return (y, *tape.gradient(y, [x, f], output_gradients=dy))

      y, dx, df = forward_and_gradients(x, f, dy)
      for ours, want in ((y, ref_y), (dx, ref_dx), (df, ref_df)):
        close(ours, want, rtol)
      used = large_conv_ops(op_types(forward_and_gradients, x, f, dy))
      if not LOADED:
        assert not used, used
      elif algorithm != "auto":
        passes = ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter")
        assert {f"LargeConv>{p}" for p in passes} <= used, (algorithm, used)
if not LOADED:
  try:
    lc.conv2d(x, f, 1, "SAME", algorithm="fft")
    raise AssertionError("algorithm='fft' ran without the op library")
  except ValueError as e:
    assert "could not be loaded" in str(e), e
print("ops: forward and both gradients match tf.nn.conv2d")

# One Keras fit step: LargeConv2D against keras.layers.Conv2D from the same weights.
import keras  # noqa: E402

keras.utils.set_random_seed(0)
images = rng.standard_normal((4, 40, 40, 2)).astype("float32")
targets = rng.standard_normal((4, 40, 40, 3)).astype("float32")


def one_step(layer):
  inputs = keras.Input((40, 40, 2))
  model = keras.Model(inputs, layer(inputs))
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  return model


ours = one_step(lc.keras.LargeConv2D(3, 21, padding="same"))
ref = one_step(keras.layers.Conv2D(3, 21, padding="same"))
ref.set_weights(ours.get_weights())
before = [w.copy() for w in ours.get_weights()]
loss_ours = ours.fit(images, targets, batch_size=4, epochs=1, verbose=0).history["loss"]
loss_ref = ref.fit(images, targets, batch_size=4, epochs=1, verbose=0).history["loss"]
close(loss_ours, loss_ref, 1e-5)
for w0, w_ours, w_ref in zip(before, ours.get_weights(), ref.get_weights()):
  assert np.abs(w_ref - w0).max() > 0  # the step moved the weights
  close(w_ours - w0, w_ref - w0, 1e-4)
print("keras: a LargeConv2D fit step matches Conv2D's")

# A SavedModel, loaded and run in a fresh process (which imports tf_largeconv first).
ALGORITHM = "fft" if LOADED else "auto"
saved_x = rng.standard_normal((1, 48, 45, 3))
saved_f = rng.standard_normal((17, 17, 3, 2))


class Conv(tf.Module):
  def __init__(self):
    super().__init__()
    self.f = tf.Variable(saved_f)

  @tf.function(input_signature=[tf.TensorSpec([None, 48, 45, 3], tf.float64)])
  def __call__(self, x):
    return lc.conv2d(x, self.f, 1, "SAME", algorithm=ALGORITHM)


path = os.path.join(WORK, "saved_" + MODE)
tf.saved_model.save(Conv(), path)
with open(os.path.join(path, "saved_model.pb"), "rb") as pb:
  assert (b"LargeConv>Conv2D" in pb.read()) == LOADED
np.save(os.path.join(WORK, "x.npy"), saved_x)
np.save(os.path.join(WORK, "f.npy"), saved_f)
LOAD = """
import sys, warnings
import numpy as np
import tensorflow as tf
warnings.simplefilter("ignore")
import tf_largeconv  # noqa: F401  (registers the LargeConv ops)
path, work = sys.argv[1], sys.argv[2]
x, f = np.load(work + "/x.npy"), np.load(work + "/f.npy")
y = tf.saved_model.load(path)(tf.constant(x)).numpy()
ref = tf.nn.conv2d(x, f, 1, "SAME").numpy()
print(np.abs(y - ref).max(), np.abs(ref).max())
"""
child = subprocess.run(
  [sys.executable, "-c", LOAD, path, WORK], capture_output=True, text=True, timeout=300
)
assert child.returncode == 0, child.stderr[-3000:]
err, scale = (float(v) for v in child.stdout.split()[-2:])
assert scale > 0 and err <= 1e-9 * scale, (err, scale)
print("savedmodel: loaded in a fresh process, matches tf.nn.conv2d")
print("LATER_WARNINGS:", json.dumps(our_warnings()[len(at_import) :]))
print("OK")
