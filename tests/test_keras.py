"""Keras layers: equal to keras.layers.Conv2D / DepthwiseConv2D with the same weights,
training equal, config and .keras / SavedModel round trips in fresh processes, the
converter, the tf_keras twin, and Keras-like argument errors."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_largeconv as lc
from tf_largeconv.keras import LargeConv2D, LargeDepthwiseConv2D

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Fresh processes import the package from this checkout, as the tests do.
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
           PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))


def _to_last(a):
  return np.transpose(a, (0, 2, 3, 1))


# (filters, kernel, strides, padding, data_format, dilation, groups, input NHWC)
CONV = [
    (4, 3, 1, "valid", "channels_last", 1, 1, (2, 12, 12, 3)),
    (6, (5, 4), (2, 1), "same", "channels_last", 1, 1, (2, 15, 14, 2)),
    (4, 7, 1, "SAME", "channels_last", 2, 1, (1, 20, 20, 3)),
    (8, 9, 1, "same", "channels_last", 1, 4, (1, 16, 16, 8)),
    (3, 31, 1, "same", "channels_last", 1, 1, (1, 40, 36, 2)),
    (3, 31, 1, "valid", "channels_first", 1, 1, (1, 40, 36, 2)),
    (4, 5, 2, "same", "channels_first", 1, 2, (2, 12, 13, 4)),
]


@pytest.mark.parametrize("case", CONV)
def test_large_conv2d_equals_keras_conv2d(rng, case):
  filters, k, s, p, fmt, d, groups, x_shape = case
  x = rng.standard_normal(x_shape).astype(np.float32)
  ours = LargeConv2D(filters, k, strides=s, padding=p, data_format=fmt, dilation_rate=d,
                     groups=groups, bias_initializer="random_normal")
  xin = x if fmt == "channels_last" else np.transpose(x, (0, 3, 1, 2))
  y = ours(xin).numpy()
  # Keras's own layer, channels_last (TF's CPU kernels lack NCHW), same weights.
  ref = keras.layers.Conv2D(filters, k, strides=s, padding=p, dilation_rate=d, groups=groups)
  ref.build(x.shape)
  ref.set_weights(ours.get_weights())
  want = ref(x).numpy()
  got = y if fmt == "channels_last" else _to_last(y)
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
  assert ours.compute_output_shape(xin.shape) == y.shape
  assert [w.name for w in ours.weights] == [w.name for w in ref.weights]


@pytest.mark.parametrize("multiplier,k,s,fmt", [(1, 3, 1, "channels_last"),
                                                (2, 13, 2, "channels_last"),
                                                (1, 31, 1, "channels_last"),
                                                (3, 5, 1, "channels_first")])
def test_large_depthwise_equals_keras_depthwise(rng, multiplier, k, s, fmt):
  x = rng.standard_normal((2, 34, 33, 4)).astype(np.float32)
  ours = LargeDepthwiseConv2D(k, strides=s, padding="same", depth_multiplier=multiplier,
                              data_format=fmt, bias_initializer="random_normal")
  xin = x if fmt == "channels_last" else np.transpose(x, (0, 3, 1, 2))
  y = ours(xin).numpy()
  ref = keras.layers.DepthwiseConv2D(k, strides=s, padding="same",
                                     depth_multiplier=multiplier)
  ref.build(x.shape)
  ref.set_weights(ours.get_weights())
  want = ref(x).numpy()
  got = y if fmt == "channels_last" else _to_last(y)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
  assert ours.compute_output_shape(xin.shape) == y.shape


def _model(layer_cls, **kw):
  return keras.Sequential([keras.Input((32, 32, 3)), layer_cls(**kw),
                           keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(2)])


def test_training_equals_keras(rng):
  x = rng.standard_normal((8, 32, 32, 3)).astype(np.float32)
  y = rng.standard_normal((8, 2)).astype(np.float32)
  ours = _model(LargeConv2D, filters=4, kernel_size=21, padding="same")
  theirs = _model(keras.layers.Conv2D, filters=4, kernel_size=21, padding="same")
  theirs.set_weights(ours.get_weights())
  for m in (ours, theirs):
    m.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    m.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
  for a, b in zip(ours.get_weights(), theirs.get_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_config_round_trip():
  layer = LargeConv2D(5, (7, 9), strides=2, padding="same", activation="relu",
                      kernel_regularizer="l2", algorithm="fft", workspace_limit=1 << 20)
  config = layer.get_config()
  assert config["algorithm"] == "fft" and config["workspace_limit"] == 1 << 20
  clone = LargeConv2D.from_config(config)
  assert clone.get_config() == config
  base = keras.layers.Conv2D(5, (7, 9)).get_config()
  assert set(base) <= set(config)  # every keras.layers.Conv2D argument is carried
  serialized = keras.saving.serialize_keras_object(layer)
  assert serialized["registered_name"] == "tf_largeconv>LargeConv2D"
  d = LargeDepthwiseConv2D(31, depth_multiplier=2, algorithm="direct")
  assert LargeDepthwiseConv2D.from_config(d.get_config()).get_config() == d.get_config()


def _functional():
  inp = keras.Input((40, 40, 3))
  h = LargeConv2D(4, 15, padding="same", activation="relu")(inp)
  h = LargeDepthwiseConv2D(31, padding="same")(h)
  return keras.Model(inp, keras.layers.Conv2D(2, 1)(h))


def _fresh_process(code, tmp_path):
  script = tmp_path / "check.py"
  script.write_text(textwrap.dedent(code))
  return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                        env=ENV, timeout=300, check=False)


def test_keras_file_loads_in_a_fresh_process(rng, tmp_path):
  model = _functional()
  x = rng.standard_normal((2, 40, 40, 3)).astype(np.float32)
  np.save(tmp_path / "x.npy", x)
  np.save(tmp_path / "y.npy", model(x).numpy())
  model.save(tmp_path / "m.keras")
  out = _fresh_process(f"""
      import numpy as np, keras
      import tf_largeconv  # registers the ops and layers
      m = keras.saving.load_model({str(tmp_path / "m.keras")!r})
      got = m(np.load({str(tmp_path / "x.npy")!r})).numpy()
      assert type(m.layers[1]).__name__ == "LargeConv2D", m.layers
      np.testing.assert_array_equal(got, np.load({str(tmp_path / "y.npy")!r}))
      print("ok")
      """, tmp_path)
  assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


def test_saved_model_loads_in_a_fresh_process(rng, tmp_path):
  model = _functional()
  x = rng.standard_normal((2, 40, 40, 3)).astype(np.float32)
  np.save(tmp_path / "x.npy", x)
  np.save(tmp_path / "y.npy", model(x).numpy())
  model.export(str(tmp_path / "sm"), verbose=False)
  code = f"""
      import numpy as np, tensorflow as tf
      {{imp}}
      m = tf.saved_model.load({str(tmp_path / "sm")!r})
      got = m.serve(tf.constant(np.load({str(tmp_path / "x.npy")!r}))).numpy()
      np.testing.assert_array_equal(got, np.load({str(tmp_path / "y.npy")!r}))
      print("ok")
      """
  out = _fresh_process(code.replace("{imp}", "import tf_largeconv"), tmp_path)
  assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]
  # Without the import, the failure names the op (the README says to import first).
  out = _fresh_process(code.replace("{imp}", "pass"), tmp_path)
  assert out.returncode != 0 and "LargeConv>Conv2D" in out.stderr


def test_convert_replaces_large_kernels(rng):
  inp = keras.Input((48, 48, 3))
  h = keras.layers.Conv2D(8, 3, padding="same")(inp)
  h = keras.layers.DepthwiseConv2D(31, padding="same")(h)
  h = keras.layers.Conv2D(4, 21, padding="valid", activation="relu")(h)
  model = keras.Model(inp, h)
  converted = lc.keras.convert(model, min_kernel_size=15, algorithm="fft")
  kinds = [type(l).__name__ for l in converted.layers[1:]]
  assert kinds == ["Conv2D", "LargeDepthwiseConv2D", "LargeConv2D"]
  assert converted.layers[3].algorithm == "fft"
  x = rng.standard_normal((2, 48, 48, 3)).astype(np.float32)
  want = model(x).numpy()
  np.testing.assert_allclose(converted(x).numpy(), want, rtol=1e-4,
                             atol=1e-4 * np.abs(want).max())


def test_tf_keras_layer_trains_with_legacy_keras(tmp_path):
  out = subprocess.run([sys.executable, "-c", textwrap.dedent("""
      import numpy as np, tensorflow as tf
      import tf_largeconv
      from tf_largeconv.tf_keras import LargeConv2D
      import tf_keras
      assert type(tf.keras.layers.Dense(1)).__module__.startswith("tf_keras")
      tf_keras.utils.set_random_seed(0)
      rng = np.random.default_rng(0)
      x = rng.random((16, 24, 24, 2)).astype("float32")
      y = 3.0 * x.mean(axis=(1, 2, 3))[:, None] + 1.0
      m = tf.keras.Sequential([tf.keras.Input((24, 24, 2)),
                               LargeConv2D(3, 15, padding="same"),
                               tf.keras.layers.GlobalAveragePooling2D(),
                               tf.keras.layers.Dense(1)])
      m.compile(tf.keras.optimizers.SGD(1e-2), "mse")
      # Full-batch gradient descent with a small step: the loss falls every epoch.
      h = m.fit(x, y, batch_size=16, epochs=5, verbose=0).history["loss"]
      assert h[-1] < h[0], h
      assert len(m.trainable_weights) == 4  # kernel and bias tracked, not lost
      ref = tf_keras.layers.Conv2D(3, 15, padding="same")
      ref.build(x.shape)
      ref.set_weights(m.layers[0].get_weights())
      np.testing.assert_allclose(m.layers[0](x).numpy(), ref(x).numpy(), rtol=1e-4,
                                 atol=1e-5)
      print("ok")
      """)], capture_output=True, text=True, timeout=300, check=False,
      env=dict(ENV, TF_USE_LEGACY_KERAS="1"))
  assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


@pytest.mark.parametrize("kwargs,message", [
    (dict(filters=4, kernel_size=3, strides=2, dilation_rate=2),
     "`strides > 1` not supported in conjunction with `dilation_rate > 1`"),
    (dict(filters=5, kernel_size=3, groups=2), "number of groups"),
    (dict(filters=4, kernel_size=3, padding="full"), "padding"),
    (dict(filters=4, kernel_size=3, algorithm="winograd"), "algorithm must be one of"),
    (dict(filters=4, kernel_size=3, workspace_limit=-1), "workspace_limit must be"),
    (dict(filters=4, kernel_size=(3, 3, 3)), "kernel_size"),
])
def test_bad_arguments_raise_keras_like_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    LargeConv2D(**kwargs)


def test_layers_are_not_jit_compiled():
  assert LargeConv2D(2, 3).supports_jit is False
  assert LargeDepthwiseConv2D(3).supports_jit is False
