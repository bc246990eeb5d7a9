"""Which handler of `_layers` a Keras layer takes, its activation, and the error for a layer
fold cannot hold."""

from tf_largeconv.fold import _graph
from tf_largeconv.fold import _layers
from tf_largeconv.fold import _report

_NONLINEAR = {
  "ReLU",
  "LeakyReLU",
  "PReLU",
  "ELU",
  "Softmax",
  "ThresholdedReLU",
  "MaxPooling2D",
  "MaxPool2D",
  "GlobalMaxPooling2D",
  "Maximum",
  "Minimum",
  "Dropout",
  "SpatialDropout2D",
  "GaussianNoise",
  "GaussianDropout",
  "AlphaDropout",
  "LayerNormalization",
  "GroupNormalization",
  "UnitNormalization",
}
_NOT_LINEAR_WHY = {
  "Dropout": "random in training",
  "SpatialDropout2D": "random in training",
  "GaussianNoise": "random in training",
  "GaussianDropout": "random in training",
  "AlphaDropout": "random in training",
}
# Linear, but not folded; some subclass a supported layer in tf_keras (Conv2DTranspose is
# a Conv2D there), so they are named before the class hierarchy is searched.
_UNSUPPORTED = {
  "Conv2DTranspose",
  "Conv1D",
  "Conv3D",
  "Conv1DTranspose",
  "Conv3DTranspose",
  "DepthwiseConv1D",
  "SeparableConv1D",
  "Dense",
  "EinsumDense",
  "Reshape",
  "Flatten",
  "Permute",
  "AveragePooling2D",
  "AvgPool2D",
  "GlobalAveragePooling2D",
  "UpSampling2D",
  "Lambda",
}
# tf_keras records `a - b`, `2 * a` etc. as TFOpLambda layers named by their symbol.
_TF_OP_SYMBOLS = {
  "math.add": "Add",
  "__operators__.add": "Add",
  "math.subtract": "Subtract",
  "math.multiply": "Multiply",
  "math.negative": "Negative",
  "math.truediv": "TrueDivide",
  "math.divide": "TrueDivide",
}


def kind(layer):
  """The handler name for a layer (its class or a base class), or None."""
  symbol = getattr(layer, "symbol", None)
  if type(layer).__name__ == "TFOpLambda":
    return _TF_OP_SYMBOLS.get(symbol)
  if (
    hasattr(layer, "_inbound_nodes")
    and hasattr(layer, "outputs")
    and hasattr(layer, "layers")
    and getattr(layer, "outputs", None)
  ):
    return "Model"
  for cls in type(layer).__mro__:
    if cls.__name__ in _NONLINEAR or cls.__name__ in _UNSUPPORTED:
      return None
    if cls.__name__ in _layers.HANDLERS:
      return cls.__name__
  return None


def activation(layer):
  """The layer's activation name if it is not linear, else None."""
  config = layer.get_config() if hasattr(layer, "get_config") else {}
  act = config.get("activation")
  if act in (None, "linear") or not isinstance(act, (str, dict)):
    return None
  if isinstance(act, dict):
    name = act.get("config", {}).get("name") or act.get("class_name")
    return None if name == "linear" else str(name)
  return act


def not_linear(layer):
  """The error (an Unfoldable) for a layer that cannot be folded."""
  name = type(layer).__name__
  desc = _graph.describe(layer)
  if name == "Activation":
    return _report.Unfoldable(f"{desc} ({activation(layer)}) is not linear")
  act = activation(layer)
  if act is not None and kind(layer) is not None:
    return _report.Unfoldable(f"{desc} has activation '{act}': not linear")
  if name in _NONLINEAR:
    why = _NOT_LINEAR_WHY.get(name, "")
    return _report.Unfoldable(f"{desc} is not linear" + (f" ({why})" if why else ""))
  if name == "TFOpLambda":
    return _report.Unfoldable(
      f"{desc} ({getattr(layer, 'symbol', '?')}) is not a linear operation fold supports"
    )
  return _report.Unfoldable(
    f"{desc} is not a linear layer fold supports (supported: "
    "Conv2D, DepthwiseConv2D, SeparableConv2D, the Large* layers, "
    "BatchNormalization, Add, Subtract, Average, Concatenate, "
    "ZeroPadding2D, Cropping2D, Identity, linear Activation, "
    "Rescaling, nested models)"
  )
