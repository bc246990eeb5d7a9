"""Folds a block of linear layers (Keras 3 or tf_keras) into one convolution.

Every tensor of a block is tracked as an affine function of the block input x:

  t[i, j, c] = sum_{u, v, ci} K[u, v, ci, c] * x[i*s + u - oh, j*s + v - ow, ci] + b[c]

(x zero outside the image), with a kernel K in grouped-convolution storage (the filter
`tf_largeconv.conv2d` takes: [kh, kw, C0 / groups, C]), offsets (oh, ow), a bias b, a
stride s and the tensor's size. Each layer maps that description to its output's, with
TensorFlow ops only: in float64 on constants for `fold` and `reparameterize`, and on the
layers' own variables (differentiably) for `FoldedBlock`, so the algebra exists once.

At the border the formula holds only while no layer reads a tensor beyond its edge where
the formula is not zero: padding (SAME, ZeroPadding2D) after a bias, after a spatial
kernel or after a crop is refused (ValueError naming the layer and the reason), unless
exact=False, which folds anyway and counts the output pixels that differ.

The flavour modules (`keras.py`, `tf_keras.py`) pass a `Flavour` with their Input, Model
and Large layer classes; everything else here reads the layers through attributes both
Kerases share (`_keras_history`, `_inbound_nodes`, `get_config`).

Modules, each importing only those above it:
  _report          FoldReport and FoldWarning (exact=False), the refusal error
  _graph           a built model's layer graph; blocks (one input tensor to one output)
  _kernels         the kernel algebra: composition, dilation, regrouping, bias through
  _geometry        padding and output sizes; the one convolution that computes a block
  _affine          a tensor's affine description and its border-exactness check
  _layers          one handler per supported Keras layer class
  _layer_kinds     which handler a layer takes, or why it cannot be folded
  _composer        walks a block from its input's description to its output's
  _large_layer     fold(): a block as one Large layer
  _reparameterize  reparameterize(): a model with its linear regions folded
  _folded_block    FoldedBlock: the block's own weights, folded at every call
"""

from tf_largeconv.fold import _kernels
from tf_largeconv.fold._folded_block import FoldedBlockBase
from tf_largeconv.fold._large_layer import Flavour
from tf_largeconv.fold._large_layer import fold
from tf_largeconv.fold._reparameterize import reparameterize
from tf_largeconv.fold._report import FoldReport
from tf_largeconv.fold._report import FoldWarning

__all__ = ["Flavour", "FoldReport", "FoldWarning", "FoldedBlockBase", "fold", "reparameterize"]

# The kernel composition on its own, for the tests that check it against a dense reference.
_compose_kernels = _kernels.compose_kernels
