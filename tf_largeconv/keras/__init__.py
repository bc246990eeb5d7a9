"""Keras 3 layers over the LargeConv ops, and the converters for existing models.

- `_layers`: `LargeConv1D`, `LargeConv2D`, `LargeDepthwiseConv2D`, `LargeConv2DTranspose`,
  `LargeConv3D` (each its Keras layer argument for argument, plus the package's
  options, keyword-only: `algorithm`, `workspace_limit`) and `FoldedBlock`.
- `_convert`: `convert`, `fold`, `reparameterize`, `export_portable`.
- `_settings`: one base per layer family, shared with the tf_keras layers
  (`tf_largeconv.tf_keras`); `export`: the portable SavedModel export of either flavour.

TensorFlow backend only; models using the layers load (.keras or SavedModel) after
`import tf_largeconv`.
"""

from tf_largeconv.keras._convert import FoldReport
from tf_largeconv.keras._convert import FoldWarning
from tf_largeconv.keras._convert import convert
from tf_largeconv.keras._convert import export_portable
from tf_largeconv.keras._convert import fold
from tf_largeconv.keras._convert import reparameterize
from tf_largeconv.keras._layers import FoldedBlock
from tf_largeconv.keras._layers import LargeConv1D
from tf_largeconv.keras._layers import LargeConv2D
from tf_largeconv.keras._layers import LargeConv2DTranspose
from tf_largeconv.keras._layers import LargeConv3D
from tf_largeconv.keras._layers import LargeDepthwiseConv2D

__all__ = [
  "FoldReport",
  "FoldWarning",
  "FoldedBlock",
  "LargeConv1D",
  "LargeConv2D",
  "LargeConv2DTranspose",
  "LargeConv3D",
  "LargeDepthwiseConv2D",
  "convert",
  "export_portable",
  "fold",
  "reparameterize",
]
