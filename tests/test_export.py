"""export_portable: a SavedModel with no LargeConv op that loads and computes in a process
that never imports tf_largeconv, equal to a stock-Keras twin of the model (Keras 3 and
tf_keras), its argument errors, and what TFLite makes of it."""

import os

import keras
import numpy as np
import pytest
import subproc
import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv.keras import FoldedBlock
from tf_largeconv.keras import LargeConv2D
from tf_largeconv.keras import LargeDepthwiseConv2D
from tf_largeconv.keras import export as _export
from tf_largeconv.keras import export_portable

H, W, C = 40, 36, 3

# Loads the SavedModel at argv[1] with tf_largeconv made unimportable, runs `serve` and the
# serving signature on the inputs in argv[2] (two batch sizes) and saves the outputs.
CHILD = """
import sys
sys.modules["tf_largeconv"] = None  # any import of the package raises ImportError
import numpy as np
import tensorflow as tf
path, xs, out = sys.argv[1:]
x = np.load(xs)
loaded = tf.saved_model.load(path)
full = loaded.serve(x).numpy()
one = loaded.serve(x[:1]).numpy()
sig = loaded.signatures["serving_default"](input_0=tf.constant(x))["output_0"].numpy()
assert not any(m == "tf_largeconv" or m.startswith("tf_largeconv.") for m in sys.modules
               if sys.modules[m] is not None)
np.savez(out, full=full, one=one, sig=sig)
print("ok")
"""


def _mixed_model(large):
  """LargeConv2D (SAME), LargeDepthwiseConv2D (VALID, multiplier 2), stock Conv2D and
  Dense; with large=False the same model of stock Keras layers (the oracle)."""
  conv = LargeConv2D if large else keras.layers.Conv2D
  depthwise = LargeDepthwiseConv2D if large else keras.layers.DepthwiseConv2D
  inp = keras.Input((H, W, C))
  x = conv(4, 17, padding="same", bias_initializer="random_normal")(inp)
  x = depthwise(15, depth_multiplier=2, activation="relu", bias_initializer="random_normal")(x)
  x = keras.layers.Conv2D(3, 3)(x)
  return keras.Model(inp, keras.layers.Dense(2)(x))


def _large_op_types(path):
  """The LargeConv op types in the exported graph (functions included), loaded here where
  the op library is registered."""
  graph = tf.saved_model.load(path).signatures["serving_default"].graph
  return sorted(t for t in _export.op_types(graph.as_graph_def()) if t.startswith("LargeConv"))


def _check_child(path, x, want, tmp_path):
  np.save(tmp_path / "x.npy", x)
  subproc.run(CHILD, path, tmp_path / "x.npy", tmp_path / "out.npz", timeout=240)
  got = np.load(tmp_path / "out.npz")
  atol = 1e-5 * np.abs(want).max()
  np.testing.assert_allclose(got["full"], want, rtol=0, atol=atol)
  np.testing.assert_allclose(got["sig"], want, rtol=0, atol=atol)
  np.testing.assert_allclose(got["one"], want[:1], rtol=0, atol=atol)


def test_export_loads_without_package_and_matches(rng, tmp_path):
  model = _mixed_model(large=True)
  twin = _mixed_model(large=False)
  model.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in model.get_weights()])
  twin.set_weights(model.get_weights())
  x = rng.standard_normal((3, H, W, C)).astype(np.float32)
  want = twin(x).numpy()  # stock tf.nn convolutions
  path = str(tmp_path / "sm")
  assert export_portable(model, path) == path
  assert _large_op_types(path) == []
  spec = tf.saved_model.load(path).signatures["serving_default"].structured_input_signature
  assert spec[1]["input_0"].shape.as_list() == [None, H, W, C]
  # The model itself is unchanged: its layers keep 'auto', and the forcing is off.
  assert [l.algorithm for l in model.layers if hasattr(l, "algorithm")] == ["auto", "auto"]
  assert not _args.forced_portable()
  np.testing.assert_allclose(model(x).numpy(), want, rtol=0, atol=1e-5 * np.abs(want).max())
  _check_child(path, x, want, tmp_path)


