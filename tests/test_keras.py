"""Keras layers: equal to keras.layers.Conv2D / DepthwiseConv2D with the same weights,
training equal, config and .keras / SavedModel round trips in fresh processes (the reloaded
model computes, trains and differentiates as the original does), the converter, the
tf_keras twin (trained like tf_keras.layers.Conv2D), and Keras-like argument errors."""

import inspect
import warnings

import keras
import keras_reload
import numpy as np
import pytest
import subproc
import tensorflow as tf

import tf_largeconv as lc
from tf_largeconv.keras import LargeConv2D
from tf_largeconv.keras import LargeDepthwiseConv2D


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
  # Output width equal to `filters`: keras.layers.Conv2D adds the bias along the width
  # there (see _conv_call); the reference is the channels_last layer.
  (4, 3, 1, "valid", "channels_first", 1, 1, (1, 9, 6, 3)),
]


@pytest.mark.parametrize("case", CONV)
def test_large_conv2d_equals_keras_conv2d(rng, case):
  filters, k, s, p, fmt, d, groups, x_shape = case
  x = rng.standard_normal(x_shape).astype(np.float32)
  ours = LargeConv2D(
    filters,
    k,
    strides=s,
    padding=p,
    data_format=fmt,
    dilation_rate=d,
    groups=groups,
    bias_initializer="random_normal",
  )
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


@pytest.mark.parametrize(
  "multiplier,k,s,fmt",
  [
    (1, 3, 1, "channels_last"),
    (2, 13, 2, "channels_last"),
    (1, 31, 1, "channels_last"),
    (3, 5, 1, "channels_first"),
  ],
)
def test_large_depthwise_equals_keras_depthwise(rng, multiplier, k, s, fmt):
  x = rng.standard_normal((2, 34, 33, 4)).astype(np.float32)
  ours = LargeDepthwiseConv2D(
    k,
    strides=s,
    padding="same",
    depth_multiplier=multiplier,
    data_format=fmt,
    bias_initializer="random_normal",
  )
  xin = x if fmt == "channels_last" else np.transpose(x, (0, 3, 1, 2))
  y = ours(xin).numpy()
  ref = keras.layers.DepthwiseConv2D(k, strides=s, padding="same", depth_multiplier=multiplier)
  ref.build(x.shape)
  ref.set_weights(ours.get_weights())
  want = ref(x).numpy()
  got = y if fmt == "channels_last" else _to_last(y)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
  assert ours.compute_output_shape(xin.shape) == y.shape


def _model(layer_cls, **kw):
  return keras.Sequential(
    [
      keras.Input((32, 32, 3)),
      layer_cls(**kw),
      keras.layers.GlobalAveragePooling2D(),
      keras.layers.Dense(2),
    ]
  )


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
  layer = LargeConv2D(
    5,
    (7, 9),
    strides=2,
    padding="same",
    activation="relu",
    kernel_regularizer="l2",
    algorithm="fft",
    workspace_limit=1 << 20,
  )
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
  # algorithm='direct': with 'auto' the planner hands this small convolution to TensorFlow's
  # own kernel, and the reloaded model would not run the op for it.
  h = LargeConv2D(4, 15, padding="same", activation="relu", algorithm="direct")(inp)
  h = LargeDepthwiseConv2D(31, padding="same")(h)
  return keras.Model(inp, keras.layers.Conv2D(2, 1)(h))


def _reload_inputs(rng):
  """The input and training target of the reload tests."""
  return (
    rng.standard_normal((2, 40, 40, 3)).astype(np.float32),
    rng.standard_normal((2, 40, 40, 2)).astype(np.float32),
  )


def test_keras_file_loads_and_trains_in_a_fresh_process(rng, tmp_path):
  x, t = _reload_inputs(rng)
  keras_reload.keras_file_trains_alike(
    _functional(),
    x,
    t,
    tmp_path,
    [
      'assert type(m.layers[1]).__name__ == "LargeConv2D", m.layers',
      'assert m.layers[1].algorithm == "direct"',
    ],
  )


