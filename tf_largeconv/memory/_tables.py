"""From traced ops to the report's numbers: the per-layer rows and the four peaks."""

from __future__ import annotations

import math
from typing import Any

from tf_largeconv.memory import _optable
from tf_largeconv.memory import _simulate
from tf_largeconv.memory._report import LayerRow
from tf_largeconv.memory._trace import Traced


def _root(t: Traced, tid: int) -> int:
  while t.tensors[tid].alias_of is not None:
    tid = t.tensors[tid].alias_of  # type: ignore[assignment]
  return tid


def rows(t: Traced, model: Any) -> list[LayerRow]:
  """One row per traced layer; a kept buffer is counted at the first layer that keeps it."""
  counted: set[int] = set(_root(t, i) for i in t.inputs)
  out = []
  grad_ops = set(id(op) for op in _simulate._grad_ops(t))
  for layer in t.layers:
    ops = [op for op in t.ops if op.layer == layer.name]
    outputs = sum(t.tensors[o].nbytes for o in t.layer_outputs.get(layer.name, []) if o >= 0)
    kept = 0
    for op in ops:
      if id(op) not in grad_ops:
        continue
      for k in op.kept:
        r = _root(t, k)
        if r not in counted:
          counted.add(r)
          kept += t.tensors[r].nbytes
    ws = max((op.workspace for op in ops), default=0)
    alt = [a for op in ops if op.type in _optable.TF_CONVS if (a := _largeconv_bound(op))]
    params = sum(math.prod(w.shape) * _itemsize(w) for w in layer.weights)
    missing = sorted({op.type for op in ops if not op.priced})
    out.append(
      LayerRow(
        layer.name,
        type(layer).__name__,
        outputs,
        kept,
        ws,
        max(alt) if alt else None,
        params,
        missing,
      )
    )
  return out


def _largeconv_bound(op: Any) -> int | None:
  return getattr(op, "largeconv_workspace", None)


def _itemsize(w: Any) -> int:
  import numpy as np

  return np.dtype(w.dtype).itemsize


def _loss_bytes(t: Traced) -> int:
  # A regression loss: the difference of prediction and target, kept for its square's
  # gradient.
  return sum(t.tensors[_root(t, o)].nbytes for o in t.outputs)


def peaks(infer: Traced, train: Traced | None) -> dict[str, Any]:
  p, _ = _simulate.peaks(infer, False, False, 0)
  e, _ = _simulate.peaks(infer, False, True, 0)
  fields: dict[str, Any] = dict(
    inference_peak=p.bytes,
    inference_layer=f"{p.layer} ({p.op})",
    eager_inference_peak=e.bytes,
    training_peak=None,
    training_layer=None,
    eager_training_peak=None,
  )
  if train is not None:
    fwd, bwd = _simulate.peaks(train, True, False, _loss_bytes(train))
    best = max((fwd, bwd), key=lambda q: q.bytes)
    efwd, ebwd = _simulate.peaks(train, True, True, _loss_bytes(train))
    fields.update(
      training_peak=best.bytes,
      training_layer=f"{best.layer} ({best.op}, {best.phase})",
      eager_training_peak=max(efwd.bytes, ebwd.bytes),
    )
  return fields
