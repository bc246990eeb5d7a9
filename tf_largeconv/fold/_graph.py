"""A built model's layer graph, read through the attributes Keras 3 and tf_keras share, and
the blocks fold works on: a graph (or a region of one) from one input tensor to one output
tensor."""

import dataclasses

import tensorflow as tf

# A spatial size that stands in for an unknown input height or width. At stride 1 every
# offset, padding and size difference the fold computes is independent of the input size.
STAND_IN = 4096


@dataclasses.dataclass(frozen=True)
class Ref:
  """Stands for a graph tensor (by id) inside a node's call arguments."""

  id: int


@dataclasses.dataclass
class Node:
  layer: object
  args: tuple  # call arguments with graph tensors replaced by Ref
  kwargs: dict
  inputs: list  # ids of the graph tensors among the arguments, in order
  outputs: list  # ids of the output tensors


def describe(layer):
  """A layer as messages name it: its class and name."""
  return f"{type(layer).__name__} layer '{getattr(layer, 'name', '?')}'"


def _is_graph_tensor(value):
  return hasattr(value, "_keras_history")


def _call_arguments(node):
  arguments = getattr(node, "arguments", None)  # Keras 3
  if arguments is not None:
    return tuple(arguments.args), dict(arguments.kwargs)
  return tuple(node.call_args), dict(node.call_kwargs)  # tf_keras


def _ref(value):
  return Ref(id(value)) if _is_graph_tensor(value) else value


class Graph:
  """A built functional model's nodes in topological order, tensors by id.

  Uses the attributes Keras 3 and tf_keras share: a symbolic tensor's `_keras_history`
  (layer, node index, tensor index) and a layer's `_inbound_nodes`.
  """

  def __init__(self, model):
    inputs, outputs = getattr(model, "inputs", None), getattr(model, "outputs", None)
    if not inputs or not outputs:
      raise ValueError(
        f"model '{model.name}' is not built: give it an Input (a functional "
        "model, or a Sequential model starting with keras.Input)"
      )
    self.name = model.name
    self.inputs = [id(t) for t in inputs]
    self.outputs = [id(t) for t in outputs]
    self.tensors = {id(t): t for t in list(inputs) + list(outputs)}
    self.nodes = []
    seen = set()
    # Iterative depth-first search from the outputs: a node is appended after every node
    # producing one of its inputs.
    stack = [(t, False) for t in reversed(outputs)]
    while stack:
      tensor, expanded = stack.pop()
      if id(tensor) in self.inputs:
        continue
      layer, node_index, _ = tensor._keras_history
      node = layer._inbound_nodes[node_index]
      if id(node) in seen and not expanded:
        continue
      args, kwargs = _call_arguments(node)
      arg_tensors = [v for v in tf.nest.flatten((args, kwargs)) if _is_graph_tensor(v)]
      if expanded:
        if id(node) not in seen:
          seen.add(id(node))
          outs = [t for t in tf.nest.flatten(node.outputs) if _is_graph_tensor(t)]
          self.tensors.update({id(t): t for t in outs + arg_tensors})
          self.nodes.append(
            Node(
              layer,
              tf.nest.map_structure(_ref, args),
              tf.nest.map_structure(_ref, kwargs),
              [id(t) for t in arg_tensors],
              [id(t) for t in outs],
            )
          )
        continue
      if not arg_tensors:
        raise ValueError(f"{describe(layer)} has no input from the model's inputs")
      stack.append((tensor, True))
      stack.extend((t, False) for t in reversed(arg_tensors))
    self.producer = {o: n for n in self.nodes for o in n.outputs}
    self.consumers = {}
    for n in self.nodes:
      for i in dict.fromkeys(n.inputs):
        self.consumers.setdefault(i, []).append(n)


@dataclasses.dataclass
class Block:
  nodes: list
  inputs: list  # [the input tensor's id]
  outputs: list  # [the output tensor's id]
  channels: int
  size: tuple  # (H, W): the real input size when known, else the stand-in
  known: bool
  name: str = "block"


def block_of(graph, entry, output, input_size=None, nodes=None):
  """The block of `graph` from tensor `entry` to tensor `output`.

  Args:
    graph: a Graph.
    entry: the id of the block's input tensor.
    output: the id of the block's output tensor.
    input_size: (height, width) to fold at, or None for the entry's static size.
    nodes: the nodes between entry and output, in order; None for all of the graph's.

  Returns:
    A Block.

  Raises:
    ValueError: the entry is not 4-D or its channel count is unknown.
  """
  shape = tuple(graph.tensors[entry].shape)
  if len(shape) != 4:
    raise ValueError(f"fold needs a 4-D (batch, height, width, channels) input, got shape {shape}")
  if shape[3] is None:
    raise ValueError(f"fold needs the input's channel count; the block's input has shape {shape}")
  size = tuple(input_size) if input_size is not None else shape[1:3]
  known = all(s is not None for s in size)
  size = tuple(int(s) if s is not None else STAND_IN for s in size)
  return Block(
    nodes=graph.nodes if nodes is None else nodes,
    inputs=[entry],
    outputs=[output],
    channels=int(shape[3]),
    size=size,
    known=known,
    name=graph.name,
  )


def model_block(model, input_size=None):
  """The block of a whole model, which must have one input and one output."""
  graph = Graph(model)
  if len(graph.inputs) != 1 or len(graph.outputs) != 1:
    raise ValueError(
      f"fold needs a model with one input and one output; '{graph.name}' has "
      f"{len(graph.inputs)} inputs and {len(graph.outputs)} outputs"
    )
  return block_of(graph, graph.inputs[0], graph.outputs[0], input_size)
