"""Windowed layers streamed with explicit padding (`stream._windowed`): which layers take
each tile's padding as their op's explicit padding and which pad a copy, and the streamed
result of each against the untiled model in float64, with tiles small enough that edge
tiles pad on every side (and one asymmetric padding of a strided window)."""

import keras
import pytest
from test_stream import _image
from test_stream import _randomize
from test_stream import check
from test_stream import floatx

from tf_largeconv import keras as lk
from tf_largeconv.stream import _windowed

L = keras.layers


class OwnCall(L.Conv2D):
  """A Conv2D whose call is the user's: streamed by its own call on a padded copy."""

  def call(self, inputs):
    return super().call(inputs) * 2.0


EXPLICIT_2D = [
  lambda: L.Conv2D(3, 5, padding="same", activation="relu"),
  lambda: L.Conv2D(3, 4, strides=3, padding="same"),
  lambda: L.DepthwiseConv2D(5, strides=2, padding="same", depth_multiplier=2),
  lambda: L.SeparableConv2D(4, 3, dilation_rate=3, padding="same", activation="tanh"),
  lambda: L.MaxPooling2D(3, strides=2, padding="same"),
  lambda: L.MaxPooling2D(4, strides=3, padding="same"),
  lambda: lk.LargeConv2D(2, 9, padding="same"),
  lambda: lk.LargeDepthwiseConv2D(7, strides=2, padding="same"),
]
COPIED_2D = [
  lambda: L.AveragePooling2D(3, strides=2, padding="same"),
  lambda: L.Conv2D(4, 3, padding="same", groups=2),
  lambda: OwnCall(3, 3, padding="same"),
  lambda: L.Conv2D(2, 3, dilation_rate=2, padding="same", use_bias=False),
]
EXPLICIT_1D = [
  lambda: L.Conv1D(3, 5, padding="causal"),
  lambda: L.Conv1D(3, 4, strides=2, padding="same"),
  lambda: L.DepthwiseConv1D(5, padding="same"),
  lambda: L.SeparableConv1D(3, 3, padding="same"),
  lambda: L.MaxPooling1D(3, strides=2, padding="same"),
  lambda: lk.LargeConv1D(2, 7, padding="causal"),
]


def _model(make, shape):
  inp = keras.Input(shape)
  x = L.Conv2D(4, 1)(inp) if len(shape) == 3 else L.Conv1D(4, 1)(inp)
  return _randomize(keras.Model(inp, make()(x)))


@pytest.mark.parametrize("k", range(len(EXPLICIT_2D) + len(COPIED_2D)))
def test_2d_layers_stream_exactly_with_or_without_a_copy(k):
  makes = EXPLICIT_2D + COPIED_2D
  with floatx("float64"):
    model = _model(makes[k], (None, None, 3))
  layer = model.layers[-1]
  assert (_windowed.explicit_call(layer, 2) is not None) == (k < len(EXPLICIT_2D)), layer
  check(model, _image((2, 37, 30, 3), "float64"), (5, 8, 16), "float64")


@pytest.mark.parametrize("k", range(len(EXPLICIT_1D)))
def test_1d_layers_stream_exactly_with_explicit_padding(k):
  with floatx("float64"):
    model = _model(EXPLICIT_1D[k], (None, 3))
  assert _windowed.explicit_call(model.layers[-1], 1) is not None
  check(model, _image((2, 53, 3), "float64"), (5, 11), "float64")


def test_3d_layers_pad_a_copy():
  assert _windowed.explicit_call(L.Conv3D(2, 3, padding="same"), 3) is None


def test_padded_copies_happen_only_where_the_op_cannot_take_the_padding(monkeypatch):
  """No tf.pad runs for a network of explicit-padding layers, one per tile for the
  average pooling."""
  import tensorflow as tf

  from tf_largeconv import stream

  calls = []
  real = tf.pad
  monkeypatch.setattr(tf, "pad", lambda *a, **k: calls.append(1) or real(*a, **k))
  with floatx("float64"):
    inp = keras.Input((None, None, 3))
    x = inp
    for make in EXPLICIT_2D[:5]:
      x = make()(x)
    explicit = _randomize(keras.Model(inp, x))
  image = _image((1, 64, 64, 3), "float64")
  stream.predict(explicit, image, tile=16)
  assert calls == []
  with floatx("float64"):
    pooled = _model(COPIED_2D[0], (None, None, 3))
  stream.predict(pooled, image, tile=16)
  assert len(calls) > 0