def test_saved_model_loads_and_differentiates_in_a_fresh_process(rng, tmp_path):
  model = _functional()
  x, t = _reload_inputs(rng)
  keras_reload.save_data(tmp_path, model, x, t)
  model.export(str(tmp_path / "sm"), verbose=False)
  code = f"""
      import sys
      import numpy as np, tensorflow as tf
      {{imp}}
      out = sys.argv[1]
      m = tf.saved_model.load(out + "/sm")
      x = tf.constant(np.load(out + "/x.npy"))
      np.testing.assert_array_equal(m.serve(x).numpy(), np.load(out + "/y.npy"))
      # Gradients through the reloaded graph (the ops' registered gradients), with respect
      # to the input and the restored variables, then one SGD step on those variables.
      variables = list(m.trainable_variables)
      with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_mean((m.serve(x) - np.load(out + "/t.npy")) ** 2)
      dx, *grads = tape.gradient(loss, [x] + variables)
      for v, g in zip(variables, grads):
        v.assign_sub({keras_reload.LR} * g)
      np.savez(out + "/grads.npz", dx, *grads)
      np.savez(out + "/trained.npz", *[v.numpy() for v in variables])
      """
  # Without the import, the failure names the op (the docs say to import first). Both
  # children run at once: each spends most of its time importing TensorFlow.
  without = subproc.start(code.replace("{imp}", "pass"), tmp_path)
  try:
    subproc.run(code.replace("{imp}", "import tf_largeconv"), tmp_path, timeout=300)
  finally:
    _, err = subproc.wait(without, timeout=300, check=False)
  assert without.returncode != 0 and "LargeConv>Conv2D" in err, subproc.describe(without, "", err)
  xt = tf.constant(x)
  variables = model.trainable_variables
  before = [v.numpy() for v in variables]
  with tf.GradientTape() as tape:
    tape.watch(xt)
    loss = tf.reduce_mean((model(xt) - t) ** 2)
  dx, *grads = tape.gradient(loss, [xt] + [v.value for v in variables])
  for v, g in zip(variables, grads):
    v.assign_sub(keras_reload.LR * g)
  names = [v.path for v in variables]
  got = keras_reload.load_list(tmp_path / "grads.npz")
  want = [dx.numpy()] + [g.numpy() for g in grads]
  assert [a.shape for a in got] == [a.shape for a in want]
  for name, a, b in zip(["input"] + names, want, got):
    np.testing.assert_allclose(
      b,
      a,
      rtol=keras_reload.RELOAD_RTOL,
      atol=keras_reload.RELOAD_ATOL * np.abs(a).max(),
      equal_nan=False,
      err_msg=f"gradient for {name}",
    )
  keras_reload.assert_trained_alike(
    before, [v.numpy() for v in variables], keras_reload.load_list(tmp_path / "trained.npz"), names
  )


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
  np.testing.assert_allclose(converted(x).numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


# Each kind convert() swaps: (Large class, the Keras layer with kernel side k, input shape).
CONVERT_KINDS = [
  ("LargeConv2D", lambda k: keras.layers.Conv2D(3, (2, k), padding="same"), (20, 24, 2)),
  (
    "LargeDepthwiseConv2D",
    lambda k: keras.layers.DepthwiseConv2D((k, 3), padding="same"),
    (20, 24, 2),
  ),
  ("LargeConv1D", lambda k: keras.layers.Conv1D(3, k, padding="causal"), (40, 2)),
  (
    "LargeConv2DTranspose",
    lambda k: keras.layers.Conv2DTranspose(3, (k, 2), strides=2, padding="same"),
    (10, 12, 2),
  ),
  ("LargeConv3D", lambda k: keras.layers.Conv3D(3, (2, 3, k), padding="same"), (6, 7, 16, 2)),
]


@pytest.mark.parametrize("kind,make,shape", CONVERT_KINDS, ids=[c[0] for c in CONVERT_KINDS])
def test_convert_swaps_each_kind_with_the_given_settings(rng, kind, make, shape):
  """A kernel whose longest side is min_kernel_size is swapped, one a tap shorter is
  cloned; the swapped layer has the Keras layer's config plus the given algorithm and
  workspace_limit, the clone computes what the model does, and the model is left as it was;
  a second convert keeps the Large layer with its own settings."""
  k, limit = 9, 8 << 20
  inp = keras.Input(shape)
  small, large = make(k - 1), make(k)
  model = keras.Model(inp, large(small(inp)))
  converted = lc.keras.convert(model, min_kernel_size=k, algorithm="direct", workspace_limit=limit)
  kept, swapped = converted.layers[1:]
  assert type(kept) is type(small) and type(swapped).__name__ == kind
  assert (swapped.algorithm, swapped.workspace_limit) == ("direct", limit)
  config = swapped.get_config()
  options = [config.pop(k) for k in ("algorithm", "workspace_limit", "keep_memory")]
  assert options == ["direct", limit, True]
  assert config == large.get_config()
  x = rng.standard_normal((2,) + shape).astype(np.float32)
  want = model(x).numpy()
  np.testing.assert_allclose(converted(x).numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
  for layer in converted.layers[1:]:
    layer.set_weights([np.zeros_like(w) for w in layer.get_weights()])
  np.testing.assert_array_equal(model(x).numpy(), want)
  again = lc.keras.convert(converted, min_kernel_size=k, algorithm="fft")
  assert type(again.layers[2]) is type(swapped) and again.layers[2].algorithm == "direct"


def test_tf_keras_layer_trains_with_legacy_keras():
  # The same model with tf_keras.layers.Conv2D, from the same weights, trained the same way,
  # is the oracle: the two convolutions differ only by rounding (FFT against TF's kernel).
  subproc.run(
    """
      import numpy as np, tensorflow as tf
      import tf_largeconv
      from tf_largeconv.tf_keras import LargeConv2D
      import tf_keras
      assert type(tf.keras.layers.Dense(1)).__module__.startswith("tf_keras")
      tf_keras.utils.set_random_seed(0)
      rng = np.random.default_rng(0)
      x = rng.random((16, 24, 24, 2)).astype("float32")
      y = 3.0 * x.mean(axis=(1, 2, 3))[:, None] + 1.0

      def model(conv):
        return tf.keras.Sequential([tf.keras.Input((24, 24, 2)), conv,
                                    tf.keras.layers.GlobalAveragePooling2D(),
                                    tf.keras.layers.Dense(1)])

      # algorithm='fft': with 'auto' the planner hands this small convolution to
      # TensorFlow's own kernel, and both models would run the same code.
      m = model(LargeConv2D(3, 15, padding="same", algorithm="fft"))
      ref = model(tf_keras.layers.Conv2D(3, 15, padding="same"))
      assert len(m.trainable_weights) == 4  # kernel and bias tracked, not lost
      ref.set_weights(m.get_weights())
      before = m.get_weights()
      for net in (m, ref):
        net.compile(tf.keras.optimizers.SGD(1e-2), "mse")
        net.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
      # Measured: at most 6e-8 apart, while the kernel moves by 1e-2.
      for a, b in zip(m.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=False)
      moved = np.abs(m.layers[0].get_weights()[0] - before[0]).max()
      assert moved > 1e-3, moved  # the kernel trained, far beyond the tolerance
      """,
    timeout=300,
    env=subproc.child_env(TF_USE_LEGACY_KERAS=1),
  )


def test_tf_keras_grouped_layers_run_the_op(rng):
  """tf_keras compiles grouped convolutions with XLA; the Large layers run the op instead
  (algorithm='fft' raises under XLA), equal to tf_keras's layers."""
  tf_keras = pytest.importorskip("tf_keras")
  from tf_largeconv import tf_keras as lc_tf_keras

  for ours, ref, shape in [
    (
      lc_tf_keras.LargeConv2D(4, 5, padding="same", groups=2, algorithm="fft"),
      tf_keras.layers.Conv2D(4, 5, padding="same", groups=2),
      (2, 12, 11, 4),
    ),
    (
      lc_tf_keras.LargeConv1D(6, 9, padding="causal", groups=3, algorithm="fft"),
      tf_keras.layers.Conv1D(6, 9, padding="causal", groups=3),
      (2, 30, 6),
    ),
  ]:
    x = rng.standard_normal(shape).astype(np.float32)
    ref(x)
    ours(x)
    ours.set_weights([rng.standard_normal(w.shape).astype(np.float32) for w in ref.weights])
    ref.set_weights(ours.get_weights())
    want = ref(x).numpy()
    np.testing.assert_allclose(ours(x).numpy(), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize(
  "kwargs,message",
  [
    (
      dict(filters=4, kernel_size=3, strides=2, dilation_rate=2),
      "`strides > 1` not supported in conjunction with `dilation_rate > 1`",
    ),
    (dict(filters=5, kernel_size=3, groups=2), "number of groups"),
    (dict(filters=4, kernel_size=3, padding="full"), "padding"),
    (dict(filters=4, kernel_size=3, algorithm="winograd"), "algorithm must be one of"),
    (dict(filters=4, kernel_size=3, workspace_limit=-1), "workspace_limit must be"),
    (dict(filters=4, kernel_size=(3, 3, 3)), "kernel_size"),
  ],
)
def test_bad_arguments_raise_keras_like_errors(kwargs, message):
  with pytest.raises(ValueError, match=message):
    LargeConv2D(**kwargs)


@pytest.mark.parametrize(
  "make,shape",
  [
    (lambda: LargeDepthwiseConv2D(5, strides=2), (2, 4, 4, 3)),
    (lambda: LargeConv2D(4, (3, 5), strides=2), (2, 8, 4, 3)),
    (lambda: lc.keras.LargeConv1D(2, 11, strides=5), (4, 10, 3)),
    (lambda: lc.keras.LargeConv3D(2, 5), (1, 4, 6, 6, 1)),
  ],
)
def test_an_input_too_small_raises_keras_error_eager_and_traced(make, shape):
  # Keras's own layers raise this ValueError for 'valid' padding where no output fits,
  # eagerly and symbolically (its DepthwiseConv2D test looks for the message).
  x = np.zeros(shape, np.float32)
  message = "Computed output size would be zero or negative"
  with pytest.raises(ValueError, match=message):
    make()(x)
  with pytest.raises(ValueError, match=message):
    make()(keras.Input(shape[1:]))
  fits = list(shape)
  fits[1] = 11 if len(shape) == 3 else 5
  fits[2:-1] = [max(v, 5) for v in fits[2:-1]]
  assert make()(np.zeros(fits, np.float32)).shape[1] >= 1


def test_layers_report_supports_jit():
  """'auto' (the portable path under XLA), 'portable' and 'tf' compile; the op's own
  algorithms do not."""
  for algorithm, jit in (
    ("auto", True),
    ("portable", True),
    ("tf", True),
    ("direct", False),
    ("fft", False),
  ):
    assert LargeConv2D(2, 3, algorithm=algorithm).supports_jit is jit
    assert LargeDepthwiseConv2D(3, algorithm=algorithm).supports_jit is jit


def _jit_model(jit_compile):
  keras.utils.set_random_seed(5)
  inputs = keras.Input((24, 20, 2))
  h = LargeConv2D(3, 11, padding="same")(inputs)
  h = LargeDepthwiseConv2D(9, padding="valid")(h)
  outputs = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling2D()(h))
  model = keras.Model(inputs, outputs)
  model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", jit_compile=jit_compile)
  return model


def test_jit_compiled_model_trains_like_the_plain_one(rng):
  """A model of Large layers keeps jit_compile=True (no fallback warning), trains a step
  under XLA (the portable path) and gives the plain model's losses and weights."""
  x = rng.standard_normal((8, 24, 20, 2)).astype(np.float32)
  y = rng.standard_normal((8, 1)).astype(np.float32)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    jit = _jit_model(True)
  assert not [w for w in caught if "jit_compile" in str(w.message)]
  assert jit.jit_compile is True
  plain = _jit_model(False)
  plain.set_weights(jit.get_weights())
  runs = []
  for model in (jit, plain):
    history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
    runs.append((history.history["loss"], model.get_weights()))
  np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-4)
  for a, b in zip(runs[0][1], runs[1][1]):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * max(1.0, np.abs(b).max()))


