"""A Keras model as a list of streaming steps: each layer (or Keras operation) of the model,
nested models inlined, in an order where every step comes after the steps it reads, with the
rule (`_rules`) that streams it.

Values are numbered: value 0 is the model's input, every step writes one new value. A value
is spatial (an image-shaped tensor, streamed tile by tile) until a global pooling step
reduces it; steps after that (the head) run once, on the reduced values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from tf_largeconv.stream import _layers
from tf_largeconv.stream._rules import Rule


class Step:
  """One layer or operation of the model: its rule, the values it reads and the one it
  writes, and how to call it on tensors for those values (`call(*tensors)`).

  A spatial step's `inputs` are its image-shaped values; `globals` are (position in the
  call, value) of the pooled values it also reads (a squeeze-excitation gate), which the
  runner puts in place whole."""

  __slots__ = (
    "name",
    "kind",
    "rule",
    "inputs",
    "output",
    "call",
    "globals",
    "allocs",
    "tape_allocs",
    "grads",
    "kept",
    "cols",
  )

  def __init__(self, name: str, kind: str, rule: Rule | None, inputs: list[int], call: Any):
    self.name, self.kind, self.rule, self.inputs, self.call = name, kind, rule, inputs, call
    self.output = -1
    self.globals: list[tuple[int, int]] = []
    # The tensors the step's call makes, as shares of its output: temporaries, then the
    # output (`_layers.allocs`).
    self.allocs: tuple[float, ...] = (1.0,)
    # The same under a gradient tape, and the backward pass's temporaries
    # (`_layers.tape_allocs`, `_layers.grad_temps`).
    self.tape_allocs: tuple[float, ...] = (1.0,)
    self.grads: tuple[float, float, bool] = (0.0, 0.0, False)
    # What its backward pass's kernel keeps for the process's life per output shape, as a
    # share of its output (`_layers.kept_by_kernel`).
    self.kept = 0.0
    # TensorFlow's own CPU gradient's im2col buffer, (kernel window x input channels,
    # output channels) (`_layers.grad_cols`); (0, 0) for none.
    self.cols = (0, 0)


class Graph:
  """The steps of a model from its input to `output` (the value the caller wants)."""

  def __init__(self) -> None:
    self.steps: list[Step] = []
    self.output = 0
    self.input_dtype: tf.DType = tf.float32
    self.out_dtype: Any = None
    self.rank = 0
    self.spatial: dict[int, bool] = {0: True}
    self.channels: dict[int, int | None] = {}

  def add(self, step: Step) -> int:
    step.output = len(self.steps) + 1
    self.steps.append(step)
    return step.output


def _history(t: Any) -> tuple[Any, Any]:
  op, node_index, _ = t._keras_history
  return op, op._inbound_nodes[node_index]


def _node_caller(node: Any, op: Any) -> Any:
  """Calls `op` with the node's own arguments, its input tensors replaced."""
  refs = list(node.input_tensors)

  def call(*tensors: tf.Tensor) -> tf.Tensor:
    args, kwargs = node.arguments.fill_in({id(r): t for r, t in zip(refs, tensors)})
    if "training" in kwargs:
      kwargs["training"] = False
    return op(*args, **kwargs)

  return call


class _Builder:
  def __init__(self, graph: Graph) -> None:
    self.graph = graph
    self.memo: dict[tuple[int, int], int] = {}
    self.spatial: dict[int, bool] = {0: True}
    self.scopes = 0

  def value(self, t: Any, env: dict[int, int], scope: int) -> int:
    if id(t) in env:
      return env[id(t)]
    key = (scope, id(t))
    if key in self.memo:
      return self.memo[key]
    op, node = _history(t)
    if node.is_input:
      raise ValueError(
        f"tf_largeconv.stream: the model reads an input ({op.name}) besides its first"
      )
    refs = list(node.input_tensors)
    ins = [self.value(r, env, scope) for r in refs]
    if isinstance(op, keras.Model):
      out = self._inline(op, ins)
    else:
      out = self._step(op, node, refs, ins)
    self.memo[key] = out
    self.graph.channels.setdefault(out, t.shape[-1])
    return out

  def _step(self, op: Any, node: Any, refs: list[Any], ins: list[int]) -> int:
    kinds = {self.spatial[v] for v in ins}
    rule: Rule | None = None
    call = _node_caller(node, op)
    if kinds == {False}:
      kind = "head"
    elif not ins:
      raise ValueError(f"tf_largeconv.stream: layer '{op.name}' reads no input tensor")
    else:
      rule, kind = _layers.rule_for(op, refs, self.graph.rank, call)
    step = Step(op.name, kind, rule, ins, call)
    step.allocs = _layers.allocs(op, kind, len(ins), bool(getattr(rule, "fused", False)))
    step.tape_allocs = _layers.tape_allocs(op, kind, len(ins))
    step.grads = _layers.grad_temps(op, kind)
    step.kept = _layers.kept_by_kernel(op, kind, rule)
    step.cols = _layers.grad_cols(op, kind, rule)
    if kinds == {True, False}:
      self._gate(step, refs)
    out = self.graph.add(step)
    self.spatial[out] = rule is not None and rule.spatial_out
    return out

  def _gate(self, step: Step, refs: list[Any]) -> None:
    """A per-pixel step reading pooled values of one pixel per image (a squeeze-excitation
    gate): they become the step's `globals`; anything else is refused."""
    rank = self.graph.rank
    pooled = [(i, v, r) for i, (v, r) in enumerate(zip(step.inputs, refs)) if not self.spatial[v]]
    if step.kind != "pointwise" or any(
      len(r.shape) != rank + 2 or any(n != 1 for n in r.shape[1:-1]) for _, _, r in pooled
    ):
      raise ValueError(
        f"tf_largeconv.stream: layer '{step.name}' combines an image-shaped tensor with a "
        "globally pooled one other than pixel by pixel with one pooled pixel per image, so "
        "each of its pixels depends on the whole image: stream the model up to the layer "
        "before it (up_to=...) and run the rest on the result"
      )
    step.globals = [(i, v) for i, v, _ in pooled]
    step.inputs = [v for v in step.inputs if self.spatial[v]]

  def _inline(self, model: keras.Model, ins: list[int]) -> int:
    inputs, outputs = _flat(model.inputs), _flat(model.outputs)
    if len(inputs) != len(ins) or len(outputs) != 1:
      raise ValueError(
        f"tf_largeconv.stream: the nested model '{model.name}' has {len(inputs)} inputs and "
        f"{len(outputs)} outputs; stream.predict inlines nested models of one output"
      )
    env = {id(t): v for t, v in zip(inputs, ins)}
    self.scopes += 1
    return self.value(outputs[0], env, self.scopes)


