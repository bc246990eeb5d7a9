"""fold, reparameterize and FoldedBlock (tf_largeconv/fold/ through tf_largeconv.keras):
the founding user's block (1x1 P; depthwise KxK on P minus P; dense KxK on P; concatenated)
at K = 7 and 31 folds, reparameterizes and trains as FoldedBlock equal to the Keras block;
the kernel algebra against a dense numpy reference; random linear blocks (hypothesis) fold
exactly in float64 or are refused with a named reason, and exact=False counts exactly the
pixels that differ; each refusal's message; RepLKNet and RepVGG reparameterized;
FoldedBlock serialised (.keras, SavedModel, a fresh process) and under tf_keras.
FUZZ_EXAMPLES sets the number of random blocks."""

import math
import os
import re

import keras
import numpy as np
import pytest
import subproc
import tensorflow as tf
from hypothesis import HealthCheck
from hypothesis import event
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from tf_largeconv import fold as _fold
from tf_largeconv.keras import FoldedBlock
from tf_largeconv.keras import FoldWarning
from tf_largeconv.keras import LargeConv2D
from tf_largeconv.keras import LargeDepthwiseConv2D
from tf_largeconv.keras import fold
from tf_largeconv.keras import reparameterize

L = keras.layers
F64 = "float64"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "25"))
SETTINGS = settings(
  max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
# float64 folds: a few hundred roundings of O(1) terms, FFT included, stay far below this.
EXACT = 1e-9
# float32 against Keras's own float32 layers: the op's FFT rounding (tests/test_keras.py).
F32_RTOL = 1e-4


def founding_block(k, channels=3, size=24, dtype=None):
  """The founding user's block, as written: p = P(x); d = D(p) - p; l = L(p); concat."""
  x = keras.Input((size, size, channels), dtype=dtype)
  p = L.Conv2D(channels, 1, use_bias=False, dtype=dtype)(x)
  d = L.DepthwiseConv2D(k, padding="same", use_bias=False, dtype=dtype)(p) - p
  low = L.Conv2D(channels, k, padding="same", use_bias=False, dtype=dtype)(p)
  return keras.Model(x, L.Concatenate(dtype=dtype)([d, low]))


def randomize(model, rng):
  """Random weights everywhere (biases and BN statistics included; variances > 0)."""
  for layer in model.layers:
    weights = [rng.standard_normal(v.shape) for v in layer.weights]
    for i, v in enumerate(layer.weights):
      if v.path.endswith("moving_variance"):
        weights[i] = np.abs(weights[i]) + 0.5
    layer.set_weights(weights)
  return model


def assert_close(got, want, rtol, err_msg=""):
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape, (got.shape, want.shape, err_msg)
  np.testing.assert_allclose(
    got, want, rtol=0, atol=rtol * max(np.abs(want).max(), 1.0), err_msg=err_msg
  )


def gradients(fn, x, variables, dy):
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = fn(x)
  return y, tape.gradient(y, [x] + [v.value for v in variables], output_gradients=dy)


@pytest.mark.parametrize("k", [7, 31])
def test_founding_block_fold_and_reparameterize_equal_the_block(rng, k):
  block = randomize(founding_block(k, dtype=F64), rng)
  x = rng.standard_normal((2, 24, 24, 3))
  want = block(x).numpy()
  folded = fold(block, dtype=F64)
  assert type(folded) is LargeConv2D
  assert folded.kernel.shape == (k, k, 3, 6) and folded.padding == "same"
  assert not folded.use_bias  # bias-free, as the user wrote it
  assert_close(folded(x), want, EXACT)
  rep = reparameterize(block)
  assert [type(layer) for layer in rep.layers[1:]] == [LargeConv2D]
  assert_close(rep(x), want, EXACT)


@pytest.mark.parametrize("k", [7, 31])
def test_founding_block_as_folded_block_equals_it_with_gradients(rng, k):
  block = randomize(founding_block(k), rng)
  folded = FoldedBlock(block)
  assert folded.weights == block.weights  # the block's own variables
  x = tf.constant(rng.standard_normal((2, 24, 24, 3)), tf.float32)
  dy = tf.constant(rng.standard_normal((2, 24, 24, 6)), tf.float32)
  want_y, want = gradients(block, x, block.trainable_variables, dy)
  got_y, got = gradients(folded, x, block.trainable_variables, dy)
  assert_close(got_y, want_y, F32_RTOL)
  names = ["input"] + [v.path for v in block.trainable_variables]
  assert len(names) == 4
  for name, a, b in zip(names, got, want):
    assert_close(a, b, F32_RTOL, err_msg=f"gradient for {name}")


def test_folded_block_trains_like_the_block(rng):
  x = rng.standard_normal((4, 16, 16, 3)).astype(np.float32)
  t = rng.standard_normal((4, 16, 16, 6)).astype(np.float32)
  ours, theirs = founding_block(7, size=16), founding_block(7, size=16)
  randomize(ours, rng)
  theirs.set_weights(ours.get_weights())
  before = ours.get_weights()
  models = (
    keras.Sequential([keras.Input((16, 16, 3)), FoldedBlock(ours)]),
    keras.Sequential([keras.Input((16, 16, 3)), theirs]),
  )
  for m in models:
    m.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    m.fit(x, t, batch_size=2, epochs=2, shuffle=False, verbose=0)
  for a, b, b0 in zip(ours.get_weights(), theirs.get_weights(), before):
    assert np.abs(b - b0).max() > 1e-3  # trained, far beyond the tolerance
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_folded_block_trains_under_jit_compile_like_the_block(rng):
  """Under XLA the block's 'auto' takes conv2d's portable path, so a model holding it keeps
  jit_compile and trains as the unfolded block does."""
  x = rng.standard_normal((4, 16, 16, 3)).astype(np.float32)
  t = rng.standard_normal((4, 16, 16, 6)).astype(np.float32)
  ours, theirs = founding_block(7, size=16), founding_block(7, size=16)
  randomize(ours, rng)
  theirs.set_weights(ours.get_weights())
  folded = FoldedBlock(ours)
  assert folded.supports_jit
  assert not FoldedBlock(founding_block(7, size=16), algorithm="fft").supports_jit
  models = (
    keras.Sequential([keras.Input((16, 16, 3)), folded]),
    keras.Sequential([keras.Input((16, 16, 3)), theirs]),
  )
  for m in models:
    m.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", jit_compile=True)
    m.fit(x, t, batch_size=2, epochs=2, shuffle=False, verbose=0)
  assert models[0].jit_compile  # not turned off for the whole model
  for a, b in zip(ours.get_weights(), theirs.get_weights()):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------
# The kernel algebra
# ---------------------------------------------------------------------------------------


def _dense(kernel, groups):
  """A grouped kernel [h, w, C0/g, C] as the dense [h, w, C0, C] block-diagonal one."""
  h, w, n, c = kernel.shape
  out = np.zeros((h, w, n * groups, c))
  for g in range(groups):
    out[:, :, g * n : (g + 1) * n, g * (c // groups) : (g + 1) * (c // groups)] = kernel[
      :, :, :, g * (c // groups) : (g + 1) * (c // groups)
    ]
  return out


@pytest.mark.parametrize(
  "ga,gb,ka,kb",
  [
    (1, 1, 3, 2),
    (2, 3, 2, 3),
    (2, 3, 1, 3),
    (2, 3, 3, 1),
    (4, 6, 2, 2),
    (12, 1, 1, 4),
    (1, 12, 3, 1),
    (12, 12, 2, 3),
    (6, 4, 1, 1),
    (3, 12, 4, 2),
  ],
)
def test_composed_kernels_equal_the_dense_composition(rng, ga, gb, ka, kb):
  c0, c, c2 = 12, 12, 24
  a = rng.standard_normal((ka, ka + 1, c0 // ga, c))
  b = rng.standard_normal((kb, kb, c // gb, c2))
  got, g = _fold._compose_kernels(tf.constant(a), ga, tf.constant(b), gb)
  assert g == math.gcd(ga, gb)
  da, db = _dense(a, ga), _dense(b, gb)
  want = np.zeros((ka + kb - 1, ka + kb, c0, c2))
  for u in range(ka):  # full convolution over space, matrix product over channels
    for v in range(ka + 1):
      for p in range(kb):
        for q in range(kb):
          want[u + p, v + q] += da[u, v] @ db[p, q]
  assert_close(_dense(got.numpy(), g), want, EXACT)


def _one(*layers, shape=(9, 10, 4), branches=None):
  """A float64 block: the layers in a chain, then (optionally) branches(x, y) -> output."""
  x = keras.Input(shape, dtype=F64)
  y = x
  for layer in layers:
    y = layer(y)
  return keras.Model(x, branches(x, y) if branches else y)


def _conv(*args, **kwargs):
  return L.Conv2D(*args, dtype=F64, **kwargs)


def _dw(*args, **kwargs):
  return L.DepthwiseConv2D(*args, dtype=F64, **kwargs)


# Every supported layer and setting once, biases on: (id, block builder, folded type).
SETTINGS_TABLE = [
  ("even kernel same", lambda: _one(_conv(3, (2, 4), padding="same")), LargeConv2D),
  ("dilated same", lambda: _one(_conv(3, 3, padding="same", dilation_rate=2)), LargeConv2D),
  ("dilated valid", lambda: _one(_conv(2, (3, 2), dilation_rate=(2, 1))), LargeConv2D),
  ("grouped", lambda: _one(_conv(6, 3, groups=2)), LargeConv2D),
  ("strided same", lambda: _one(_conv(3, 3, strides=2, padding="same")), LargeConv2D),
  (
    "strided valid then 1x1",
    lambda: _one(_conv(3, 4, strides=(2, 3), use_bias=False), _conv(2, 1, strides=2)),
    LargeConv2D,
  ),
  (
    "depthwise multiplier",
    lambda: _one(_dw(4, padding="same", depth_multiplier=2)),
    LargeDepthwiseConv2D,
  ),
  (
    "depthwise dilated",
    lambda: _one(_dw(3, padding="same", dilation_rate=2)),
    LargeDepthwiseConv2D,
  ),
  ("separable", lambda: _one(L.SeparableConv2D(3, 3, padding="same", dtype=F64)), LargeConv2D),
  (
    "groups 2 then 3 (valid)",
    lambda: _one(_conv(6, 3, groups=2), _conv(6, 2, groups=3)),
    LargeConv2D,
  ),
  (
    "depthwise plus grouped",
    lambda: _one(
      branches=lambda x, y: L.Add(dtype=F64)(
        [_dw(3, padding="same", use_bias=False)(x), _conv(4, 3, padding="same", groups=2)(x)]
      )
    ),
    LargeConv2D,
  ),
  (
    "concat of biased branches",
    lambda: _one(
      branches=lambda x, y: L.Concatenate(dtype=F64)(
        [
          _conv(2, 1)(x),
          L.BatchNormalization(dtype=F64)(x),
          _dw(3, padding="same")(x),
          _conv(4, 1, groups=2)(x),
        ]
      )
    ),
    LargeConv2D,
  ),
  (
    "padding then valid",
    lambda: _one(L.ZeroPadding2D(((1, 1), (2, 0)), dtype=F64), _conv(3, 3, use_bias=False)),
    LargeConv2D,
  ),
  (
    "crop then valid",
    lambda: _one(L.Cropping2D(((1, 0), (0, 1)), dtype=F64), _conv(3, 2)),
    LargeConv2D,
  ),
  ("rescaling then 1x1", lambda: _one(L.Rescaling(0.5, 0.25, dtype=F64), _conv(3, 1)), LargeConv2D),
  (
    "bn, 1x1, bn, minus x",
    lambda: _one(
      L.BatchNormalization(dtype=F64),
      _conv(4, 1),
      L.BatchNormalization(dtype=F64),
      branches=lambda x, y: L.Subtract(dtype=F64)([y, x]),
    ),
    LargeConv2D,
  ),
  ("operators", lambda: _one(branches=lambda x, y: 2.0 * x - (-x) / 4.0), LargeDepthwiseConv2D),
  (
    "nested model",
    lambda: _one(
      branches=lambda x, y: _one(
        _conv(4, 3, padding="same", use_bias=False), L.BatchNormalization(dtype=F64)
      )(x)
    ),
    LargeConv2D,
  ),
]


@pytest.mark.parametrize(
  "build,kind", [c[1:] for c in SETTINGS_TABLE], ids=[c[0] for c in SETTINGS_TABLE]
)
def test_each_layer_and_setting_folds_exactly(rng, build, kind):
  block = randomize(build(), rng)
  x = rng.standard_normal((2, 9, 10, 4))
  want = block(x).numpy()
  folded = fold(block, dtype=F64)
  assert type(folded) is kind
  assert_close(folded(x), want, EXACT)
  assert_close(FoldedBlock(block, dtype=F64)(x), want, EXACT)


# ---------------------------------------------------------------------------------------
# Random linear blocks
# ---------------------------------------------------------------------------------------

KINDS = (
  "conv",
  "depthwise",
  "separable",
  "bn",
  "pad",
  "crop",
  "add",
  "subtract",
  "average",
  "concat",
  "identity",
  "rescaling",
  "ops",
  "nested",
)
# The refusals that may meet a random block; each names the layer.
REASONS = (
  "at the border the block is not one convolution",
  "a stride before a spatial kernel is not one convolution",
  "no convolution with padding 'same' or 'valid' computes it",
)


def _random_layer(draw, kind, src, tensors):
  """Applies one random linear layer of `kind` to src (and maybe another tensor)."""
  cin, small = src.shape[-1], st.integers(1, 4)
  padding = st.sampled_from(["same", "valid"])
  stride = draw(st.sampled_from([1, 1, 1, 1, 2]))
  bias = draw(st.booleans())
  if kind == "conv":
    groups = draw(st.sampled_from([g for g in (1, 2, 3) if cin % g == 0]))
    dilation = draw(st.sampled_from([1, 2])) if stride == 1 else 1
    return L.Conv2D(
      groups * draw(st.integers(1, 2)),
      (draw(small), draw(small)),
      strides=stride,
      padding=draw(padding),
      dilation_rate=dilation,
      groups=groups,
      use_bias=bias,
      dtype=F64,
    )(src)
  if kind == "depthwise":
    return L.DepthwiseConv2D(
      draw(small),
      strides=stride,
      padding=draw(padding),
      depth_multiplier=draw(st.integers(1, 2)),
      use_bias=bias,
      dtype=F64,
    )(src)
  if kind == "separable":
    return L.SeparableConv2D(
      draw(st.integers(1, 3)),
      draw(st.integers(1, 3)),
      padding=draw(padding),
      use_bias=bias,
      dtype=F64,
    )(src)
  if kind == "bn":
    return L.BatchNormalization(
      center=draw(st.booleans()),
      scale=draw(st.booleans()),
      epsilon=draw(st.sampled_from([1e-3, 0.5])),
      dtype=F64,
    )(src)
  if kind in ("pad", "crop"):
    n = st.integers(0, 2 if kind == "pad" else 1)
    pairs = ((draw(n), draw(n)), (draw(n), draw(n)))
    return (L.ZeroPadding2D(pairs, dtype=F64) if kind == "pad" else L.Cropping2D(pairs, dtype=F64))(
      src
    )
  if kind in ("add", "subtract", "average", "concat"):
    fits = [
      t
      for t in tensors
      if tuple(t.shape[1:3]) == tuple(src.shape[1:3]) and (kind == "concat" or t.shape[-1] == cin)
    ]
    other = draw(st.sampled_from(fits))  # src itself fits: t - t cancels
    cls = {"add": L.Add, "subtract": L.Subtract, "average": L.Average, "concat": L.Concatenate}[
      kind
    ]
    return cls(dtype=F64)([src, other])
  if kind == "identity":
    return draw(st.sampled_from([L.Identity, lambda **kw: L.Activation("linear", **kw)]))(
      dtype=F64
    )(src)
  if kind == "rescaling":  # constants exact in float32: Keras casts them through it
    return L.Rescaling(
      draw(st.sampled_from([0.5, -1.25, 3.0])), draw(st.sampled_from([0.0, 0.75])), dtype=F64
    )(src)
  if kind == "ops":
    op = draw(st.sampled_from(["scale", "negative", "divide"]))
    return {"scale": lambda: 2.5 * src, "negative": lambda: -src, "divide": lambda: src / 4.0}[op]()
  inner = keras.Input(tuple(src.shape[1:]), dtype=F64)  # nested: a 3x3 conv + BN model
  body = L.BatchNormalization(dtype=F64)(L.Conv2D(cin, 3, padding=draw(padding), dtype=F64)(inner))
  return keras.Model(inner, body)(src)


def linear_block(draw):
  """A random block of the supported layers (draw: hypothesis's data.draw); its seed."""
  channels = draw(st.integers(1, 4))
  x = keras.Input((draw(st.integers(6, 14)), draw(st.integers(6, 14)), channels), dtype=F64)
  tensors = [x]
  for _ in range(draw(st.integers(2, 8))):
    src = draw(st.sampled_from(tensors))
    try:
      tensors.append(_random_layer(draw, draw(st.sampled_from(KINDS)), src, tensors))
    except ValueError:  # Keras refuses it (a kernel larger than its input): draw on
      continue
  return keras.Model(x, tensors[-1]), draw(st.integers(0, 2**16))


def _differing_pixels(got, want):
  return int((np.abs(got - want) > EXACT * max(np.abs(want).max(), 1.0)).any(axis=(0, 3)).sum())


def _check_gradients(block, folded, x, rng):
  xt = tf.constant(x)
  dy = tf.constant(rng.standard_normal(block(x).shape))
  _, want = gradients(lambda a: block(a, training=False), xt, block.trainable_variables, dy)
  _, got = gradients(folded, xt, block.trainable_variables, dy)
  for i, (a, b) in enumerate(zip(got, want)):
    assert_close(a, b, EXACT, err_msg=f"gradient {i}")


@SETTINGS
@given(st.data())
def test_random_linear_blocks_fold_exactly_or_are_refused_with_a_reason(data):
  block, seed = linear_block(data.draw)
  rng = np.random.default_rng(seed)
  randomize(block, rng)
  x = rng.standard_normal((2,) + tuple(block.inputs[0].shape[1:]))
  want = block(x).numpy()
  try:
    folded = fold(block, dtype=F64)
  except ValueError as e:
    message = str(e)
    assert any(r in message for r in REASONS), message
    assert "layer '" in message or "block '" in message, message  # names the culprit
    event("refused: " + next(r for r in REASONS if r in message))
    if REASONS[0] not in message:
      return
    # A border refusal: exact=False folds (FoldedBlock pads explicitly, so always) and
    # counts exactly the pixels that differ.
    try:
      loose = FoldedBlock(block, exact=False, dtype=F64)
    except ValueError as e2:
      assert REASONS[1] in str(e2), str(e2)
      return
    got = loose(x).numpy()
    assert got.shape == want.shape
    assert _differing_pixels(got, want) == loose.fold_report.differing_pixels
    event(f"counted: {min(loose.fold_report.differing_pixels, 1)} (pixels > 0)")
    return
  got = folded(x).numpy()
  assert_close(got, want, EXACT)
  event(f"folded: {type(folded).__name__}, {len(block.layers) - 1} layers")
  kernel = folded.kernel.numpy()
  if type(folded) is LargeDepthwiseConv2D:  # depthwise only when channel-diagonal
    assert kernel.shape[2] == x.shape[-1] and got.shape[-1] % x.shape[-1] == 0
  # FoldedBlock: the same outputs, and the block's gradients for every weight and x.
  folded_block = FoldedBlock(block, dtype=F64)
  assert_close(folded_block(x), want, EXACT)
  _check_gradients(block, folded_block, x, rng)


# ---------------------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------------------


def _chain(*layers, shape=(12, 12, 3), name=None):
  x = keras.Input(shape)
  y = x
  for layer in layers:
    y = layer(y)
  return keras.Model(x, y, name=name)


def _two_tensor_multiply():
  x = keras.Input((8, 8, 2))
  return keras.Model(x, L.Conv2D(2, 1, name="p")(x) * x)


def _two_inputs():
  a, b = keras.Input((8, 8, 2)), keras.Input((8, 8, 2))
  return keras.Model([a, b], L.Add()([a, b]))


REFUSALS = [
  (
    lambda: _chain(L.Conv2D(3, 3, padding="same", name="c"), L.ReLU(name="relu")),
    "ReLU layer 'relu' is not linear",
  ),
  (lambda: _chain(L.Activation("tanh", name="act")), "Activation layer 'act' (tanh) is not linear"),
  (
    lambda: _chain(L.Conv2D(3, 3, activation="relu", name="c")),
    "Conv2D layer 'c' has activation 'relu': not linear",
  ),
  (
    lambda: _chain(L.Dropout(0.5, name="drop")),
    "Dropout layer 'drop' is not linear (random in training)",
  ),
  (
    lambda: _chain(L.Conv2D(3, 1, name="p"), L.Conv2D(3, 3, padding="same", name="c")),
    "Conv2D layer 'c' pads its input (padding='same'), but its input carries a bias (added "
    "by Conv2D layer 'p'): at the border the block is not one convolution",
  ),
  (
    lambda: _chain(
      L.Conv2D(3, 3, padding="same", use_bias=False, name="a"),
      L.DepthwiseConv2D(5, padding="same", use_bias=False, name="b"),
    ),
    "DepthwiseConv2D layer 'b' pads its input (padding='same'), but its input is not zero "
    "beyond its border (it comes from Conv2D layer 'a')",
  ),
  (
    lambda: _chain(L.BatchNormalization(name="bn"), L.ZeroPadding2D(1, name="pad")),
    "ZeroPadding2D layer 'pad' pads its input (by (1, 1, 1, 1)), but its input carries a "
    "bias (added by BatchNormalization layer 'bn')",
  ),
  (
    lambda: _chain(
      L.Cropping2D(1, name="crop"), L.Conv2D(3, 3, padding="same", use_bias=False, name="c")
    ),
    "it comes from Cropping2D layer 'crop'",
  ),
  (
    lambda: _chain(
      L.Conv2D(3, 1, strides=2, use_bias=False, name="s"), L.Conv2D(3, 3, use_bias=False, name="c")
    ),
    "Conv2D layer 'c' has a 3x3 kernel after the stride of Conv2D layer 's': a stride "
    "before a spatial kernel is not one convolution",
  ),
  (
    lambda: _chain(L.ZeroPadding2D(2), L.Conv2D(3, 3, use_bias=False), name="padded"),
    "output of block 'padded' is +2 rows and +2 columns the size of its input, reading "
    "from offset (-2, -2): no convolution with padding 'same' or 'valid' computes it",
  ),
  (_two_tensor_multiply, "multiplies 2 tensors: not linear"),
  (
    lambda: _chain(L.Dense(3, name="dense")),
    "Dense layer 'dense' is not a linear layer fold supports",
  ),
  (
    lambda: _chain(L.BatchNormalization(axis=1, name="bn")),
    "BatchNormalization layer 'bn' normalises axis 1: fold needs the channel axis",
  ),
  (
    lambda: _chain(L.Conv2D(3, 3, strides=2, name="s"), shape=(None, None, 3)),
    "a strided fold needs the block's input height and width",
  ),
  (_two_inputs, "fold needs a model with one input and one output"),
  (lambda: keras.Sequential([L.Conv2D(2, 3)]), "is not built"),
]


@pytest.mark.parametrize("build,message", REFUSALS, ids=[m[:40] for _, m in REFUSALS])
def test_refusals_name_the_layer_and_the_reason(build, message):
  block = build()
  with pytest.raises(ValueError, match=re.escape(message)):
    fold(block)
  if "after the stride" in message or "not linear" in message:
    with pytest.raises(ValueError, match=re.escape(message)):
      FoldedBlock(block)  # the same analysis


# ---------------------------------------------------------------------------------------
# The border check at its boundary: padding on one side only
# ---------------------------------------------------------------------------------------

SIDES = ("top", "bottom", "left", "right")
# The output row or column that one row or column of padding on each side makes.
EDGES = {"top": np.s_[0, :], "bottom": np.s_[-1, :], "left": np.s_[:, 0], "right": np.s_[:, -1]}


def _sides(pads):
  """ZeroPadding2D's ((top, bottom), (left, right)) from {side: n}."""
  return ((pads["top"], pads["bottom"]), (pads["left"], pads["right"]))


def _pad_conv_pad(side, reach):
  """ZeroPadding2D (`reach` on `side`, 1 elsewhere), a 3x3 'valid' convolution, then one
  row or column of zeros on `side`. One step beyond `side` the convolution's formula is
  zero only where the padding before it covers the kernel's reach (2): padding that side
  again is exact at reach 2, and not at 1."""
  pre = {s: 1 for s in SIDES}
  pre[side] = reach
  post = {s: 0 for s in SIDES}
  post[side] = 1
  return _one(
    L.ZeroPadding2D(_sides(pre), dtype=F64),
    _conv(3, 3, use_bias=False),
    L.ZeroPadding2D(_sides(post), dtype=F64),
  )


def _even_kernel_same(axis, reach):
  """A 3x3 convolution whose input is padded by `reach` below (or right of) it and 1
  elsewhere, then a 2-tap 'same' convolution along `axis`: 'same' pads an even kernel
  after the image only, where the first convolution's formula is zero at reach 2 only."""
  pre = {s: 1 for s in SIDES}
  pre["bottom" if axis == 0 else "right"] = reach
  kernel = (2, 1) if axis == 0 else (1, 2)
  return _one(
    L.ZeroPadding2D(_sides(pre), dtype=F64),
    _conv(3, 3, use_bias=False),
    _conv(2, kernel, padding="same", use_bias=False),
  )


# (id, block builder, the side whose padding the check is about)
BOUNDARY = [(f"zero padding {s}", lambda reach, s=s: _pad_conv_pad(s, reach), s) for s in SIDES] + [
  ("even kernel same, rows", lambda reach: _even_kernel_same(0, reach), "bottom"),
  ("even kernel same, columns", lambda reach: _even_kernel_same(1, reach), "right"),
]


@pytest.mark.parametrize("build,side", [c[1:] for c in BOUNDARY], ids=[c[0] for c in BOUNDARY])
def test_padding_one_side_folds_where_the_formula_is_zero_beyond_it(rng, build, side):
  """Exactly at the boundary: reach 2 folds equal to the block; reach 1 is refused."""
  x = rng.standard_normal((2, 9, 10, 4))
  inside = randomize(build(2), rng)
  want = inside(x).numpy()
  assert_close(FoldedBlock(inside, dtype=F64)(x), want, EXACT)
  assert FoldedBlock(inside, dtype=F64, exact=False).fold_report.differing_pixels == 0

  outside = randomize(build(1), rng)
  for make in (fold, FoldedBlock):
    with pytest.raises(ValueError, match="at the border the block is not one convolution"):
      make(outside, dtype=F64)
  # exact=False: the fold differs from the block in exactly the padded row or column.
  loose = FoldedBlock(outside, dtype=F64, exact=False)
  want = outside(x).numpy()
  got = loose(x).numpy()
  differs = (np.abs(got - want) > EXACT * np.abs(want).max()).any(axis=(0, 3))
  expected = np.zeros(differs.shape, bool)
  expected[EDGES[side]] = True
  np.testing.assert_array_equal(differs, expected)
  assert loose.fold_report.differing_pixels == expected.sum()


def test_a_2x1_same_kernel_after_a_3x3_same_one_is_refused(rng):
  """Conv2D 3x3 'same', then Conv2D (2, 1) 'same', no bias: 'same' pads the second below
  only, where the first is not zero."""
  block = randomize(
    _one(
      _conv(3, 3, padding="same", use_bias=False),
      _conv(2, (2, 1), padding="same", use_bias=False, name="even"),
    ),
    rng,
  )
  with pytest.raises(ValueError, match="Conv2D layer 'even' pads its input"):
    fold(block, dtype=F64)
  with pytest.warns(FoldWarning, match="10 of 90 output pixels differ"):
    folded = fold(block, dtype=F64, exact=False)
  x = rng.standard_normal((2, 9, 10, 4))
  got, want = folded(x).numpy(), block(x).numpy()
  assert_close(got[:, :-1], want[:, :-1], EXACT)
  assert (folded.fold_report.differing_pixels, _differing_pixels(got, want)) == (10, 10)


def test_not_exact_folds_and_counts_the_differing_pixels(rng):
  x = keras.Input((10, 9, 2), dtype=F64)
  h = L.Conv2D(3, 3, padding="same", name="a", dtype=F64)(x)  # bias, then 'same' again
  block = randomize(keras.Model(x, L.Conv2D(2, 3, padding="same", name="b", dtype=F64)(h)), rng)
  xs = rng.standard_normal((3, 10, 9, 2))
  with pytest.warns(FoldWarning, match="34 of 90 output pixels differ"):
    folded = fold(block, exact=False, dtype=F64)
  report = folded.fold_report
  assert (report.differing_pixels, report.total_pixels) == (34, 90)  # the border ring
  assert "Conv2D layer 'b' pads its input" in report.reasons[0]
  got, want = folded(xs).numpy(), block(xs).numpy()
  assert _differing_pixels(got, want) == 34
  assert_close(got[:, 1:-1, 1:-1], want[:, 1:-1, 1:-1], EXACT)  # the inside is exact
  with pytest.raises(ValueError, match="pass input_size"):
    fold(
      _chain(L.Conv2D(3, 3, padding="same"), L.Conv2D(3, 3, padding="same"), shape=(None, None, 3)),
      exact=False,
    )


# ---------------------------------------------------------------------------------------
# reparameterize
# ---------------------------------------------------------------------------------------


def replknet_stage(channels=4, size=40):
  """1x1 conv + BN + ReLU, then 31x31 depthwise + BN beside 5x5 depthwise + BN, summed,
  ReLU, 1x1 conv + BN, plus the shortcut."""
  x = keras.Input((size, size, channels), dtype=F64)

  def conv_bn(layer, y):
    return L.BatchNormalization(dtype=F64)(layer(y))

  h = L.ReLU(dtype=F64)(conv_bn(L.Conv2D(channels, 1, use_bias=False, dtype=F64), x))
  large = conv_bn(L.DepthwiseConv2D(31, padding="same", use_bias=False, dtype=F64), h)
  small = conv_bn(L.DepthwiseConv2D(5, padding="same", use_bias=False, dtype=F64), h)
  h = L.ReLU(dtype=F64)(L.Add(dtype=F64)([large, small]))
  h = conv_bn(L.Conv2D(channels, 1, use_bias=False, dtype=F64), h)
  return keras.Model(x, L.Add(dtype=F64)([x, h]))


def repvgg_stage(channels=4, size=12):
  """Two RepVGG blocks: 3x3 + BN, 1x1 + BN (and identity BN in the second), summed, ReLU."""
  x = keras.Input((size, size, 3), dtype=F64)
  y = x
  for identity in (False, True):
    branches = [
      L.BatchNormalization(dtype=F64)(
        L.Conv2D(channels, k, padding="same", use_bias=False, dtype=F64)(y)
      )
      for k in (3, 1)
    ]
    if identity:
      branches.append(L.BatchNormalization(dtype=F64)(y))
    y = L.ReLU(dtype=F64)(L.Add(dtype=F64)(branches))
  return keras.Model(x, y)


@pytest.mark.parametrize(
  "build,kinds",
  [
    (replknet_stage, ["LargeConv2D", "ReLU", "LargeDepthwiseConv2D", "ReLU", "LargeConv2D", "Add"]),
    (repvgg_stage, ["LargeConv2D", "ReLU", "LargeConv2D", "ReLU"]),
  ],
)
def test_reparameterize_merges_branches_and_batch_norms(rng, build, kinds):
  model = randomize(build(), rng)
  rep = reparameterize(model)
  assert [type(layer).__name__ for layer in rep.layers[1:]] == kinds
  x = rng.standard_normal((2,) + tuple(model.inputs[0].shape[1:]))
  assert_close(rep(x), model(x), EXACT)
  large = [layer for layer in rep.layers if "Large" in type(layer).__name__]
  if build is replknet_stage:  # depthwise stays depthwise, at the larger kernel
    assert large[1].kernel.shape == (31, 31, 4, 1)
  assert rep.count_params() < model.count_params()


def test_reparameterize_folds_chains_piecewise_and_keeps_activations(rng):
  x = keras.Input((10, 10, 3), dtype=F64)
  h = L.BatchNormalization(dtype=F64)(L.Conv2D(4, 3, padding="same", dtype=F64)(x))
  h = L.BatchNormalization(dtype=F64)(L.Conv2D(4, 3, padding="same", dtype=F64)(h))
  y = L.Conv2D(2, 1, activation="relu", dtype=F64)(h)  # 'same' after 'same': two folds
  y = y * y - 2.0 * y  # not linear: the cone behind the last conv + BN is cut after it
  y = L.BatchNormalization(dtype=F64)(L.Conv2D(2, 3, dtype=F64)(y))
  model = randomize(keras.Model(x, y), rng)
  rep = reparameterize(model)
  assert [type(layer).__name__ for layer in rep.layers[1:]] == ["LargeConv2D"] * 3
  assert rep.layers[2].get_config()["activation"] == "relu"
  xs = rng.standard_normal((2, 10, 10, 3))
  assert_close(rep(xs), model(xs), EXACT)


def test_reparameterize_deploys_a_model_trained_with_folded_blocks(rng):
  x = keras.Input((16, 16, 3), dtype=F64)
  h = FoldedBlock(randomize(founding_block(7, size=16, dtype=F64), rng), dtype=F64)(x)
  model = keras.Model(x, L.GlobalAveragePooling2D(dtype=F64)(L.ReLU(dtype=F64)(h)))
  rep = reparameterize(model)
  assert [type(layer).__name__ for layer in rep.layers[1:]] == [
    "LargeConv2D",
    "ReLU",
    "GlobalAveragePooling2D",
  ]
  xs = rng.standard_normal((2, 16, 16, 3))
  assert_close(rep(xs), model(xs), EXACT)


def test_folded_block_training_keeps_no_activations():
  # TensorFlow's allocator peak over a gradient step (BFC, so TF counts it): the block
  # keeps its activations (and TF's kernels their temporaries); FoldedBlock only the input,
  # the output, their gradients and kernel-sized tensors. Measured: 67-83 MiB vs 3.2 MiB.
  subproc.run(
    """
      import numpy as np, tensorflow as tf, keras
      import tf_largeconv
      from tf_largeconv.keras import FoldedBlock
      L = keras.layers
      x = keras.Input((96, 96, 8))
      p = L.Conv2D(8, 1, use_bias=False)(x)
      d = L.DepthwiseConv2D(5, padding="same", use_bias=False)(p) - p
      low = L.Conv2D(8, 5, padding="same", use_bias=False)(p)
      block = keras.Model(x, L.Concatenate()([d, low]))
      xs = tf.constant(np.random.default_rng(0).random((4, 96, 96, 8), dtype=np.float32))

      def peak(model):
        @tf.function
        def step():
          with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(xs) ** 2)
          return tape.gradient(loss, model.trainable_variables)
        step()
        tf.config.experimental.reset_memory_stats("CPU:0")
        base = tf.config.experimental.get_memory_info("CPU:0")["current"]
        step()
        return tf.config.experimental.get_memory_info("CPU:0")["peak"] - base

      unfolded = peak(block)
      folded = peak(FoldedBlock(block, workspace_limit=1 << 20))
      input_bytes = xs.numpy().nbytes
      assert folded < unfolded / 2, (folded, unfolded)
      assert folded < 4 * input_bytes, (folded, input_bytes)  # the output is 2 inputs
      """,
    timeout=300,
    env=subproc.child_env(TF_CPU_ALLOCATOR_USE_BFC="true"),
  )


def test_folded_conv_is_the_blocks_convolution(rng):
  """folded_conv(): TensorFlow's own convolution with its kernel, strides, explicit padding
  and bias is the block (float64), and follows the weights as they change."""
  x_in = keras.Input((None, None, 3), dtype=F64)
  h = L.Conv2D(4, 3, padding="same", dtype=F64)(x_in)
  h = L.Conv2D(5, 5, strides=2, padding="valid", dtype=F64)(L.BatchNormalization(dtype=F64)(h))
  block = randomize(keras.Model(x_in, h), rng)
  layer = FoldedBlock(block, input_size=(15, 14), dtype=F64)
  x = tf.constant(rng.standard_normal((2, 15, 14, 3)))
  for _ in range(2):
    conv = layer.folded_conv()
    assert conv.kernel.dtype == tf.float64 and tuple(conv.kernel.shape) == (7, 7, 3, 5)
    # Rows: 6 outputs read (6 - 1) * 2 + 7 = 17 = 1 + 15 + 1; columns: 5 read 15 = 1 + 14.
    assert conv.strides == (2, 2) and tuple(map(tuple, conv.padding)) == ((1, 1), (1, 0))
    padding = [[0, 0], *map(list, conv.padding), [0, 0]]
    y = tf.nn.conv2d(x, conv.kernel, [1, *conv.strides, 1], padding) + conv.bias
    want = block(x).numpy()
    assert_close(y, want, EXACT)
    assert_close(layer.convolve(x), want, EXACT)
    block.layers[1].kernel.assign(block.layers[1].kernel * 2.0)  # the next turn's weights
  assert layer.folded_conv(tf.float32).kernel.dtype == tf.float32


# ---------------------------------------------------------------------------------------
# Serialisation, tf_keras
# ---------------------------------------------------------------------------------------


def _folded_model(rng):
  block = randomize(founding_block(7, size=16), rng)
  return keras.Sequential([keras.Input((16, 16, 3)), FoldedBlock(block, algorithm="fft")])


def test_folded_block_config_and_keras_file_round_trip(rng, tmp_path):
  model = _folded_model(rng)
  layer = model.layers[0]
  config = layer.get_config()
  assert config["algorithm"] == "fft" and config["exact"] is True
  clone = FoldedBlock.from_config(config)
  assert clone.get_config()["block"] == config["block"]
  serialized = keras.saving.serialize_keras_object(layer)
  assert serialized["registered_name"] == "tf_largeconv>FoldedBlock"
  x = rng.standard_normal((2, 16, 16, 3)).astype(np.float32)
  model.save(tmp_path / "m.keras")
  loaded = keras.saving.load_model(tmp_path / "m.keras")
  for a, b in zip(loaded.get_weights(), model.get_weights()):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(loaded(x).numpy(), model(x).numpy())
  np.save(tmp_path / "x.npy", x)
  np.save(tmp_path / "y.npy", model(x).numpy())
  model.export(str(tmp_path / "sm"), verbose=False)
  # A fresh process that imports only tf_largeconv loads both and computes the same.
  subproc.run(
    """
      import sys
      import numpy as np, keras, tensorflow as tf
      import tf_largeconv  # registers the ops and layers
      out = sys.argv[1]
      x, y = np.load(out + "/x.npy"), np.load(out + "/y.npy")
      m = keras.saving.load_model(out + "/m.keras")
      assert type(m.layers[0]).__name__ == "FoldedBlock", m.layers
      np.testing.assert_array_equal(m(x).numpy(), y)
      served = tf.saved_model.load(out + "/sm")  # kept: its variables die with it
      np.testing.assert_array_equal(served.serve(x).numpy(), y)
      """,
    tmp_path,
    timeout=300,
  )


def test_tf_keras_fold_reparameterize_and_folded_block(tmp_path):
  subproc.run(
    """
      import sys
      import numpy as np, tensorflow as tf, tf_keras
      import tf_largeconv
      from tf_largeconv.tf_keras import (FoldedBlock, LargeConv2D, LargeDepthwiseConv2D,
                                         fold, reparameterize)
      L = tf_keras.layers
      rng = np.random.default_rng(0)

      def randomized(model):
        model.set_weights([rng.standard_normal(w.shape) for w in model.get_weights()])
        return model

      x = tf_keras.Input((20, 20, 3))
      p = L.Conv2D(3, 1, use_bias=False)(x)
      d = L.DepthwiseConv2D(7, padding="same", use_bias=False)(p) - p
      low = L.Conv2D(3, 7, padding="same", use_bias=False)(p)
      block = randomized(tf_keras.Model(x, L.Concatenate()([d, low])))
      xs = tf.constant(rng.standard_normal((2, 20, 20, 3)), tf.float32)
      want = block(xs).numpy()
      tol = 1e-4 * np.abs(want).max()
      folded = fold(block)
      assert type(folded) is LargeConv2D, type(folded)
      np.testing.assert_allclose(folded(xs).numpy(), want, atol=tol, rtol=0)
      rep = reparameterize(block)
      assert [type(l) for l in rep.layers[1:]] == [LargeConv2D], rep.layers
      np.testing.assert_allclose(rep(xs).numpy(), want, atol=tol, rtol=0)

      y = tf_keras.Input((12, 12, 2))
      dw = L.BatchNormalization()(L.DepthwiseConv2D(5, padding="same")(y))
      dw_block = randomized(tf_keras.Model(y, dw))
      assert type(fold(dw_block)) is LargeDepthwiseConv2D

      layer = FoldedBlock(block)
      assert len(layer.trainable_weights) == 3
      dy = tf.constant(rng.standard_normal((2, 20, 20, 6)), tf.float32)
      variables = block.trainable_variables
      grads = []
      for fn in (block, layer):
        with tf.GradientTape() as tape:
          tape.watch(xs)
          out = fn(xs)
        grads.append(tape.gradient(out, [xs] + variables, output_gradients=dy))
      for a, b in zip(*grads):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=0,
                                   atol=1e-4 * np.abs(a.numpy()).max())
      model = tf_keras.Sequential([tf_keras.Input((20, 20, 3)), layer])
      model.save(sys.argv[1] + "/m.keras")
      loaded = tf_keras.models.load_model(sys.argv[1] + "/m.keras")
      assert type(loaded.layers[0]) is FoldedBlock
      np.testing.assert_array_equal(loaded(xs).numpy(), model(xs).numpy())
      """,
    tmp_path,
    timeout=300,
    env=subproc.child_env(TF_USE_LEGACY_KERAS=1),
  )