@pytest.mark.parametrize("k", range(len(EXPLICIT_2D)))
def test_explicit_calls_have_the_layers_gradients(k):
  """On a whole image with the layer's own 'same' padding, the explicit call and its
  gradients (input and every variable) are the layer's."""
  import tensorflow as tf

  from tf_largeconv.stream import _layers
  from tf_largeconv.stream import _rules

  with floatx("float64"):
    model = _model(EXPLICIT_2D[k], (None, None, 3))
  layer, x = model.layers[-1], tf.constant(_image((1, 19, 22, 3), "float64"))
  x = model.layers[-2](x)
  rule, _ = _layers.rule_for(layer, [model.layers[-2].output], 2, layer)
  assert rule.explicit
  pads = []
  for n, size, s, d in zip(x.shape[1:3], rule.kernel, rule.strides, rule.dilations):
    out, before, extent = _rules.slide_axis(n, size, s, d, "same")
    pads.append((before, (out - 1) * s + extent - n - before))
  weights = tf.constant(_image(tuple(layer(x).shape), "float64", seed=5))
  got, want = [], []
  for run, grads in ((lambda: rule.call(x, pads), got), (lambda: layer(x), want)):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = run()
      loss = tf.reduce_sum(y * weights)
    grads += [y, *tape.gradient(loss, [x, *layer.trainable_variables])]
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert g is not None and w is not None
    scale = float(tf.reduce_max(tf.abs(w))) or 1.0
    assert float(tf.reduce_max(tf.abs(g - w))) <= 1e-10 * scale


class OwnUpsampling(L.UpSampling2D):
  """An UpSampling2D whose call is the user's: streamed by its own call and a crop."""

  def call(self, inputs):
    return super().call(inputs) + 1.0


NEAREST = [  # (layer, rank, whether it gathers the tile's pixels)
  (lambda: L.UpSampling1D(3), 1, True),
  (lambda: L.UpSampling2D((2, 3)), 2, True),
  (lambda: L.UpSampling3D((2, 1, 3)), 3, True),
  (lambda: L.UpSampling2D(2, interpolation="bilinear"), 2, False),
  (lambda: OwnUpsampling(2), 2, False),
]


