"""LargeConv3D (Keras 3 and tf_keras): equal to Conv3D with the same weights, forward and
gradients (input, kernel, bias), over padding, strides, dilations, groups, channels_first,
bias and activation; its config, a .keras file loading and training in a fresh process,
convert() swapping large Conv3D layers, and Keras-like argument errors."""

import keras
import keras_reload
import numpy as np
import pytest
import tensorflow as tf

import tf_largeconv as lc
from tf_largeconv.keras import LargeConv2D
from tf_largeconv.keras import LargeConv3D

# The FFT and direct float32 sums against TF's: as the 2-D layers' tests (test_keras.py).
RTOL = 1e-4


def _assert_close(got, want, what):
  np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * np.abs(want).max(), err_msg=what)


def _to_last(a):
  return np.transpose(a, (0, 2, 3, 4, 1))


def _to_first(a):
  return np.transpose(a, (0, 4, 1, 2, 3))


# (layer arguments, input NDHWC)
CASES = [
  (dict(filters=4, kernel_size=3), (2, 7, 8, 6, 3)),
  (
    dict(filters=3, kernel_size=(5, 4, 3), strides=(2, 1, 2), padding="same", activation="relu"),
    (1, 9, 8, 7, 2),
  ),
  (dict(filters=2, kernel_size=3, padding="same", dilation_rate=(2, 1, 3)), (1, 8, 7, 9, 2)),
  (dict(filters=6, kernel_size=3, groups=3), (1, 6, 7, 6, 6)),
  (dict(filters=2, kernel_size=9, padding="SAME", use_bias=False), (1, 10, 11, 9, 1)),
  # Its output width equals `filters`: keras.layers.Conv3D adds the bias along the width
  # there (see LargeConv3D.call), so the reference is the channels_last layer.
  (
    dict(
      filters=4,
      kernel_size=(3, 5, 3),
      strides=2,
      padding="same",
      groups=2,
      data_format="channels_first",
      activation="tanh",
    ),
    (2, 7, 9, 8, 4),
  ),
  (
    dict(filters=2, kernel_size=(3, 2, 3), dilation_rate=2, data_format="channels_first"),
    (1, 9, 8, 10, 2),
  ),
]


def _tape(layer, x, dy):
  """The layer's output and the gradients of sum(output * dy) with respect to x and the
  layer's weights."""
  x = tf.constant(x)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = layer(x)
    loss = tf.reduce_sum(y * dy)
  grads = tape.gradient(loss, [x] + [w.value for w in layer.trainable_weights])
  return y.numpy(), [g.numpy() for g in grads]


