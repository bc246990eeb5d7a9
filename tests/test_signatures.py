"""The backprop functions have TensorFlow's signatures (tf.compat.v1.nn's, which TensorFlow 2
has instead of tf.nn ones): the same positional arguments in the same order, and the
keywords TensorFlow takes, with the package's two settings keyword-only after them. Every
public function, layer and fold names each of the package's options, keyword-only, in its
signature, with TensorFlow's or Keras's positional parameters unchanged."""

import inspect
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import tf_largeconv as lc
from tf_largeconv._options import OPTIONS

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
    (o.name, inspect.Parameter.KEYWORD_ONLY) for o in OPTIONS
  ]
  assert [o.name for o in OPTIONS][:2] == ["algorithm", "workspace_limit"]


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


# Every public function, layer and fold that takes the package's options, and its
# TensorFlow (or Keras) counterpart, whose positional parameters it has unchanged.
def _takers():
  import tf_largeconv.dask as lcd
  import tf_largeconv.keras as lck
  import tf_largeconv.tf_keras as lctk

  return [
    (lc.conv2d, tf.nn.conv2d),
    (lc.depthwise_conv2d, tf.nn.depthwise_conv2d),
    (lc.conv1d, tf.nn.conv1d),
    (lc.conv3d, tf.nn.conv3d),
    (lc.conv2d_transpose, tf.nn.conv2d_transpose),
    (lc.conv2d_backprop_input, tf.compat.v1.nn.conv2d_backprop_input),
    (lc.conv2d_backprop_filter, tf.compat.v1.nn.conv2d_backprop_filter),
    (lc.plan, None),
    (lc.plan_conv1d, None),
    (lc.plan_conv3d, None),
    (lc.plan_transpose, None),
    (lcd.conv2d, None),
    (lcd.depthwise_conv2d, None),
    (lcd.conv2d_backprop_filter, None),
    (lcd.conv2d_to_zarr, None),
    (lcd.task_memory, None),
    (lck.convert, None),
    (lck.fold, None),
    (lck.reparameterize, None),
    (lctk.fold, None),
    (lctk.reparameterize, None),
    (lck.FoldedBlock, None),
    (lctk.FoldedBlock, None),
    (lck.LargeConv1D, keras.layers.Conv1D),
    (lck.LargeConv2D, keras.layers.Conv2D),
    (lck.LargeDepthwiseConv2D, keras.layers.DepthwiseConv2D),
    (lck.LargeConv2DTranspose, keras.layers.Conv2DTranspose),
    (lck.LargeConv3D, keras.layers.Conv3D),
    (lctk.LargeConv1D, tf_keras.layers.Conv1D),
    (lctk.LargeConv2D, tf_keras.layers.Conv2D),
    (lctk.LargeDepthwiseConv2D, tf_keras.layers.DepthwiseConv2D),
    (lctk.LargeConv2DTranspose, tf_keras.layers.Conv2DTranspose),
    (lctk.LargeConv3D, tf_keras.layers.Conv3D),
  ]


def test_every_taker_names_each_option_keyword_only_and_keeps_the_positional_parameters():
  positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
  for ours, theirs in _takers():
    params = inspect.signature(ours).parameters
    for option in OPTIONS:
      p = params.get(option.name)
      assert p is not None, (ours, option.name)
      assert (p.kind, p.default) == (inspect.Parameter.KEYWORD_ONLY, option.default), ours
    assert "options" not in params, ours
    if theirs is not None:
      mine = [n for n, p in params.items() if p.kind in positional]
      tfs = [n for n, p in inspect.signature(theirs).parameters.items() if p.kind in positional]
      assert mine == tfs, ours
    doc = inspect.getdoc(ours)
    if "\nArgs:\n" in doc:  # an Args section: each option described there
      args = doc.split("\nArgs:\n")[1].split("\n\n")[0]
      for option in OPTIONS:
        assert re.search(rf"^  [\w, ]*\b{option.name}\b[\w, ]*:", args, re.M), (ours, option)


def test_an_unknown_keyword_and_a_bad_option_are_refused_by_name():
  import tf_largeconv.keras as lck

  with pytest.raises(TypeError, match="unexpected keyword argument 'algorithim'"):
    lc.conv2d(X, W, 1, "SAME", algorithim="fft")
  with pytest.raises(TypeError, match="unexpected keyword argument 'algorithim'"):
    lc.plan(X.shape, W.shape, 1, "SAME", algorithim="fft")
  with pytest.raises((TypeError, ValueError), match="algorithim"):  # Keras's own check
    lck.LargeConv2D(4, 3, algorithim="fft")
  with pytest.raises(ValueError, match="workspace_limit"):
    lc.conv1d(X[:, 0], W[0], 1, "SAME", workspace_limit=-5)
  with pytest.raises(ValueError, match="algorithm"):
    lck.convert(keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Dense(2)]), algorithm="x")
  with pytest.raises(TypeError, match="positional"):
    lc.conv2d(X, W, 1, "SAME", "NHWC", None, None, "fft")
