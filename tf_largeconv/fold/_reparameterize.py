"""reparameterize(): a model rebuilt with each of its linear regions (a cone of linear
layers behind one tensor, reaching back to one tensor) folded into one Large layer."""

import tensorflow as tf

from tf_largeconv._options import public_options
from tf_largeconv.fold import _composer
from tf_largeconv.fold import _graph
from tf_largeconv.fold import _large_layer
from tf_largeconv.fold import _layer_kinds
from tf_largeconv.fold import _report

_CONV_KINDS = ("Conv2D", "DepthwiseConv2D", "SeparableConv2D", "Model", "FoldedBlock")
# A region of one of these alone is still worth replacing (a whole block in one layer).
_BLOCK_KINDS = ("Model", "FoldedBlock")


def _cone(graph, node, linear, cut=None):
  """The nodes behind `node` through linear ones (stopping at the tensor `cut`), and the
  tensors where it stops."""
  members, entries, stack = {id(node): node}, set(), list(node.inputs)
  while stack:
    t = stack.pop()
    producer = graph.producer.get(t)
    if t == cut or producer is None or not linear(producer):
      entries.add(t)
    elif id(producer) not in members:
      members[id(producer)] = producer
      stack.extend(producer.inputs)
  return members, entries


def _regions(graph, excluded):
  """Candidate linear regions, latest output first and largest first for each output:
  (nodes in order, entry id, output id).

  A region is the cone of linear layers (not `excluded`: folded already, or unfoldable)
  behind a tensor, whole or cut at one inner tensor, that reaches back to exactly one
  tensor (its entry); nothing outside it may use its inner tensors. It holds a convolution
  and at least two layers, or is one nested model or FoldedBlock. Its last layer may carry
  an activation (kept on the folded layer).
  """

  def linear(node, last=False):
    return (
      id(node) not in excluded
      and len(node.outputs) == 1
      and _layer_kinds.kind(node.layer) is not None
      and (last or _layer_kinds.activation(node.layer) is None)
    )

  model_outputs = set(graph.outputs)
  for node in reversed(graph.nodes):
    if not linear(node, last=True):
      continue
    whole, _ = _cone(graph, node, linear)
    cuts = [None] + [o for n in whole.values() if n is not node for o in n.outputs]
    found = {}
    for cut in cuts:
      members, entries = _cone(graph, node, linear, cut)
      inner = {o for n in members.values() for o in n.outputs} - {node.outputs[0]}
      alone = len(members) == 1 and _layer_kinds.kind(node.layer) in _BLOCK_KINDS
      if (
        len(entries) != 1
        or (len(members) < 2 and not alone)
        or inner & model_outputs
        or not any(_layer_kinds.kind(n.layer) in _CONV_KINDS for n in members.values())
        or any(id(c) not in members for t in inner for c in graph.consumers.get(t, []))
      ):
        continue
      found.setdefault(frozenset(members), (members, next(iter(entries))))
    for members, entry in sorted(found.values(), key=lambda f: -len(f[0])):
      yield [n for n in graph.nodes if id(n) in members], entry, node.outputs[0]


def _fold_regions(graph, flavour, options):
  """{output id: (Large layer, entry id)} and the ids of the nodes they replace.

  Tensors are visited latest first, so a region is as large as can fold exactly; where a
  cone does not fold (say, a 'same' convolution after another), the cones inside it are
  tried, and passes repeat with the folded regions as boundaries until none is left.
  """
  folded, covered, blocked = {}, set(), set()
  progress = True
  while progress:
    progress = False
    for nodes, entry, output in list(_regions(graph, covered | blocked)):
      if any(id(n) in covered for n in nodes):
        continue
      block = _graph.block_of(graph, entry, output, nodes=nodes)
      last = graph.producer[output].layer
      try:
        state, composer = _composer.compose(
          block, _composer.read64, tf.float64, exact=True, final_activation_ok=True
        )
        layer = _large_layer.large_layer(
          state,
          composer,
          block,
          flavour,
          last.get_config().get("dtype"),
          f"{last.name}_folded",
          options,
        )
      except _report.Unfoldable as e:
        # A layer no region can hold (say `a * a`): a boundary from now on, so that later
        # candidates stop at it instead of composing up to it again (the cuts would find
        # the same regions, at the cost of a failed composition each).
        blocked.add(id(e.node))
        progress = True
        break
      except ValueError:
        continue  # not one exact convolution here: the cones inside it are tried next
      covered.update(id(n) for n in nodes)
      folded[output] = (layer, entry)
      progress = True
  return folded, covered


def _clone(layer):
  if not hasattr(layer, "get_weights"):  # a stateless Keras 3 operation (e.g. `a - b`)
    return layer
  return type(layer).from_config(layer.get_config())


def reparameterize(model, flavour, **options):
  """See `tf_largeconv.keras.reparameterize`."""
  public_options(options)  # refused here: a region's ValueError means it does not fold
  graph = _graph.Graph(model)
  folded, covered = _fold_regions(graph, flavour, options)
  tensors = {}
  inputs = []
  for i in graph.inputs:
    t = graph.tensors[i]
    inputs.append(
      flavour.input(batch_shape=tuple(t.shape), dtype=t.dtype, name=t._keras_history[0].name)
    )
    tensors[i] = inputs[-1]

  def mapped(v):
    return tensors[v.id] if isinstance(v, _graph.Ref) else v

  clones = {}
  for node in graph.nodes:
    if node.outputs[0] in folded:
      layer, entry = folded[node.outputs[0]]
      tensors[node.outputs[0]] = layer(tensors[entry])
      continue
    if id(node) in covered:
      continue
    fresh = id(node.layer) not in clones
    clone = clones.setdefault(id(node.layer), _clone(node.layer))
    out = clone(
      *tf.nest.map_structure(mapped, node.args), **tf.nest.map_structure(mapped, node.kwargs)
    )
    tensors.update(zip(node.outputs, tf.nest.flatten(out)))
    if fresh and clone is not node.layer:
      clone.set_weights(node.layer.get_weights())
  outputs = [tensors[o] for o in graph.outputs]
  return flavour.model(
    inputs[0] if len(inputs) == 1 else inputs,
    outputs[0] if len(outputs) == 1 else outputs,
    name=model.name,
  )