def test_tf_keras_layer_trains_under_jit_compile():
  # tf_keras compiles the train step with jit_compile=True and never asks the layers; the
  # shared 'auto' routing takes the portable path there. Oracle: tf_keras.layers.Conv2D
  # from the same weights, compiled the same way.
  subproc.run(
    """
      import numpy as np, tensorflow as tf
      import tf_largeconv
      from tf_largeconv.tf_keras import LargeConv2D
      import tf_keras
      tf_keras.utils.set_random_seed(0)
      rng = np.random.default_rng(1)
      x = rng.random((8, 20, 22, 2)).astype("float32")
      y = 3.0 * x.mean(axis=(1, 2, 3))[:, None] + 1.0

      def model(conv):
        return tf.keras.Sequential([tf.keras.Input((20, 22, 2)), conv,
                                    tf.keras.layers.GlobalAveragePooling2D(),
                                    tf.keras.layers.Dense(1)])

      m = model(LargeConv2D(3, 15, padding="same"))
      ref = model(tf_keras.layers.Conv2D(3, 15, padding="same"))
      ref.set_weights(m.get_weights())
      before = m.get_weights()
      losses = []
      for net in (m, ref):
        net.compile(tf.keras.optimizers.SGD(1e-2), "mse", jit_compile=True)
        losses.append(net.fit(x, y, batch_size=4, epochs=2, shuffle=False,
                              verbose=0).history["loss"])
      np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
      for a, b in zip(m.get_weights(), ref.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
      moved = np.abs(m.layers[0].get_weights()[0] - before[0]).max()
      assert moved > 1e-3, moved
      """,
    timeout=300,
    env=subproc.child_env(TF_USE_LEGACY_KERAS=1),
  )


