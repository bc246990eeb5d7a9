"""Peaks of one inference call and one training step, by walking a traced model's ops in
order and keeping count of the buffers alive: each op's new outputs (less those written
over a dying input), its kernel's temporary memory, and what frees after it.

Four regimes:
- traced inference (`predict`, a `tf.function`): a buffer dies after its last reader;
- traced training (`fit`): the same forwards, plus what the gradients keep and the loss
  gradient TensorFlow folds into a constant (`FOLD_LIMIT`), then the backward pass in
  reverse op order with the gradients of the pending tensors and of the weights;
- eager inference (`model(x)`): no buffer is written over (Python holds every result), and
  every layer's output lives until the call returns;
- eager training (a `GradientTape` step): the eager forward with the tape's kept tensors,
  then the same backward pass.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tf_largeconv.memory import _optable
from tf_largeconv.memory import _workspace
from tf_largeconv.memory._trace import Traced

# On a traced step's first call TensorFlow's graph optimizer (grappler's constant folding)
# computes the loss gradient's broadcast, a tensor of the output's shape, as a constant,
# unless it is over the optimizer's limit (kMaxConstantSize, 10 MiB): the step's function
# then holds the constant, and the optimizer's copies of it (its value and the graph's
# protos, malloc'd and freed before the step runs) leave heap that the process keeps,
# FOLDED_COPIES times the constant. Fitted (benchmarks.cpu.folded_loss) to the RssAnon
# growth of the 135x135 LargeConv2D step (benchmarks.cpu.memory's seed case) at batches 1
# to 8, traced with a static batch against an unknown one (then nothing is folded): 1.4 to
# 5.6 times the constant, median 4.4, the held copy included.
FOLD_LIMIT = 10 << 20
FOLDED_COPIES = 3.5


@dataclasses.dataclass
class Peak:
  bytes: int
  layer: str
  op: str
  phase: str  # "forward" or "backward"


class _Pool:
  """Live buffers: bytes and reference counts."""

  def __init__(self) -> None:
    self.size: dict[object, int] = {}
    self.refs: dict[object, int] = {}
    self.live = 0

  def add(self, key: object, nbytes: int, refs: int) -> None:
    self.size[key], self.refs[key] = nbytes, refs
    self.live += nbytes

  def drop(self, key: object, n: int = 1) -> None:
    if key not in self.refs:
      return
    self.refs[key] -= n
    if self.refs[key] <= 0:
      self.live -= self.size.pop(key)
      del self.refs[key]


def _root(t: Traced, tid: int) -> int:
  while t.tensors[tid].alias_of is not None:
    tid = t.tensors[tid].alias_of  # type: ignore[assignment]
  return tid


def _readers(t: Traced, ops: list[Any]) -> dict[int, int]:
  reads: dict[int, int] = {}
  for op in ops:
    for i in op.inputs:
      if i >= 0:
        r = _root(t, i)
        reads[r] = reads.get(r, 0) + 1
  return reads


def _grad_ops(t: Traced) -> list[Any]:
  return [op for op in t.ops if any(t.tensors[o].needs_grad for o in op.outputs)]


def forward(
  t: Traced, training: bool, eager: bool, ws: _workspace.Workspaces
) -> tuple[Peak, _Pool, dict[int, int]]:
  """The forward pass's peak, the pool left at its end (what the backward pass starts
  with), and the buffer each tensor was written into. `ws`: the package's workspace pool,
  which keeps LargeConv kernels' workspaces between calls."""
  reads = _readers(t, t.ops)
  pinned = {_root(t, o) for o in t.outputs}
  kept: dict[int, int] = {}
  if training:
    for op in _grad_ops(t):
      for k in op.kept:
        r = _root(t, k)
        kept[r] = kept.get(r, 0) + 1
  if eager:  # the functional call holds every layer's output until it returns
    for outs in t.layer_outputs.values():
      pinned.update(_root(t, o) for o in outs)
  pool = _Pool()
  buf: dict[int, int] = {}
  external = set(_root(t, i) for i in t.inputs)
  for o in t.outputs if training and not eager else ():
    nbytes = t.tensors[_root(t, o)].nbytes
    if nbytes <= FOLD_LIMIT:  # the folded loss gradient and the heap its folding leaves
      pool.add(("folded", o), nbytes, 1)
      pool.add(("heap", o), int(FOLDED_COPIES * nbytes), 1)
  peak = Peak(0, "", "", "forward")
  for op in t.ops:
    new = 0
    for o in op.outputs:
      if t.tensors[o].alias_of is not None:
        continue
      donor = _donor(t, op, o, pool, buf, reads, pinned | set(kept) | external, eager)
      buf[o] = donor if donor is not None else o
      if donor is None:
        new += t.tensors[o].nbytes
    now = pool.live + new + (ws.run(op.pooled) if op.pooled else ws.held + op.workspace)
    if now > peak.bytes:
      peak = Peak(now, op.layer, op.type, "forward")
    for o in op.outputs:
      if t.tensors[o].alias_of is not None:
        continue
      refs = reads.get(o, 0) + (o in pinned) + kept.get(o, 0)
      if buf[o] != o:
        pool.refs[buf[o]] += refs
      elif refs > 0:
        pool.add(o, t.tensors[o].nbytes, refs)
    for i in op.inputs:
      if i >= 0:
        r = _root(t, i)
        pool.drop(buf.get(r, r))
  if eager:  # the call returns: the layers' outputs not kept are freed
    for outs in t.layer_outputs.values():
      for o in outs:
        r = _root(t, o)
        if r not in {_root(t, x) for x in t.outputs}:
          pool.drop(buf.get(r, r))
  return peak, pool, buf


