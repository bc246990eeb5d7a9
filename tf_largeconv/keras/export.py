"""Exporting a Keras model (Keras 3 or tf_keras) as a SavedModel without LargeConv ops.

Imports no Keras: `keras.export_portable` and `tf_keras.export_portable` both use it.
"""

import os

import tensorflow as tf

from tf_largeconv import ops as _ops

# The prefix of every op type the package registers ("LargeConv>Conv2D", ...).
OP_PREFIX = "LargeConv"


def op_types(graph_def):
  """Every op type in a GraphDef, its function library included."""
  types = {node.op for node in graph_def.node}
  for function in graph_def.library.function:
    types.update(node.op for node in function.node_def)
  return types


def _input_signature(model, input_signature):
  """The TensorSpecs to trace with: `input_signature`, else the model's inputs with the
  batch dimension None."""
  if input_signature is not None:
    specs = list(tf.nest.flatten(input_signature))
    if not specs or not all(isinstance(s, tf.TensorSpec) for s in specs):
      raise ValueError(
        "input_signature must be a list of tf.TensorSpec (one per model "
        f"input), got {input_signature!r}"
      )
    return specs
  try:
    inputs = model.inputs
  except (AttributeError, ValueError):
    inputs = None
  if not inputs:
    raise ValueError(
      f"model {getattr(model, 'name', model)!r} has no defined inputs (it is not built "
      "from an Input): build it with an Input, e.g. keras.Input(shape=(height, width, "
      "channels)) as the first layer of a Sequential or the input of a functional model, "
      "or pass input_signature=[tf.TensorSpec([None, height, width, channels], "
      "tf.float32)]"
    )
  specs = []
  for i, tensor in enumerate(inputs):
    shape = list(tf.TensorShape(tensor.shape).as_list())
    if shape:
      shape[0] = None
    specs.append(tf.TensorSpec(shape, tf.as_dtype(tensor.dtype), name=f"input_{i}"))
  return specs


def _tf_variable(variable):
  """The tf.Variable behind a Keras 3 variable (tf_keras variables are tf.Variables)."""
  if isinstance(variable, tf.Variable):
    return variable
  return variable.value


def export(model, path, input_signature=None):
  """Writes `model` as a SavedModel traced under `ops.portable_only()`; see
  `tf_largeconv.keras.export_portable`. Returns the path as a str."""
  if not callable(model) or not hasattr(model, "variables"):
    raise ValueError(f"model must be a Keras model, got {type(model).__name__}")
  if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
    raise ValueError(f"path must be a non-empty str or os.PathLike, got {path!r}")
  specs = _input_signature(model, input_signature)

  def serve(*args):
    inputs = args[0] if len(args) == 1 else list(args)
    return model(inputs, training=False)

  module = tf.Module()
  # Tracked so that the SavedModel holds their values; the traced graph reads them.
  module.model_variables = [_tf_variable(v) for v in model.variables]
  with _ops.portable_only():
    module.serve = tf.function(serve, input_signature=specs, autograph=False)
    concrete = module.serve.get_concrete_function()
    found = sorted(t for t in op_types(concrete.graph.as_graph_def()) if t.startswith(OP_PREFIX))
    if found:
      raise ValueError(
        f"the traced model still holds {found}: a layer calls the op "
        "library directly instead of tf_largeconv's public ops"
      )
    tf.saved_model.save(module, os.fspath(path), signatures={"serving_default": concrete})
  return os.fspath(path)
