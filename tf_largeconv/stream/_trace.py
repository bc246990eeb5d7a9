"""Whether a layer computes each output pixel from the same pixel of its inputs, decided from
what it computes: its call is traced by `tf.function` on inputs whose spatial sizes are
unknown, and every operation of the graph that reads the inputs (directly or through other
operations) must be

- element by element (`Mul`, `AddV2`, `Tanh`, `Cast`, `Select`, ...), its other operands
  per-channel constants or variables (every axis but the last of size 1);
- over the channel axis only: a reduction over the last axis keeping it, a softmax, a
  product with a matrix over the last axis;

and every tensor that depends on the inputs keeps the inputs' rank, its spatial sizes
unknown. Anything else (reading the input's shape, slicing, padding, rolling, resizing, a
reduction over a spatial axis, random numbers, control flow) is refused with the operation
named: the analysis proves the per-pixel layers it accepts, never more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

ELEMENTWISE = frozenset(
  "Identity IdentityN StopGradient Snapshot Cast Add AddV2 Sub Mul MulNoNan RealDiv Div "
  "DivNoNan FloorDiv FloorMod Mod Maximum Minimum Pow SquaredDifference Neg Abs Sign Square "
  "Sqrt Rsqrt Reciprocal Inv Exp Expm1 Log Log1p Sin Cos Tan Tanh Sinh Cosh Asinh Acosh Atanh "
  "Atan Asin Acos Sigmoid Erf Erfc Relu Relu6 Elu Selu Softplus Softsign LeakyRelu Floor Ceil "
  "Round Rint Select SelectV2 Greater GreaterEqual Less LessEqual Equal NotEqual LogicalAnd "
  "LogicalOr LogicalNot ClipByValue BiasAdd ZerosLike OnesLike IsNan IsInf IsFinite Xlogy "
  "Xdivy".split()
)
REDUCTIONS = frozenset("Mean Sum Max Min Prod All Any EuclideanNorm".split())
CHANNEL_OPS = frozenset(["Softmax", "LogSoftmax"])
MATMULS = frozenset(["BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"])


def _per_channel(t: tf.Tensor) -> bool:
  """A value that broadcasts along every axis but the channels'."""
  shape = t.shape
  if shape.rank is None:
    return False
  return shape.rank <= 1 or all(n == 1 for n in shape[:-1])


def _const_axes(t: tf.Tensor, rank: int) -> list[int] | None:
  if t.op.type != "Const":
    return None
  values = tf.make_ndarray(t.op.get_attr("value")).reshape(-1)
  return sorted({int(a) % rank for a in values})


def _check_op(op: Any, dep: set[str], rank: int) -> str | None:
  """Why the operation `op`, which reads the inputs, is not per pixel (None when it is)."""
  kind = op.type
  ins = list(op.inputs)
  others = [t for t in ins if t.name not in dep]
  if kind in ELEMENTWISE:
    if kind == "BiasAdd" and op.get_attr("data_format") != b"NHWC":
      return "it adds a bias along an axis other than the channels'"
    bad = [t for t in others if not _per_channel(t)]
    if bad:
      shape = tuple(bad[0].shape)
      return f"its operation {kind} combines the image with a value of shape {shape}"
    return None
  if kind in CHANNEL_OPS:
    return None
  if kind in REDUCTIONS:
    axes = _const_axes(ins[1], rank)
    if axes != [rank - 1] or not op.get_attr("keep_dims"):
      where = "axes unknown" if axes is None else f"axes {tuple(axes)}"
      return f"its operation {kind} reduces over {where}, not the channel axis alone"
    return None
  if kind in MATMULS:
    if ins[0].name in dep and ins[1].name not in dep and ins[1].shape.rank == 2:
      adjoint = op.get_attr("adj_x") or op.get_attr("adj_y")
      if not adjoint:
        return None
    return f"its operation {kind} is not a product over the channel axis"
  return f"it computes {kind}, which is not known to keep pixels apart"


def why_not_pointwise(call: Any, refs: Sequence[Any], rank: int) -> str | None:
  """None when `call` (the layer as the model calls it, on tensors shaped as `refs`)
  computes each output pixel from the same pixel of its inputs; otherwise why not."""
  full = rank + 2
  specs = [tf.TensorSpec((None,) * (full - 1) + (r.shape[-1],), tf.as_dtype(r.dtype)) for r in refs]
  try:
    concrete = tf.function(call).get_concrete_function(*specs)
  except Exception as e:  # noqa: BLE001 - any failure means the call is not understood
    return f"tracing its call on inputs of unknown spatial size failed ({type(e).__name__}: {e})"
  dep = {t.name for t in concrete.inputs[: len(specs)]}
  for op in concrete.graph.get_operations():
    kind = op.type
    if "Random" in kind or "Multinomial" in kind:
      return f"it draws random numbers ({kind})"
    if not any(t.name in dep for t in op.inputs):
      continue
    if kind in ("Shape", "ShapeN", "Size", "Rank"):
      return f"it reads its input's shape ({kind})"
    why = _check_op(op, dep, full)
    if why is not None:
      return why
    for t in op.outputs:
      shape = t.shape
      if shape.rank != full or any(n is not None for n in shape[1:-1]):
        return f"its operation {kind} gives a tensor of shape {tuple(shape)}, not an image"
      dep.add(t.name)
  outputs = [t for t in concrete.outputs if t.name in dep]
  if len(outputs) != 1 or len(concrete.outputs) != 1:
    return "its output is not one image computed from its inputs"
  return None