def _flat(tensors: Any) -> list[Any]:
  return list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]


def _model_tensors(model: Any, up_to: str | None) -> tuple[Any, Any]:
  if not isinstance(model, keras.Model):
    raise TypeError(
      "model must be a Keras model (keras.Model or tf_keras.Model, functional or "
      "Sequential), got "
      f"{type(model).__name__}"
    )
  try:
    inputs, outputs = _flat(model.inputs), _flat(model.outputs)
  except (AttributeError, ValueError) as e:
    raise ValueError(
      f"model '{model.name}' has no defined input yet: build it on a keras.Input (for a "
      "Sequential model, start it with keras.Input(shape=(None, None, channels)))"
    ) from e
  if len(inputs) != 1:
    raise ValueError(
      f"model '{model.name}' takes {len(inputs)} inputs; stream.predict streams one image input"
    )
  if up_to is not None:
    try:
      layer = model.get_layer(up_to)
    except ValueError as e:
      raise ValueError(f"up_to: model '{model.name}' has no layer named {up_to!r}") from e
    outs = _flat(layer.output)
    return inputs[0], outs[0]
  if len(outputs) != 1:
    raise ValueError(
      f"model '{model.name}' has {len(outputs)} outputs; stream.predict streams one "
      "(pass up_to='layer name' to stream the model up to one of them)"
    )
  return inputs[0], outputs[0]


def build(model: Any, up_to: str | None = None) -> Graph:
  """The steps of `model` (up to the layer named `up_to`, if given).

  Raises:
    TypeError: model is not a Keras 3 model.
    ValueError: a layer that cannot be streamed (named, with where to split the model), a
      model with several inputs or outputs, an unknown `up_to`.
  """
  inp, out = _model_tensors(model, up_to)
  graph = Graph()
  graph.rank = len(inp.shape) - 2
  if graph.rank not in (1, 2, 3):
    raise ValueError(
      f"model '{model.name}' takes inputs of shape {tuple(inp.shape)}; stream.predict streams "
      "1-D, 2-D or 3-D images, channels last: (batch, *spatial, channels)"
    )
  graph.input_dtype = tf.as_dtype(inp.dtype)
  graph.out_dtype = tf.as_dtype(out.dtype).as_numpy_dtype
  graph.channels[0] = inp.shape[-1]
  builder = _Builder(graph)
  graph.output = builder.value(out, {id(inp): 0}, 0)
  graph.spatial = builder.spatial
  if graph.output == 0:
    raise ValueError("tf_largeconv.stream: the model's output is its input; nothing to stream")
  return graph


def spatial_sizes(graph: Graph, sizes: Sequence[int]) -> dict[int, tuple[int, ...]]:
  """Binds every spatial step's rule to the image's spatial `sizes`: the spatial size of
  every spatial value."""
  out: dict[int, tuple[int, ...]] = {0: tuple(int(n) for n in sizes)}
  for step in graph.steps:
    if step.rule is None:
      continue
    ins = [out[v] for v in step.inputs]
    if any(s != ins[0] for s in ins[1:]):
      raise ValueError(
        f"tf_largeconv.stream: layer '{step.name}' merges tensors of spatial sizes "
        f"{', '.join(str(s) for s in ins)} for an image of {tuple(sizes)}"
      )
    try:
      sized = step.rule.bind(ins[0])
    except ValueError as e:
      raise ValueError(
        f"tf_largeconv.stream: layer '{step.name}' cannot run on its input of spatial size "
        f"{ins[0]} (from an image of {tuple(sizes)}): {e}"
      ) from e
    if step.rule.spatial_out:
      out[step.output] = sized
  return out
