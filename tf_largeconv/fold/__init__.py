"""Folds a block of linear layers (Keras 3 or tf_keras) into one convolution; the algebra
is in `_composer`."""

from tf_largeconv.fold import _composer
from tf_largeconv.fold._composer import Flavour
from tf_largeconv.fold._composer import FoldedBlockBase
from tf_largeconv.fold._composer import FoldReport
from tf_largeconv.fold._composer import FoldWarning
from tf_largeconv.fold._composer import fold
from tf_largeconv.fold._composer import reparameterize

__all__ = ["Flavour", "FoldReport", "FoldWarning", "FoldedBlockBase", "fold",
           "reparameterize"]

# The kernel composition on its own, for the tests that check it against a dense reference.
_compose_kernels = _composer._compose_kernels
