"""A built Keras model as TensorFlow ops: each layer traced once (`tf.function` over
`TensorSpec`s of its inputs' shapes), its ops listed with the tensors they read and write,
the layer's inputs bound to the tensors of the layers that produce them."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import tensorflow as tf

from tf_largeconv.memory import _optable
from tf_largeconv.memory import _workspace


@dataclasses.dataclass
class Tensor:
  id: int
  nbytes: int
  layer: str
  alias_of: int | None = None  # a view: the buffer is that tensor's
  needs_grad: bool = False
  itemsize: int = 4


@dataclasses.dataclass
class Op:
  type: str
  name: str
  layer: str
  inputs: list[int]  # tensor ids; -1 for a weight, a constant or anything not on the data path
  outputs: list[int]
  kept: list[int]  # the tensors its gradient keeps
  workspace: int = 0  # temporary bytes of its forward kernel
  grad_workspace: int = 0  # temporary bytes of its gradient's kernels
  weight_grad_bytes: int = 0
  priced: bool = True
  largeconv_workspace: int | None = None  # the LargeConv planner's bound, for TF's convs
  # A LargeConv op's kernels' workspaces, from the package's pool (`_workspace.Workspaces`):
  # the forward's, then its gradients'; none for an op that keeps no memory between calls
  # (its workspaces are then plain temporaries, `workspace` and `grad_workspace`).
  pooled: tuple[int, ...] = ()
  grad_pooled: tuple[int, ...] = ()


@dataclasses.dataclass
class Traced:
  ops: list[Op]
  tensors: dict[int, Tensor]
  inputs: list[int]
  outputs: list[int]
  layer_outputs: dict[str, list[int]]
  layers: list[Any]  # the traced layers, in order


def _nbytes(t: Any) -> int:
  shape = t.shape
  if shape.rank is None or any(d is None for d in shape):
    return 0
  if t.dtype == tf.resource or t.dtype == tf.variant or t.dtype == tf.string:
    return 0
  return math.prod(shape) * t.dtype.size


def _size(t: Any) -> int:
  return t.dtype.size if t.dtype not in (tf.resource, tf.variant, tf.string) else 0


def _nodes_in_order(model: Any) -> list[Any]:
  nodes = []
  for depth in sorted(model._nodes_by_depth, reverse=True):
    nodes.extend(model._nodes_by_depth[depth])
  return nodes


def _concrete(layer: Any, specs: list[Any], training: bool) -> Any:
  def call(*args: Any) -> Any:
    return layer(args[0] if len(args) == 1 else list(args), training=training)

  return tf.function(call).get_concrete_function(*specs)


class _Builder:
  def __init__(self) -> None:
    self.tensors: dict[int, Tensor] = {}
    self.ops: list[Op] = []

  def new(self, nbytes: int, layer: str, alias_of: int | None = None, itemsize: int = 4) -> int:
    tid = len(self.tensors)
    self.tensors[tid] = Tensor(tid, nbytes, layer, alias_of, itemsize=itemsize)
    return tid

  def add_layer(
    self, layer: Any, in_ids: list[int], specs: list[Any], training: bool
  ) -> tuple[list[int], list[Any]]:
    graph = _concrete(layer, specs, training).graph
    ids: dict[str, int] = {}
    weight_like: set[str] = set()
    args = [p for p in graph.inputs if p.dtype != tf.resource]
    for p, tid in zip(args, in_ids):
      ids[p.name] = tid
    constant: set[str] = set()
    for op in graph.get_operations():
      if op.type == "ReadVariableOp":
        weight_like.update(t.name for t in op.outputs)
      elif op.type in _optable.FREE:
        constant.update(t.name for t in op.outputs if t.name not in ids)
      else:
        self._add_op(layer.name, op, ids, weight_like, constant)
    outs = [t for t in graph.outputs if t.dtype != tf.resource]
    return [ids.get(t.name, -1) for t in outs], [tf.TensorSpec(t.shape, t.dtype) for t in outs]

  def _add_op(
    self, lname: str, op: Any, ids: dict[str, int], weight_like: set[str], constant: set[str]
  ) -> None:
    inputs = [ids.get(t.name, -1) for t in op.inputs]
    data_in = [i for i in inputs if i >= 0]
    from_weight = any(t.name in weight_like for t in op.inputs)
    if op.type in _optable.ALIASES and data_in:
      root = self.root(data_in[0])
      outs = [self.new(_nbytes(t), lname, root, _size(t)) for t in op.outputs]
    elif not data_in:
      # computed from weights and constants only (a reshaped bias, a shape)
      (weight_like if from_weight else constant).update(t.name for t in op.outputs)
      return
    else:
      outs = [self.new(_nbytes(t), lname, None, _size(t)) for t in op.outputs]
    for t, tid in zip(op.outputs, outs):
      ids[t.name] = tid
    needs = op.type != "StopGradient" and (
      from_weight or any(self.tensors[i].needs_grad for i in data_in)
    )
    for tid in outs:
      self.tensors[tid].needs_grad = needs
    kept_in, kept_out = _optable.KEPT.get(op.type, ((), False))
    kept = [inputs[i] for i in kept_in if i < len(inputs) and inputs[i] >= 0]
    kept += outs if kept_out else []
    grad_in = bool(data_in) and self.tensors[data_in[0]].needs_grad
    pooled, grad_pooled = _workspace.large_conv_passes(op, grad_in)  # planned once
    large = op.type in _optable.LARGE_CONVS
    ws, gws = (sum(pooled), sum(grad_pooled)) if large else _workspace.of(op, grad_in)
    wgrad = sum(_nbytes(t) for t in op.inputs if t.name in weight_like) if from_weight else 0
    self.ops.append(
      Op(op.type, op.name, lname, inputs, outs, kept, ws, gws, wgrad, _optable.priced(op.type))
    )
    if op.type in _optable.TF_CONVS:
      self.ops[-1].largeconv_workspace = _workspace.largeconv_bound(op)
    if op.type in _optable.LARGE_CONVS and _workspace.keeps_memory(op):
      self.ops[-1].pooled, self.ops[-1].grad_pooled = pooled, grad_pooled

  def root(self, tid: int) -> int:
    while self.tensors[tid].alias_of is not None:
      tid = self.tensors[tid].alias_of  # type: ignore[assignment]
    return tid


def trace(model: Any, input_shape: tuple[int, ...], training: bool) -> Traced:
  """Traces every layer of `model` for inputs of `input_shape` (batch included)."""
  b = _Builder()
  batch = input_shape[0]
  kt_ids: dict[int, int] = {}
  kt_specs: dict[int, Any] = {}
  model_inputs = []
  for kt in model.inputs:
    shape = (batch, *input_shape[1:])
    kt_specs[id(kt)] = tf.TensorSpec(shape, kt.dtype)
    nbytes = math.prod(shape) * tf.as_dtype(kt.dtype).size
    kt_ids[id(kt)] = b.new(nbytes, "input", None, tf.as_dtype(kt.dtype).size)
    model_inputs.append(kt_ids[id(kt)])
  layer_outputs: dict[str, list[int]] = {}
  layers = []
  for node in _nodes_in_order(model):
    layer = node.operation
    if not node.input_tensors or type(layer).__name__ == "InputLayer":
      continue
    in_ids = [kt_ids[id(kt)] for kt in node.input_tensors]
    specs = [kt_specs[id(kt)] for kt in node.input_tensors]
    outs, out_specs = b.add_layer(layer, in_ids, specs, training)
    for kt, tid, spec in zip(node.outputs, outs, out_specs):
      kt_ids[id(kt)] = tid
      kt_specs[id(kt)] = spec
    layer_outputs[layer.name] = outs
    layers.append(layer)
  outputs = [kt_ids[id(kt)] for kt in model.outputs]
  return Traced(b.ops, b.tensors, model_inputs, outputs, layer_outputs, layers)