@pytest.mark.parametrize("k", range(len(NEAREST)))
def test_nearest_upsampling_gathers_only_the_tiles_pixels(k):
  """Keras's nearest upsampling gives a tile's output pixels directly (`nearest_window`),
  equal to upsampling the window and cropping it, from odd and even starts; under the
  tape, and for layers that compute otherwise, the layer's own call runs."""
  import numpy as np
  import tensorflow as tf

  make, rank, gathers = NEAREST[k]
  layer = make()
  window = _windowed.nearest_window(layer, rank)
  assert (window is not None) == gathers
  if window is None:
    return
  sizes = (5, 4, 3)[:rank]
  x = tf.constant(np.random.default_rng(k).standard_normal((2, *sizes, 3)))
  full = layer(x).numpy()
  factors = [full.shape[1 + i] // n for i, n in enumerate(sizes)]
  for starts in ([1] * rank, [f + 1 for f in factors], [0] * rank):
    lengths = [full.shape[1 + i] - s - 1 for i, s in enumerate(starts)]
    index = tuple(slice(s, s + n) for s, n in zip(starts, lengths))
    got = window(x, starts, lengths)
    np.testing.assert_array_equal(got.numpy(), full[(slice(None), *index)])
  with _windowed.taped():
    assert window(x, [0] * rank, list(full.shape[1:-1])) is None


LARGE = [  # (layer, rank, whether the package's op runs under the tape)
  (lambda: L.Conv2D(3, 15, strides=2, padding="same", activation="relu"), 2, True),
  (lambda: L.DepthwiseConv2D(11, padding="same", depth_multiplier=2), 2, True),
  (lambda: L.DepthwiseConv2D((11, 5), strides=2, padding="same", activation="tanh"), 2, True),
  (lambda: L.DepthwiseConv2D(11, dilation_rate=2, padding="same"), 2, True),
  (lambda: L.Conv1D(2, 15, padding="causal"), 1, True),
  (lambda: L.DepthwiseConv1D(11, padding="same"), 1, True),
  (lambda: L.Conv2D(3, 14, padding="same"), 2, False),
  (lambda: L.DepthwiseConv2D(10, padding="same"), 2, False),
]


@pytest.mark.parametrize("k", range(len(LARGE)))
def test_large_keras_kernels_run_the_packages_op_under_the_tape(k, monkeypatch):
  """Under a tile's gradient tape, Keras convolutions with kernels from
  `PACKAGE_UNDER_TAPE` run the package's op (TensorFlow's not at all; smaller kernels
  TensorFlow's), with the layer's result and gradients (input and every variable), on a
  window padded on every side."""
  import tensorflow as tf

  from tf_largeconv import ops
  from tf_largeconv.stream import _layers
  from tf_largeconv.stream import _rules

  calls = {"tf": 0, "package": 0}
  for module, name, who in [
    (tf.nn, "conv2d", "tf"),
    (tf.nn, "depthwise_conv2d", "tf"),
    (ops, "conv2d", "package"),
    (ops, "depthwise_conv2d", "package"),
  ]:
    real = getattr(module, name)
    monkeypatch.setattr(
      module,
      name,
      lambda *a, real=real, who=who, **kw: calls.__setitem__(who, calls[who] + 1) or real(*a, **kw),
    )
  make, rank, package = LARGE[k]
  with floatx("float64"):
    model = _model(make, (None, None, 3) if rank == 2 else (None, 3))
  layer = model.layers[-1]
  shape = (1, 19, 22, 3) if rank == 2 else (1, 23, 3)
  x = model.layers[-2](tf.constant(_image(shape, "float64")))
  rule, _ = _layers.rule_for(layer, [model.layers[-2].output], rank, layer)
  assert rule.explicit and rule.package_under_tape == package
  assert not (package and rule.taped_copy)  # no copy: the op takes the padding
  pads = []
  for n, size, s, d in zip(x.shape[1:-1], rule.kernel, rule.strides, rule.dilations):
    out, before, extent = _rules.slide_axis(n, size, s, d, layer.padding)
    pads.append((before, (out - 1) * s + extent - n - before))
  weights = tf.constant(_image(tuple(layer(x).shape), "float64", seed=5))
  got, want = [], []
  calls.update(tf=0, package=0)
  for run, grads, tape in (
    (lambda: rule.call(x, pads), got, _windowed.tile_tape),
    (lambda: layer(x), want, tf.GradientTape),
  ):
    with tape() as t:
      t.watch(x)
      y = run()
      loss = tf.reduce_sum(y * weights)
    grads += [y, *t.gradient(loss, [x, *layer.trainable_variables])]
    if grads is got:
      assert calls == ({"tf": 0, "package": 1} if package else {"tf": 1, "package": 0}), calls
  for g, w in zip(got, want, strict=True):
    scale = float(tf.reduce_max(tf.abs(w))) or 1.0
    assert float(tf.reduce_max(tf.abs(g - w))) <= 1e-10 * scale


def test_same_is_taken_exactly_where_it_gives_the_explicit_padding():
  """`_same_as` holds for an axis exactly where tf.nn.conv2d with padding 'SAME' gives the
  output of the explicit padding: the same shape and values, over small sizes, kernels,
  strides, dilations and paddings (where an output reads only padding, it may hold less
  often)."""
  import numpy as np
  import tensorflow as tf

  rng = np.random.default_rng(3)
  checked = {True: 0, False: 0}
  for n, k, s, d in np.ndindex(9, 5, 3, 2):
    n, k, s, d = n + 1, k + 1, s + 1, d + 1
    x = tf.constant(rng.normal(size=(1, 1, n, 1)))
    w = tf.constant(rng.normal(size=(1, k, 1, 1)))
    same = tf.nn.conv2d(x, w, [1, s], "SAME", dilations=[1, d])
    extent = (k - 1) * d + 1
    for a, b in np.ndindex(extent + 1, extent + 1):
      if n + a + b < extent:
        continue
      pads = [[0, 0], [0, 0], [a, b], [0, 0]]
      y = tf.nn.conv2d(x, w, [1, s], pads, dilations=[1, d])
      equal = y.shape == same.shape and bool(tf.reduce_all(y == same))
      got = _windowed._same_as(n, k, s, d, (int(a), int(b)))
      # Where some output reads padding only, another padding can give it too.
      reads = tf.nn.conv2d(tf.ones_like(x), tf.ones_like(w), [1, s], pads, dilations=[1, d])
      if bool(tf.reduce_all(reads > 0)):
        assert got == equal, (n, k, s, d, a, b)
      else:
        assert equal or not got, (n, k, s, d, a, b)
      checked[got] += 1
  assert checked[True] > 100 and checked[False] > 1000


def test_a_tile_that_spans_the_image_runs_its_ops_with_same(monkeypatch):
  """One tile over the whole image of a network of stride 1: every windowed op gets 'SAME'
  (no explicit pairs), and the streamed result is the untiled model's; small tiles take
  'VALID' inside and explicit pairs at the edges."""
  import numpy as np
  import tensorflow as tf

  from tf_largeconv import stream

  seen = []
  for name in ("conv2d", "depthwise_conv2d", "separable_conv2d", "max_pool2d"):
    real = getattr(tf.nn, name)

    def spy(*args, real=real, at=4 if name == "separable_conv2d" else 3, **kwargs):
      seen.append(args[at] if len(args) > at else kwargs.get("padding"))
      return real(*args, **kwargs)

    monkeypatch.setattr(tf.nn, name, spy)
  with floatx("float64"):
    inp = keras.Input((None, None, 3))
    x = L.Conv2D(3, 5, padding="same", activation="relu")(inp)
    x = L.DepthwiseConv2D(4, padding="same", depth_multiplier=2)(x)
    x = L.SeparableConv2D(4, 3, dilation_rate=3, padding="same")(x)
    x = L.MaxPooling2D(3, strides=1, padding="same")(x)
    model = _randomize(keras.Model(inp, x))
  image = _image((1, 40, 36, 3), "float64")
  want = model(image, training=False).numpy()
  seen.clear()
  got = stream.predict(model, image, tile=64)
  assert np.abs(got - want).max() <= 1e-12 * np.abs(want).max()
  assert seen and all(p == "SAME" for p in seen), seen
  seen.clear()
  stream.predict(model, _image((1, 160, 160, 3), "float64"), tile=48)
  assert "VALID" in seen and any(not isinstance(p, str) for p in seen), seen


FUSED_2D = [  # (layer, whether it runs as one traced function outside the tape)
  (lambda: L.Conv2D(3, 5, padding="same", activation="relu"), True),
  (lambda: L.Conv2D(3, 4, strides=3, padding="same"), True),
  (lambda: L.Conv2D(2, 3, padding="valid", activation="relu", use_bias=False), False),
  (lambda: L.Conv2D(2, 3, padding="same", activation="tanh"), False),
  (lambda: L.DepthwiseConv2D(3, padding="same", activation="relu"), False),
  (lambda: L.Conv2D(3, 3, padding="same", activation="relu", dtype="mixed_bfloat16"), False),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_convolutions_with_a_bias_run_fused_outside_the_tape(dtype, monkeypatch):
  """A Conv1D/Conv2D with a bias and a linear or ReLU activation runs as one traced
  function on every tile outside the tape where TensorFlow's pool serves tensors (bit for
  bit the untiled model's where the tile spans the image, within rounding on small tiles);
  others run their ops one by one; under the tape, or without the pool, none is fused. The
  memory model counts a fused call's output alone (three tensors for the eager ops)."""
  import numpy as np

  from tf_largeconv import stream
  from tf_largeconv.stream import _fused
  from tf_largeconv.stream import _layers
  from tf_largeconv.stream import _pool

  monkeypatch.setattr(_pool, "pooled", lambda: True)  # as with oneDNN on
  ran = []
  real = _fused.conv

  def spy(*key):
    fn = real(*key)
    return lambda *args: ran.append(key) or fn(*args)

  monkeypatch.setattr(_fused, "conv", spy)
  for make, fused in FUSED_2D:
    with floatx(dtype):
      model = _model(make, (None, None, 3))
    layer = model.layers[-1]
    kernel = tuple(int(n) for n in layer.kernel.shape)
    call = _windowed.explicit_call(layer, 2)
    assert _windowed.fused_outside_tape(call) == fused, layer
    rule, kind = _layers.rule_for(layer, [model.layers[-2].output], 2, layer)
    assert rule.fused == fused
    unfused = _layers.allocs(layer, kind, 1)
    assert _layers.allocs(layer, kind, 1, rule.fused) == ((1.0,) if fused else unfused)
    image = _image((2, 37, 30, 3), dtype)
    ran.clear()
    ref = check(model, image, (5, 8, 16), dtype)
    mine = [key for key in ran if key[-1] == kernel]
    assert bool(mine) == fused, (layer, ran)
    assert all(key[3] == (layer.activation is keras.activations.relu) for key in mine)
    ran.clear()
    np.testing.assert_array_equal(stream.predict(model, image, tile=64), ref)
    assert any(key[-1] == kernel for key in ran) == fused
    ran.clear()
    x = model.layers[-2](image)
    with _windowed.tile_tape():
      call(x, [(0, 0), (0, 0)])
    assert ran == []
    monkeypatch.setattr(_pool, "pooled", lambda: False)  # malloc's memory: the ops one by one
    unpooled = _windowed.explicit_call(layer, 2)
    unpooled(x, [(0, 0), (0, 0)])
    assert ran == [] and not _windowed.fused_outside_tape(unpooled)
    monkeypatch.setattr(_pool, "pooled", lambda: True)