def test_export_of_op_only_algorithms_holds_no_op(rng, tmp_path):
  # 'direct' layers need the op everywhere else; the export still has none.
  model = keras.Sequential(
    [
      keras.Input((H, W, C)),
      LargeConv2D(2, 21, padding="same", algorithm="direct"),
      LargeDepthwiseConv2D(9, algorithm="fft"),
    ]
  )
  path = str(tmp_path / "sm")
  export_portable(model, path)
  assert _large_op_types(path) == []
  x = rng.standard_normal((2, H, W, C)).astype(np.float32)
  k1, b1, k2, b2 = model.get_weights()
  y = tf.nn.conv2d(x, k1, 1, "SAME") + b1
  want = (tf.nn.depthwise_conv2d(y, k2, [1, 1, 1, 1], "VALID") + b2).numpy()
  loaded = tf.saved_model.load(path)  # held: a dropped object deletes its variables
  got = loaded.serve(x).numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
  assert model.layers[0].algorithm == "direct"


def test_export_needs_defined_inputs(tmp_path):
  model = keras.Sequential([LargeConv2D(2, 15, padding="same")])
  with pytest.raises(ValueError, match=r"no defined inputs.*keras\.Input.*input_signature"):
    export_portable(model, str(tmp_path / "sm"))
  assert not os.path.exists(tmp_path / "sm")


def test_export_with_input_signature(rng, tmp_path):
  # A subclassed model has no inputs; input_signature names them.
  class Net(keras.Model):
    def __init__(self):
      super().__init__()
      self.conv = LargeConv2D(2, 15, padding="same")

    def call(self, x):
      return self.conv(x)

  model = Net()
  x = rng.standard_normal((2, 20, 20, 1)).astype(np.float32)
  model(x)
  path = str(tmp_path / "sm")
  export_portable(model, path, input_signature=[tf.TensorSpec([None, 20, 20, 1])])
  kernel, bias = model.conv.get_weights()
  want = (tf.nn.conv2d(x, kernel, 1, "SAME") + bias).numpy()
  loaded = tf.saved_model.load(path)  # held: a dropped object deletes its variables
  got = loaded.serve(x).numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_export_argument_errors(tmp_path):
  model = keras.Sequential([keras.Input((H, W, C)), LargeConv2D(2, 15)])
  with pytest.raises(ValueError, match="path"):
    export_portable(model, None)
  with pytest.raises(ValueError, match="input_signature"):
    export_portable(model, str(tmp_path / "a"), input_signature=[(None, H, W, C)])
  with pytest.raises(ValueError, match="model"):
    export_portable("not a model", str(tmp_path / "b"))
  free = keras.Sequential([keras.Input((None, None, C)), LargeConv2D(2, 15)])
  with pytest.raises(ValueError, match="static"):
    export_portable(free, str(tmp_path / "c"))
  assert not _args.forced_portable()


def test_tf_keras_export_loads_without_package(tmp_path):
  # The same export for a tf_keras model; oracle: tf_keras.layers.Conv2D with its weights.
  subproc.run(
    """
      import sys
      import numpy as np
      import tensorflow as tf
      import tf_keras
      from tf_largeconv.tf_keras import LargeConv2D, LargeDepthwiseConv2D, export_portable
      inp = tf_keras.Input((40, 36, 3))
      y = LargeDepthwiseConv2D(15, padding="same", bias_initializer="random_normal")(inp)
      model = tf_keras.Model(inp, LargeConv2D(2, 17, bias_initializer="random_normal")(y))
      ref_in = tf_keras.Input((40, 36, 3))
      ref_y = tf_keras.layers.DepthwiseConv2D(15, padding="same")(ref_in)
      ref = tf_keras.Model(ref_in, tf_keras.layers.Conv2D(2, 17)(ref_y))
      ref.set_weights(model.get_weights())
      x = np.random.default_rng(5).standard_normal((2, 40, 36, 3)).astype(np.float32)
      np.save(sys.argv[2], ref(x).numpy())
      np.save(sys.argv[3], x)
      export_portable(model, sys.argv[1])
      """,
    tmp_path / "sm",
    tmp_path / "want.npy",
    tmp_path / "x.npy",
    timeout=240,
    env=subproc.child_env(TF_USE_LEGACY_KERAS=1),
  )
  want = np.load(tmp_path / "want.npy")
  assert _large_op_types(str(tmp_path / "sm")) == []
  _check_child(str(tmp_path / "sm"), np.load(tmp_path / "x.npy"), want, tmp_path)


def _tflite_converter(path, select):
  converter = tf.lite.TFLiteConverter.from_saved_model(path)
  if select:
    converter.target_spec.supported_ops = [
      tf.lite.OpsSet.TFLITE_BUILTINS,
      tf.lite.OpsSet.SELECT_TF_OPS,
    ]
  return converter