# Each Large layer's positional arguments are its Keras layer's (Keras 3 and tf_keras).

KINDS = [
  "LargeConv1D",
  "LargeConv2D",
  "LargeDepthwiseConv2D",
  "LargeConv2DTranspose",
  "LargeConv3D",
]
POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _flavour(flavour):
  """(our layers' module, the Keras they extend)."""
  if flavour == "keras":
    return lc.keras, keras
  tf_keras = pytest.importorskip("tf_keras")
  from tf_largeconv import tf_keras as lc_tf_keras

  return lc_tf_keras, tf_keras


def _positional_values(names, rank, dilated, regularizers):
  """A value other than the default for each positional argument (strides or dilation_rate
  above 1, as Keras refuses both together)."""
  values = dict(
    filters=4,
    kernel_size=(3, 5, 2)[:rank],
    strides=1 if dilated else 2,
    padding="same",
    output_padding=1,
    depth_multiplier=2,
    data_format="channels_first",
    dilation_rate=2 if dilated else 1,
    groups=2,
    activation="relu",
    use_bias=False,
    kernel_initializer="ones",
    depthwise_initializer="ones",
    bias_initializer="ones",
    kernel_regularizer="l2",
    depthwise_regularizer="l2",
    bias_regularizer="l1",
    activity_regularizer=regularizers.L1L2(l1=0.25, l2=0.5),
    kernel_constraint="non_neg",
    depthwise_constraint="non_neg",
    bias_constraint="unit_norm",
  )
  if dilated:
    values["output_padding"] = None  # Keras needs it below the strides
  return [values[n] for n in names]


