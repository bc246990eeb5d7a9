"""tf_largeconv.memory: where a Keras model's memory goes, before running it.

`report(model, input_shape)` traces each layer into TensorFlow ops, prices each op (its
output, what its gradient keeps for the backward pass, its kernel's temporary memory), and
walks the ops in order to predict the peak of one inference call and one training step,
as `predict` and `fit` run them (traced) and as `model(x)` and a `GradientTape` step run
them (eager). See the guide page "Where the memory goes".
"""

from __future__ import annotations

import math
from typing import Any

from tf_largeconv.memory._report import Advice
from tf_largeconv.memory._report import LayerRow
from tf_largeconv.memory._report import MemoryReport

__all__ = ["Advice", "LayerRow", "MemoryReport", "report"]


def _check(model: Any, input_shape: Any) -> tuple[int, ...]:
  import keras

  if not isinstance(model, keras.Model):
    raise TypeError(f"model must be a built Keras 3 model, got {type(model).__name__}")
  if not model.built or not getattr(model, "inputs", None):
    raise ValueError(
      f"model '{model.name}' is not built: it has no inputs; call it on an input or build "
      "it with keras.Input first (a subclassed model needs model.build(input_shape))"
    )
  if len(model.inputs) != 1:
    raise ValueError(f"model '{model.name}' has {len(model.inputs)} inputs; report takes one")
  try:
    shape = tuple(int(d) for d in input_shape)
  except (TypeError, ValueError):
    raise ValueError(
      f"input_shape must be a tuple of ints (batch, *spatial, channels), got {input_shape!r}"
    ) from None
  expected = tuple(model.inputs[0].shape)
  bad = len(shape) != len(expected) or any(
    e is not None and e != s for e, s in zip(expected[1:], shape[1:])
  )
  if bad or any(s <= 0 for s in shape):
    raise ValueError(
      f"input_shape {shape} does not fit model '{model.name}', whose input is {expected} "
      "(batch first; every axis a positive int)"
    )
  return shape


def _slots_per_weight(optimizer: Any) -> int:
  """The optimizer's variables per trained weight (Adam 2, SGD with momentum 1), counted
  on a copy built for one small variable."""
  if optimizer is None:
    return 0
  import keras

  copy = type(optimizer).from_config(optimizer.get_config())
  probe = keras.Variable([0.0, 0.0])
  before = len(copy.variables)
  copy.build([probe])
  return sum(1 for v in copy.variables[before:] if tuple(v.shape) == (2,))


def report(
  model: Any,
  input_shape: Any,
  *,
  training: bool = True,
  optimizer: Any = None,
  budget: int | None = None,
) -> MemoryReport:
  """The memory of one inference call and (with training) one training step of `model`
  on a batch of `input_shape`, layer by layer, with advice.

  Args:
    model: a built Keras 3 model with one input (functional or Sequential).
    input_shape: (batch, *spatial, channels).
    training: also price a training step (what the gradients keep, the backward pass).
    optimizer: the optimizer whose slots to count; default: the model's, if compiled.
    budget: bytes the step may grow by: the report says what fits and what does not, and
      which tile `stream.predict` would need.

  Raises:
    TypeError: model is not a Keras model.
    ValueError: the model is not built; input_shape does not fit it; a budget below the
      smallest working set (the message gives that minimum).
  """
  from tf_largeconv.memory import _advice
  from tf_largeconv.memory import _simulate
  from tf_largeconv.memory import _tables
  from tf_largeconv.memory import _trace

  shape = _check(model, input_shape)
  if budget is not None and (not isinstance(budget, int) or budget <= 0):
    raise ValueError(f"budget must be a positive number of bytes, got {budget!r}")
  optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
  infer = _trace.trace(model, shape, training=False)
  train = _trace.trace(model, shape, training=True) if training else None
  peaks = _tables.peaks(infer, train)
  params = sum(math.prod(w.shape) * _itemsize(w) for w in model.weights)
  trainable = sum(math.prod(w.shape) * _itemsize(w) for w in model.trainable_weights)
  slots = _slots_per_weight(optimizer) if training else 0
  fields = dict(
    input_shape=shape,
    training=training,
    budget=budget,
    layers=_tables.rows(train or infer, model),
    param_bytes=params,
    gradient_bytes=trainable if training else 0,
    optimizer_slots=slots,
    optimizer_bytes=slots * trainable,
    not_priced=sorted({op.type for t in (infer, train) if t for op in t.ops if not op.priced}),
    **peaks,
  )
  del _simulate
  rep = MemoryReport(**fields, advice=[])
  rep.advice = _advice.advise(model, shape, rep, budget)
  return rep


def _itemsize(w: Any) -> int:
  import numpy as np

  return np.dtype(w.dtype).itemsize