def _donor(
  t: Traced,
  op: Any,
  out: int,
  pool: _Pool,
  buf: dict[int, int],
  reads: dict[int, int],
  keep: set[int],
  eager: bool,
) -> int | None:
  """The buffer `op` writes `out` over: its first input of the same size that dies here."""
  if eager or op.type not in _optable.FORWARDS:
    return None
  for i in op.inputs:
    if i < 0:
      continue
    r = _root(t, i)
    b = buf.get(r, r)
    same = t.tensors[r].nbytes == t.tensors[out].nbytes
    if same and r not in keep and b in pool.refs and pool.refs[b] == 1:
      return b
  return None


def backward(
  t: Traced, pool: _Pool, buf: dict[int, int], loss_bytes: int, ws: _workspace.Workspaces
) -> Peak:
  """The backward pass's peak, starting from the forward's pool with the gradient of the
  model's outputs and the loss's temporaries."""
  grads: dict[int, int] = {}  # forward root -> its gradient's bytes, while pending
  start = sum(t.tensors[_root(t, o)].nbytes for o in t.outputs) + loss_bytes
  for o in t.outputs:
    grads[_root(t, o)] = t.tensors[_root(t, o)].nbytes
  weights = 0
  peak = Peak(pool.live + start, "loss", "loss", "backward")
  live_grads = start
  for op in reversed(_grad_ops(t)):
    if op.type in _optable.ALIASES:
      continue
    incoming = sum(grads.get(_root(t, o), 0) for o in op.outputs)
    new = 0
    for i in op.inputs:
      if i < 0 or not t.tensors[_root(t, i)].needs_grad:
        continue
      r = _root(t, i)
      nbytes = t.tensors[r].nbytes
      if op.type in _optable.FORWARDS and nbytes <= incoming and r not in grads:
        incoming -= nbytes  # written over the dying incoming gradient
        grads[r] = nbytes
        continue
      new += nbytes
      if r in grads:  # a second reader's gradient: summed into the first (AddN)
        continue
      grads[r] = nbytes
    held = ws.run(op.grad_pooled) if op.grad_pooled else ws.held + op.grad_workspace
    now = pool.live + live_grads + new + held + weights + op.weight_grad_bytes
    if now > peak.bytes:
      peak = Peak(now, op.layer, op.type + " gradient", "backward")
    weights += op.weight_grad_bytes
    live_grads = sum(grads.values())
    for o in op.outputs:
      live_grads -= grads.pop(_root(t, o), 0)
    for k in op.kept:
      r = _root(t, k)
      pool.drop(buf.get(r, r))
  return peak


def peaks(t: Traced, training: bool, eager: bool, loss_bytes: int) -> tuple[Peak, Peak]:
  """(forward peak, backward peak); without training the backward's is the forward's."""
  ws = _workspace.Workspaces()
  fwd, pool, buf = forward(t, training, eager, ws)
  if not training:
    return fwd, fwd
  return fwd, backward(t, pool, buf, loss_bytes, ws)
