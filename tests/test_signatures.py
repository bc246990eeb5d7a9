"""The backprop functions have TensorFlow's signatures (tf.compat.v1.nn's, which TensorFlow 2
has instead of tf.nn ones): the same positional arguments in the same order, and the
keywords TensorFlow takes, with the package's two settings keyword-only after them."""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import tf_largeconv as lc

RNG = np.random.default_rng(3)
X = RNG.standard_normal((2, 9, 8, 3)).astype(np.float32)
W = RNG.standard_normal((3, 4, 3, 5)).astype(np.float32)
DY = RNG.standard_normal((2, 9, 8, 5)).astype(np.float32)
STRIDES, DILATIONS = [1, 1, 1, 1], [1, 2, 1, 1]


@pytest.mark.parametrize(
  "ours, theirs",
  [
    (lc.conv2d_backprop_input, tf.compat.v1.nn.conv2d_backprop_input),
    (lc.conv2d_backprop_filter, tf.compat.v1.nn.conv2d_backprop_filter),
  ],
)
def test_positional_parameters_are_tensorflows(ours, theirs):
  mine = list(inspect.signature(ours).parameters.values())
  tfs = list(inspect.signature(theirs).parameters.values())
  assert [p.name for p in mine[: len(tfs)]] == [p.name for p in tfs]
  assert [p.kind for p in mine[: len(tfs)]] == [p.kind for p in tfs]
  extra = mine[len(tfs) :]
  assert [(p.name, p.kind) for p in extra] == [
    ("algorithm", inspect.Parameter.KEYWORD_ONLY),
    ("workspace_limit", inspect.Parameter.KEYWORD_ONLY),
  ]


def test_a_positional_call_as_tensorflow_takes_it_gives_its_values():
  # use_cudnn_on_gpu sixth, data_format seventh, dilations eighth, name ninth (TF's CPU
  # kernels take no dilation: a dilated call is checked against the same call by keywords).
  args = (STRIDES, "SAME", False, "NHWC", [1, 1, 1, 1], "g")
  want = tf.compat.v1.nn.conv2d_backprop_input(X.shape, W, DY, *args)
  got = lc.conv2d_backprop_input(X.shape, W, DY, *args)
  np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)
  want = tf.compat.v1.nn.conv2d_backprop_filter(X, W.shape, DY, *args)
  got = lc.conv2d_backprop_filter(X, W.shape, DY, *args)
  np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)
  dilated = (STRIDES, "SAME", True, "NHWC", DILATIONS)
  keywords = dict(strides=STRIDES, padding="SAME", dilations=DILATIONS)
  for ours, a, b in (
    (lc.conv2d_backprop_input, X.shape, W),
    (lc.conv2d_backprop_filter, X, W.shape),
  ):
    np.testing.assert_array_equal(ours(a, b, DY, *dilated), ours(a, b, DY, **keywords))
    assert not np.array_equal(ours(a, b, DY, *dilated), ours(a, b, DY, *args[:5]))


@pytest.mark.parametrize("keyword", ["filter", "filters"])
def test_the_filter_by_either_keyword(keyword):
  kwargs = {keyword: W, "out_backprop": DY, "strides": STRIDES, "padding": "SAME"}
  want = tf.compat.v1.nn.conv2d_backprop_input(X.shape, **kwargs)
  got = lc.conv2d_backprop_input(X.shape, **kwargs, algorithm="direct")
  np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)


def test_bad_calls_name_the_argument():
  with pytest.raises(ValueError, match="filter= or filters=, not both"):
    lc.conv2d_backprop_input(X.shape, W, DY, STRIDES, "SAME", filters=W)
  with pytest.raises(ValueError, match="filter is required"):
    lc.conv2d_backprop_input(X.shape, out_backprop=DY, strides=STRIDES, padding="SAME")
  with pytest.raises(ValueError, match="padding is required"):
    lc.conv2d_backprop_input(X.shape, W, DY, STRIDES)
  with pytest.raises(
    ValueError, match="use_cudnn_on_gpu must be a bool, got use_cudnn_on_gpu='NHWC'"
  ):
    lc.conv2d_backprop_filter(X, W.shape, DY, STRIDES, "SAME", "NHWC")
  with pytest.raises(TypeError, match="positional"):
    lc.conv2d_backprop_input(X.shape, W, DY, STRIDES, "SAME", True, "NHWC", None, None, None, "fft")
