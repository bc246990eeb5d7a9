"""What each TensorFlow op holds: which of its tensors its registered gradient function
keeps for the backward pass, whether its kernel may write its output over an input (TF's
element-wise kernels forward a dying input's buffer), and which ops are views.

The kept tensors follow the gradient functions TensorFlow registers (`tf.RegisterGradient`
in its math, nn, array and image gradient modules): e.g. Conv2D's gradient reads its input
and filter, Relu's its output, MaxPool's both, BiasAdd's and AddV2's only the incoming
gradient (and shapes). An op type missing here is "not priced": its output is still
counted, and the report lists it.
"""

from __future__ import annotations

IN = "inputs"
OUT = "outputs"

# op type: (indices of the inputs its gradient keeps, whether it keeps its outputs).
_KEEP_INPUTS_01 = ((0, 1), False)
_NOTHING = ((), False)
_OUTPUT = ((), True)
_INPUT0 = ((0,), False)

KEPT: dict[str, tuple[tuple[int, ...], bool]] = {
  # convolutions and products: input and filter (or both operands)
  "Conv2D": _KEEP_INPUTS_01,
  "Conv3D": _KEEP_INPUTS_01,
  "DepthwiseConv2dNative": _KEEP_INPUTS_01,
  "Conv2DBackpropInput": ((1, 2), False),
  "Conv3DBackpropInputV2": ((1, 2), False),
  "LargeConv>Conv2D": _KEEP_INPUTS_01,
  "LargeConv>Conv3D": _KEEP_INPUTS_01,
  "LargeConv>Conv2DBackpropInput": ((1, 2), False),
  "LargeConv>Conv2DRoute": ((1, 2), False),
  "MatMul": _KEEP_INPUTS_01,
  "BatchMatMulV2": _KEEP_INPUTS_01,
  "Einsum": _KEEP_INPUTS_01,
  # element-wise
  "Mul": _KEEP_INPUTS_01,
  "RealDiv": _KEEP_INPUTS_01,
  "DivNoNan": _KEEP_INPUTS_01,
  "Maximum": _KEEP_INPUTS_01,
  "Minimum": _KEEP_INPUTS_01,
  "SquaredDifference": _KEEP_INPUTS_01,
  "Pow": ((0, 1), True),
  "AddV2": _NOTHING,
  "Add": _NOTHING,
  "Sub": _NOTHING,
  "AddN": _NOTHING,
  "BiasAdd": _NOTHING,
  "Neg": _NOTHING,
  "Cast": _NOTHING,
  "Relu": _OUTPUT,
  "Relu6": _INPUT0,
  "Elu": _OUTPUT,
  "Selu": _OUTPUT,
  "Sigmoid": _OUTPUT,
  "Tanh": _OUTPUT,
  "Sqrt": _OUTPUT,
  "Rsqrt": _OUTPUT,
  "Exp": _OUTPUT,
  "Softmax": _OUTPUT,
  "LogSoftmax": _OUTPUT,
  "LeakyRelu": _INPUT0,
  "Softplus": _INPUT0,
  "Softsign": _INPUT0,
  "Square": _INPUT0,
  "Log": _INPUT0,
  "Log1p": _INPUT0,
  "Erf": _INPUT0,
  "Abs": _INPUT0,
  "Reciprocal": _OUTPUT,
  # pooling, normalisation, reductions
  "MaxPool": ((0,), True),
  "MaxPoolV2": ((0,), True),
  "MaxPool3D": ((0,), True),
  "AvgPool": _NOTHING,
  "AvgPool3D": _NOTHING,
  "FusedBatchNormV3": ((0, 1), True),
  "Mean": _NOTHING,
  "Sum": _NOTHING,
  "Max": ((0,), True),
  "Min": ((0,), True),
  # moving data
  "ConcatV2": _NOTHING,
  "Pad": _NOTHING,
  "PadV2": _NOTHING,
  "MirrorPad": _NOTHING,
  "Slice": _NOTHING,
  "StridedSlice": _NOTHING,
  "Transpose": _NOTHING,
  "Tile": _NOTHING,
  "Pack": _NOTHING,
  "Unpack": _NOTHING,
  "Split": _NOTHING,
  "SplitV": _NOTHING,
  "DepthToSpace": _NOTHING,
  "SpaceToDepth": _NOTHING,
  "SpaceToBatchND": _NOTHING,
  "BatchToSpaceND": _NOTHING,
  "ResizeNearestNeighbor": _NOTHING,
  "ResizeBilinear": _INPUT0,
  "ZerosLike": _NOTHING,
  "OnesLike": _NOTHING,
  "Fill": _NOTHING,
  "Range": _NOTHING,
  "Shape": _NOTHING,
  "ShapeN": _NOTHING,
  "Select": ((0,), False),
  "SelectV2": ((0,), False),
  "Greater": _NOTHING,
  "GreaterEqual": _NOTHING,
  "Less": _NOTHING,
  "LessEqual": _NOTHING,
  "Equal": _NOTHING,
  "RandomUniform": _NOTHING,
  "StatelessRandomUniformV2": _NOTHING,
  "StatelessRandomGetKeyCounter": _NOTHING,
}

# Views: the output is the input's buffer.
ALIASES = frozenset(
  ("Identity", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "IdentityN", "Snapshot")
)

# Ops that allocate nothing on the data path (the graph's inputs, the weights' reads).
FREE = frozenset(
  (
    "Placeholder",
    "Const",
    "ReadVariableOp",
    "NoOp",
    "AssignVariableOp",
    "AssignAddVariableOp",
    "AssignSubVariableOp",
    "VarHandleOp",
  )
)

# Ops whose output shares its first input's buffer when nothing else reads that input: a
# convolution's bias and activation, which Grappler's remapper fuses into the convolution
# (one output). Other element-wise ops run as oneDNN's kernels, which allocate a new output
# (measured: benchmarks.cpu.memory).
FORWARDS = frozenset(("BiasAdd", "Relu", "Relu6", "Elu", "Selu", "Sigmoid", "Tanh", "LeakyRelu"))

# Convolutions whose temporary memory is TensorFlow's kernel's (see _workspace.py).
TF_CONVS = frozenset(("Conv2D", "DepthwiseConv2dNative", "Conv2DBackpropInput", "Conv3D"))
LARGE_CONVS = frozenset(
  (
    "LargeConv>Conv2D",
    "LargeConv>Conv2DBackpropInput",
    "LargeConv>Conv2DRoute",
    "LargeConv>Conv3D",
  )
)


def priced(op_type: str) -> bool:
  return op_type in KEPT or op_type in ALIASES or op_type in FREE
