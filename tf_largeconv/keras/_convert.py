"""Converting Keras 3 models: large-kernel layers onto the ops (`convert`), linear blocks
folded into one convolution (`fold`, `reparameterize`), and an export that needs no
tf_largeconv to load (`export_portable`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tf_largeconv import fold as _fold
from tf_largeconv._options import public_options
from tf_largeconv._options import takes_options
from tf_largeconv.keras import export as _export
from tf_largeconv.keras._layers import LargeConv1D
from tf_largeconv.keras._layers import LargeConv2D
from tf_largeconv.keras._layers import LargeConv2DTranspose
from tf_largeconv.keras._layers import LargeConv3D
from tf_largeconv.keras._layers import LargeDepthwiseConv2D


@takes_options
def convert(model: keras.Model, min_kernel_size: int = 15, **options: Any) -> keras.Model:
  """Clones a Keras model with its large-kernel convolutions on tf_largeconv.

  Every `keras.layers.Conv2D` / `DepthwiseConv2D` / `Conv1D` / `Conv2DTranspose` /
  `Conv3D` whose kernel has a side of at least `min_kernel_size` becomes a `LargeConv2D` /
  `LargeDepthwiseConv2D` / `LargeConv1D` / `LargeConv2DTranspose` / `LargeConv3D` with the
  same configuration; all weights are copied.

  Args:
    model: a Sequential or functional Keras model.
    min_kernel_size: the smallest kernel side to replace.
    algorithm, workspace_limit: for the new layers.

  Returns:
    The converted clone (the input model is left as it was).
  """
  public_options(options)  # bad options are refused even where no layer is replaced
  large_layers = {
    keras.layers.Conv2D: LargeConv2D,
    keras.layers.DepthwiseConv2D: LargeDepthwiseConv2D,
    keras.layers.Conv1D: LargeConv1D,
    keras.layers.Conv2DTranspose: LargeConv2DTranspose,
    keras.layers.Conv3D: LargeConv3D,
  }

  def clone(layer: keras.layers.Layer) -> keras.layers.Layer:
    config = layer.get_config()
    large = max(getattr(layer, "kernel_size", (0,))) >= min_kernel_size
    if type(layer) in large_layers and large:
      return large_layers[type(layer)](**config, **options)
    return layer.__class__.from_config(config)

  converted = keras.models.clone_model(model, clone_function=clone)
  converted.set_weights(model.get_weights())
  return converted


def export_portable(
  model: keras.Model,
  path: str | os.PathLike[str],
  input_signature: Sequence[tf.TensorSpec] | None = None,
) -> str:
  """Saves `model` for inference as a SavedModel that needs no tf_largeconv to load.

  The model's forward pass (`training=False`) is traced with every tf_largeconv op on
  `algorithm="portable"`: stock TensorFlow ops only, so the SavedModel holds no LargeConv
  op and loads in any TensorFlow (TensorFlow Serving, a process that never imports
  tf_largeconv). The model is not changed: the switch is a context
  (`tf_largeconv.ops.portable_only`, thread-local) around the trace and the save, restored
  on exit, so the Large layers keep their own `algorithm` for everything else. Any layer
  that calls tf_largeconv's public ops is covered (LargeConv2D, LargeDepthwiseConv2D,
  FoldedBlock, your own).

  Load it with `loaded = tf.saved_model.load(path)` (keep `loaded` referenced while calling
  it: TensorFlow deletes the variables of a dropped object); then `loaded.serve(x)` (one
  input; `loaded.serve(x1, x2, ...)` for several, in the model's input order) returns what
  the model returns, and `loaded.signatures["serving_default"](input_0=x)` returns a dict
  (`{"output_0": ...}`), the entry point TensorFlow Serving uses. The batch dimension is
  free (None); the other dimensions and the dtypes are the model's inputs'. The portable
  path needs static image sizes, so every input's height and width must be known. TFLite
  cannot run the export (see the docs on exporting for serving).

  Args:
    model: a built Keras model with defined inputs (functional, or Sequential starting
      with `keras.Input`).
    path: the SavedModel directory to write (str or os.PathLike).
    input_signature: for a model without defined inputs (subclassed), a list of
      `tf.TensorSpec`, one per input; the batch dimension may be None.

  Returns:
    `path` as a str.

  Raises:
    ValueError: a model without defined inputs and no input_signature (naming what to
      do), a malformed `path` or `input_signature`, inputs of unknown height or width, or a
      layer that calls the op library directly so that a LargeConv op would be saved.
  """
  return _export.export(model, path, input_signature=input_signature)


# Folding linear blocks (the algebra is in tf_largeconv.fold, shared with tf_keras)


@takes_options
def fold(
  block: keras.Model,
  exact: bool = True,
  input_size: Sequence[int] | None = None,
  dtype: Any = None,
  *,
  name: str | None = None,
  **options: Any,
) -> LargeConv2D | LargeDepthwiseConv2D:
  """Folds a block of linear layers into one `LargeConv2D` or `LargeDepthwiseConv2D`.

  The block is a built Keras model (functional, or Sequential with an Input) with one
  input and one output, made of: Conv2D (any kernel, dilation, groups, bias),
  DepthwiseConv2D, SeparableConv2D, the Large* layers, BatchNormalization (its moving
  statistics), Add, Subtract, Average, Concatenate on channels, ZeroPadding2D, Cropping2D,
  Identity, linear Activation, Rescaling, `a + b`, `a - b`, `-a`, `c * a`, `a / c` with
  constants c, nested such models and (exact) FoldedBlock layers. A stride is allowed
  where no spatial layer follows.

  The returned layer's output equals the block's everywhere, borders included (within the
  op's float tolerance). It is depthwise when the fold is channel-diagonal
  (depth_multiplier = output / input channels), grouped when block-diagonal; the kernel
  carries zero rows or columns where that makes the padding 'same' or 'valid'.

  Args:
    block: the Keras model to fold (left unchanged).
    exact: with False, fold even where the block is not one convolution at the border,
      warn (`FoldWarning`) with the number of output pixels that differ, and set
      `layer.fold_report` (a `FoldReport`).
    input_size: (height, width) for a block whose input size is unknown: needed for
      strides and for exact=False.
    dtype: the new layer's dtype (policy); None for Keras's default.
    algorithm, workspace_limit: for the new layer (see `tf_largeconv.conv2d`).
    name: the new layer's name.

  Returns:
    A built `LargeConv2D` or `LargeDepthwiseConv2D` with the folded weights.

  Raises:
    ValueError: naming the layer and the reason, for a layer that is not linear or not
      supported; a padding (SAME, ZeroPadding2D) reading beyond the border of a tensor
      that is not zero there (after a bias, a spatial kernel or a crop) unless
      exact=False; a stride before a spatial kernel; a block that no 'same' or 'valid'
      convolution computes (e.g. one whose output is larger than its input).
  """
  return _fold.fold(block, _FLAVOUR, exact, input_size, dtype, name=name, **options)


@takes_options
def reparameterize(model: keras.Model, **options: Any) -> keras.Model:
  """A copy of `model` with every maximal foldable linear sub-graph as one Large layer.

  A sub-graph is foldable when it is the cone of linear layers (see `fold`) behind one
  tensor, reaching back to one input tensor, with none of its inner tensors used outside
  it, at least one convolution among at least two layers, and `fold` finds it exact: e.g.
  parallel branches of convolution + BatchNormalization summed (RepLKNet, RepVGG), or a
  residual `x + BN(conv(x))`. The layer ending it may carry an activation, which the
  Large layer keeps. Depthwise folds stay depthwise. Other layers are copied with their
  weights; outputs are equal (BatchNormalization folds with its moving statistics, as in
  inference). Nested models are copied as they are, or folded whole when linear; so is
  a FoldedBlock, which makes `reparameterize` the deployment step of a model trained with
  FoldedBlock layers.

  Args:
    model: a built Keras model (left unchanged).
    algorithm, workspace_limit: for the new Large layers.

  Returns:
    A functional `keras.Model`.
  """
  return _fold.reparameterize(model, _FLAVOUR, **options)


_FLAVOUR = _fold.Flavour(
  input=keras.Input, model=keras.Model, conv=LargeConv2D, depthwise=LargeDepthwiseConv2D
)
FoldReport = _fold.FoldReport
FoldWarning = _fold.FoldWarning