@pytest.mark.parametrize("algorithm", ["direct", "fft"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_large_conv3d_equals_keras_conv3d(rng, case, algorithm):
  kwargs, x_shape = CASES[case]
  first = kwargs.get("data_format") == "channels_first"
  x = rng.standard_normal(x_shape).astype(np.float32)
  ours = LargeConv3D(**kwargs, algorithm=algorithm, bias_initializer="random_normal")
  xin = _to_first(x) if first else x
  ours.build(xin.shape)
  # Keras's own layer, channels_last (TF's CPU kernel has no NCDHW, and Keras's
  # channels_first bias can be wrong), same weights.
  ref = keras.layers.Conv3D(**dict(kwargs, data_format="channels_last"))
  ref.build(x.shape)
  ref.set_weights(ours.get_weights())
  out_shape = ref.compute_output_shape(x.shape)
  dy = rng.standard_normal(out_shape).astype(np.float32)
  y, grads = _tape(ours, xin, _to_first(dy) if first else dy)
  want_y, want_grads = _tape(ref, x, dy)
  if first:
    y, grads[0] = _to_last(y), _to_last(grads[0])
  assert y.shape == want_y.shape == tuple(out_shape)
  assert ours.compute_output_shape(xin.shape) == (_to_first(y) if first else y).shape
  _assert_close(y, want_y, "output")
  names = ["input"] + [w.name for w in ref.trainable_weights]
  assert len(grads) == len(want_grads) == (3 if ours.use_bias else 2)
  for name, got, want in zip(names, grads, want_grads):
    _assert_close(got, want, f"gradient for {name}")
  assert [w.name for w in ours.weights] == [w.name for w in ref.weights]


def test_unknown_sizes_give_keras_output_shape():
  """Unknown dimensions stay unknown, and a dilated filter longer than any stand-in size
  (the 2-D layer's shape came from the same helper) still gives the known ones."""
  for layer, ref, shape in [
    (
      LargeConv3D(2, (3, 2, 5), dilation_rate=(1, 200, 2)),
      keras.layers.Conv3D(2, (3, 2, 5), dilation_rate=(1, 200, 2)),
      (None, 9, None, 12, 3),
    ),
    (
      LargeConv3D(4, 3, strides=(1, 2, 3), padding="same", groups=2, data_format="channels_first"),
      keras.layers.Conv3D(
        4, 3, strides=(1, 2, 3), padding="same", groups=2, data_format="channels_first"
      ),
      (2, 4, None, 11, None),
    ),
    (
      LargeConv2D(2, 3, dilation_rate=200),
      keras.layers.Conv2D(2, 3, dilation_rate=200),
      (None, None, 450, 2),
    ),
  ]:
    assert layer.compute_output_shape(shape) == ref.compute_output_shape(shape), layer


def test_regularizers_and_constraints_act_as_keras(rng):
  kwargs = dict(
    filters=2,
    kernel_size=3,
    kernel_regularizer="l2",
    bias_regularizer="l1",
    activity_regularizer="l2",
    kernel_constraint=keras.constraints.NonNeg(),
  )
  ours = LargeConv3D(**kwargs, bias_initializer="random_normal")
  theirs = keras.layers.Conv3D(**kwargs)
  x = rng.standard_normal((1, 5, 6, 5, 2)).astype(np.float32)
  theirs(x)
  ours(x)
  theirs.set_weights(ours.get_weights())
  _assert_close(ours(x).numpy(), theirs(x).numpy(), "output")
  assert len(ours.losses) == len(theirs.losses) == 3
  for a, b in zip(ours.losses, theirs.losses):
    _assert_close(a.numpy(), b.numpy(), "losses")
  assert ours.kernel.constraint is not None


def test_config_round_trip():
  layer = LargeConv3D(
    5,
    (7, 9, 3),
    strides=2,
    padding="same",
    activation="relu",
    groups=1,
    kernel_regularizer="l2",
    data_format="channels_first",
    algorithm="fft",
    workspace_limit=1 << 20,
  )
  config = layer.get_config()
  assert config["algorithm"] == "fft" and config["workspace_limit"] == 1 << 20
  clone = LargeConv3D.from_config(config)
  assert clone.get_config() == config
  assert set(keras.layers.Conv3D(5, 3).get_config()) <= set(config)
  serialized = keras.saving.serialize_keras_object(layer)
  assert serialized["registered_name"] == "tf_largeconv>LargeConv3D"
  copy = keras.saving.deserialize_keras_object(serialized)
  assert type(copy) is LargeConv3D and copy.get_config() == config
  # Positional arguments go where keras.layers.Conv3D takes them.
  positional = LargeConv3D(4, 3, 2, "same", "channels_first", 1, 2)
  assert (positional.strides, positional.padding, positional.data_format, positional.groups) == (
    (2, 2, 2),
    "same",
    "channels_first",
    2,
  )


def _functional():
  inp = keras.Input((8, 9, 10, 2))
  # algorithm='direct' and 'fft': with 'auto' the planner may hand these small
  # convolutions to TensorFlow's own kernel, and the reloaded model would not run the op.
  h = LargeConv3D(4, 5, padding="same", activation="relu", algorithm="direct")(inp)
  h = LargeConv3D(4, (3, 7, 5), padding="same", groups=2, algorithm="fft")(h)
  return keras.Model(inp, keras.layers.Conv3D(2, 1)(h))


def test_keras_file_loads_and_trains_in_a_fresh_process(rng, tmp_path):
  x = rng.standard_normal((2, 8, 9, 10, 2)).astype(np.float32)
  t = rng.standard_normal((2, 8, 9, 10, 2)).astype(np.float32)
  keras_reload.keras_file_trains_alike(
    _functional(),
    x,
    t,
    tmp_path,
    [
      'kinds = [(type(l).__name__, getattr(l, "algorithm", None)) for l in m.layers[1:3]]',
      'assert kinds == [("LargeConv3D", "direct"), ("LargeConv3D", "fft")], kinds',
    ],
  )


def test_convert_swaps_large_conv3d(rng):
  inp = keras.Input((16, 8, 9, 2))
  h = keras.layers.Conv3D(4, 3, padding="same")(inp)
  h = keras.layers.Conv3D(4, (15, 3, 3), padding="same", groups=2, activation="relu")(h)
  h = keras.layers.Conv3D(2, (3, 3, 5), padding="valid")(h)
  model = keras.Model(inp, h)
  converted = lc.keras.convert(model, min_kernel_size=15, algorithm="fft")
  kinds = [type(l).__name__ for l in converted.layers[1:]]
  assert kinds == ["Conv3D", "LargeConv3D", "Conv3D"]
  assert converted.layers[2].algorithm == "fft" and converted.layers[2].groups == 2
  x = rng.standard_normal((2, 16, 8, 9, 2)).astype(np.float32)
  want = model(x).numpy()
  _assert_close(converted(x).numpy(), want, "converted output")


@pytest.mark.parametrize(
  "kwargs,message",
  [
    (
      dict(strides=2, dilation_rate=2),
      "`strides > 1` not supported in conjunction with `dilation_rate > 1`",
    ),
    (dict(filters=5, groups=2), "number of filters must be evenly divisible"),
    (dict(padding="causal"), "padding"),
    (dict(kernel_size=(3, 3)), "kernel_size"),
    (dict(data_format="NCDHW"), "data_format"),
    (dict(padding=((1, 1), (1, 1), (1, 1))), "padding"),
    (dict(algorithm="winograd"), "algorithm must be one of"),
    (dict(workspace_limit=-1), "workspace_limit must be"),
  ],
)
def test_bad_arguments_raise_keras_like_errors(kwargs, message):
  kwargs = dict(dict(filters=4, kernel_size=3), **kwargs)
  with pytest.raises(ValueError, match=message):
    LargeConv3D(**kwargs)
  keras_kwargs = {k: v for k, v in kwargs.items() if k not in ("algorithm", "workspace_limit")}
  if keras_kwargs != kwargs:
    return
  # Keras refuses the same arguments with the same error type (a list padding only when
  # the layer is called).
  with pytest.raises(ValueError):
    keras.layers.Conv3D(**keras_kwargs)(np.zeros((1, 4, 4, 4, 2), np.float32))


@pytest.mark.parametrize(
  "kwargs,shape",
  [
    (dict(filters=2, kernel_size=5), (1, 4, 6, 6, 2)),  # too small for the kernel
    (dict(filters=4, kernel_size=3, groups=2), (1, 5, 5, 5, 3)),  # 3 channels, 2 groups
  ],
)
def test_bad_inputs_raise_as_keras(kwargs, shape):
  x = np.zeros(shape, np.float32)
  with pytest.raises(ValueError):
    keras.layers.Conv3D(**kwargs)(x)
  with pytest.raises(ValueError):
    LargeConv3D(**kwargs)(x)


def test_supports_jit_and_runs_under_xla(rng):
  for algorithm, jit in (
    ("auto", True),
    ("portable", True),
    ("tf", True),
    ("direct", False),
    ("fft", False),
  ):
    assert LargeConv3D(2, 3, algorithm=algorithm).supports_jit is jit
  layer = LargeConv3D(3, 5, padding="same", groups=1)
  x = rng.standard_normal((1, 6, 7, 8, 2)).astype(np.float32)
  want = layer(x).numpy()
  _assert_close(tf.function(layer, jit_compile=True)(x).numpy(), want, "under XLA")


# tf_keras (Keras 2)


def test_tf_keras_layer_equals_conv3d_and_trains(rng):
  tf_keras = pytest.importorskip("tf_keras")
  from tf_largeconv import tf_keras as lc_tf_keras

  for kwargs, x_shape in (CASES[1], CASES[3], CASES[5]):
    first = kwargs.get("data_format") == "channels_first"
    x = rng.standard_normal(x_shape).astype(np.float32)
    # algorithm='fft': groups run the op too (tf_keras compiles them with XLA otherwise).
    ours = lc_tf_keras.LargeConv3D(**kwargs, algorithm="fft", bias_initializer="random_normal")
    ref = tf_keras.layers.Conv3D(**dict(kwargs, data_format="channels_last"))
    xin = _to_first(x) if first else x
    ours(xin)
    ref(x)
    ref.set_weights(ours.get_weights())
    want = ref(x).numpy()
    got = ours(xin).numpy()
    _assert_close(_to_last(got) if first else got, want, f"tf_keras {kwargs}")
    assert tuple(ours.compute_output_shape(xin.shape)) == got.shape
  layer = lc_tf_keras.LargeConv3D(3, 5, padding="same", algorithm="direct")
  config = layer.get_config()
  assert config["algorithm"] == "direct"
  copy = tf_keras.layers.deserialize(tf_keras.layers.serialize(layer))
  assert type(copy) is lc_tf_keras.LargeConv3D and copy.get_config() == config
  assert tf_keras.utils.get_registered_name(lc_tf_keras.LargeConv3D) == ("tf_largeconv>LargeConv3D")

  # Training: the same model with tf_keras.layers.Conv3D from the same weights is the
  # oracle; the two differ by float32 rounding while the kernel moves by far more.
  def model(conv):
    return tf_keras.Sequential(
      [
        tf_keras.Input((6, 7, 8, 2)),
        conv,
        tf_keras.layers.GlobalAveragePooling3D(),
        tf_keras.layers.Dense(1),
      ]
    )

  x = rng.random((8, 6, 7, 8, 2)).astype(np.float32)
  y = 3.0 * x.mean(axis=(1, 2, 3, 4))[:, None] + 1.0
  m = model(lc_tf_keras.LargeConv3D(3, 5, padding="same", algorithm="fft"))
  ref = model(tf_keras.layers.Conv3D(3, 5, padding="same"))
  assert len(m.trainable_weights) == 4  # kernel and bias tracked, not lost
  ref.set_weights(m.get_weights())
  before = m.get_weights()
  for net in (m, ref):
    net.compile(tf_keras.optimizers.SGD(1e-1), "mse")
    net.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
  for a, b in zip(m.get_weights(), ref.get_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  moved = np.abs(m.layers[0].get_weights()[0] - before[0]).max()
  assert moved > 1e-3, moved