def _keras_config(layer):
  config = layer.get_config()
  config.pop("name")
  return config


@pytest.mark.parametrize("flavour", ["keras", "tf_keras"])
@pytest.mark.parametrize("kind", KINDS)
def test_positional_arguments_mean_what_they_mean_in_keras(flavour, kind):
  """`LargeConv1D(16, 31, 2)` is `Conv1D(16, 31, 2)` (strides 2), and so on for every
  positional argument of every kind; algorithm, workspace_limit and keep_memory are
  keyword-only."""
  ours_module, their_keras = _flavour(flavour)
  ours, theirs = getattr(ours_module, kind), getattr(their_keras.layers, kind[len("Large") :])
  sig = inspect.signature(ours)
  names = [p.name for p in inspect.signature(theirs).parameters.values() if p.kind in POSITIONAL]
  assert [
    (p.name, p.kind, p.default)
    for p in inspect.signature(theirs).parameters.values()
    if p.kind in POSITIONAL
  ] == [(p.name, p.kind, p.default) for p in sig.parameters.values() if p.kind in POSITIONAL]
  assert [p.kind for p in sig.parameters.values()][-4:] == [
    inspect.Parameter.KEYWORD_ONLY,
    inspect.Parameter.KEYWORD_ONLY,
    inspect.Parameter.KEYWORD_ONLY,
    inspect.Parameter.VAR_KEYWORD,
  ]
  defaults = [sig.parameters[k].default for k in ("algorithm", "workspace_limit", "keep_memory")]
  assert defaults == ["auto", None, True]
  rank = 1 if "1D" in kind else 3 if "3D" in kind else 2
  required = [n for n in names if sig.parameters[n].default is inspect.Parameter.empty]
  regularizers = their_keras.regularizers
  required_values = _positional_values(required, rank, False, regularizers)
  for args in (
    required_values,  # the defaults
    _positional_values(names, rank, False, regularizers),
    _positional_values(names, rank, True, regularizers),
  ):
    layer = ours(*args)
    config = _keras_config(layer)
    options = [config.pop(k) for k in ("algorithm", "workspace_limit", "keep_memory")]
    assert options == ["auto", None, True]
    assert config == _keras_config(theirs(*args)), args
  with pytest.raises(TypeError):
    ours(*_positional_values(names, rank, False, regularizers), "fft")  # one more than Keras's
  layer = ours(*required_values, algorithm="fft", workspace_limit=1024)
  assert (layer.algorithm, layer.workspace_limit) == ("fft", 1024)