@pytest.mark.filterwarnings("ignore:.*tf.lite.Interpreter is deprecated")
def test_tflite_status(rng, tmp_path):
  # What TFLite makes of the export, as the docs on exporting for serving describe it. If
  # this starts failing because TFLite learnt more, update the docs and this test.
  model = _mixed_model(large=True)
  path = export_portable(model, str(tmp_path / "sm"))
  # Builtins only: TFLite has RFFT2D but not IRFFT2D, and no complex Conj, AddV2 or
  # StridedSlice (the spectra's channel sums, for these few channels per group).
  with pytest.raises(Exception, match=r"TF Select ops: .*IRFFT2D") as error:
    _tflite_converter(path, select=False).convert()
  select_ops = str(error.value).split("TF Select ops: ")[1].splitlines()[0]
  assert sorted(select_ops.split(", ")) == ["AddV2", "Conj", "IRFFT2D", "StridedSlice"]
  # With Select TF ops it converts ...
  flat = _tflite_converter(path, select=True).convert()
  assert len(flat) > 0
  interpreter = tf.lite.Interpreter(model_content=flat)
  interpreter.allocate_tensors()
  x = rng.standard_normal((1, H, W, C)).astype(np.float32)
  interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
  # ... but does not run here: TFLite's RFFT2D kernel takes power-of-two lengths only (the
  # portable path picks 2-3-5-7-smooth ones), and this TensorFlow's tf.lite.Interpreter has
  # no Flex delegate for the Select ops.
  with pytest.raises(RuntimeError, match=r"IsPowerOfTwo|not supported by this interpreter"):
    interpreter.invoke()


@pytest.mark.filterwarnings("ignore:.*tf.lite.Interpreter is deprecated")
def test_tflite_interpreter_has_no_flex_delegate(tmp_path):
  # The reason the Select-ops conversion cannot run here, shown on one stock TF op
  # (tf.math.conj of a complex tensor is a Select op).
  module = tf.Module()
  module.f = tf.function(
    lambda x: tf.math.real(tf.math.conj(tf.complex(x, x))),
    input_signature=[tf.TensorSpec([4], tf.float32)],
  )
  tf.saved_model.save(
    module, str(tmp_path / "conj"), signatures={"serving_default": module.f.get_concrete_function()}
  )
  flat = _tflite_converter(str(tmp_path / "conj"), select=True).convert()
  interpreter = tf.lite.Interpreter(model_content=flat)
  with pytest.raises(RuntimeError, match="not supported by this interpreter.*FlexComplex"):
    interpreter.allocate_tensors()  # the Flex node fails to prepare


def test_export_of_folded_block(rng, tmp_path):
  # FoldedBlock's 'auto' calls the op library itself; under the export it goes portable.
  # Oracle: the block (stock Keras layers) it folds.
  block = keras.Sequential(
    [keras.Input((20, 20, 2)), keras.layers.Conv2D(3, 7), keras.layers.Conv2D(3, 9)]
  )
  block.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in block.get_weights()])
  model = keras.Sequential([keras.Input((20, 20, 2)), FoldedBlock(block)])
  path = export_portable(model, str(tmp_path / "sm"))
  assert _large_op_types(path) == []
  x = rng.standard_normal((2, 20, 20, 2)).astype(np.float32)
  want = block(x).numpy()
  loaded = tf.saved_model.load(path)
  got = loaded.serve(x).numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_export_of_two_input_model(rng, tmp_path):
  # serve(a, b) in the model's input order; oracle: tf.nn.conv2d with the layers' weights.
  a_in, b_in = keras.Input((20, 20, 1)), keras.Input((20, 20, 2))
  a = LargeConv2D(2, 15, padding="same", use_bias=False)(a_in)
  b = LargeDepthwiseConv2D(13, padding="same", use_bias=False)(b_in)
  model = keras.Model([a_in, b_in], keras.layers.Concatenate()([a, b]))
  path = export_portable(model, str(tmp_path / "sm"))
  assert _large_op_types(path) == []
  xa = rng.standard_normal((2, 20, 20, 1)).astype(np.float32)
  xb = rng.standard_normal((2, 20, 20, 2)).astype(np.float32)
  (ka,), (kb,) = model.layers[2].get_weights(), model.layers[3].get_weights()
  want = np.concatenate(
    [
      tf.nn.conv2d(xa, ka, 1, "SAME").numpy(),
      tf.nn.depthwise_conv2d(xb, kb, [1, 1, 1, 1], "SAME").numpy(),
    ],
    -1,
  )
  loaded = tf.saved_model.load(path)
  got = loaded.serve(xa, xb).numpy()
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
  sig = loaded.signatures["serving_default"](input_0=xa, input_1=xb)["output_0"].numpy()
  np.testing.assert_allclose(sig, want, rtol=0, atol=1e-5 * np.abs(want).max())
