"""The tensors a tile's training step makes, for the memory model (`_pool`): the tile's
forward pass under a gradient tape, which keeps what the backward pass reads, then the
backward pass, layer by layer from the last.

Forward: as `_plan.tile_events(..., taped=True)`, except that the tape keeps every tensor
a layer makes (its temporaries too) and every cropped or padded copy it reads, until the
backward pass has gone through that layer.

Backward, for each layer: the gradient of its output (the sum of those its readers sent
back, where it has several); its own temporaries (`Step.grads`: an activation's gradient,
a max pooling's or a resize's scratch); the gradient of the part of each input it read,
scattered into a whole window where it read a crop or a padded copy (a sum passes its
output's gradient on as it is). Then its output's gradient and what the tape kept for it
are freed. Values no layer with weights leads to (the input window and what is computed
from it alone) get no gradient: TensorFlow does not compute it.

A strided convolution's kernel gradient also leaves a buffer of its output's size held
outside TensorFlow's pool for each shape it runs on (`Step.kept`, a ('k', key, bytes)
event: `_pool.Pool.keep`): a pass over tiles of several shapes holds one per shape.

A layer that runs the package's op under the tape (`package_under_tape`) takes its
planner's workspace in its forward pass (freed as the op returns, not kept by the tape)
and in each of its gradients' two passes, which run one after the other, the input's
gradient allocated first (`_plan.package_workspaces`; `keep_memory=False`: nothing is
kept after them). Where oneDNN is off, TensorFlow's own gradient of a convolution takes an
im2col buffer in each of those two passes in the same way (`Step.cols`,
`_layers.grad_col_bytes`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tf_largeconv.stream import _layers
from tf_largeconv.stream import _plan
from tf_largeconv.stream import _pool

Event = tuple[Any, ...]
# Steps whose layer has weights a training step updates: where gradients start to flow.
WEIGHTED = ("conv", "folded conv", "transpose")


def _with_grads(steps: Sequence[Any]) -> set[int]:
  """The values that get a gradient: outputs of weighted steps and of steps reading one."""
  found: set[int] = set()
  for step in steps:
    if step.kind in WEIGHTED or any(v in found for v in step.inputs):
      found.add(step.output)
  return found


class _Grads:
  """The gradients in flight: per value, the tensors its readers sent back, each freed when
  no value holds it any more (a sum hands one tensor to all its inputs)."""

  def __init__(self, ev: list[Event]) -> None:
    self.ev, self.pending, self.refs = ev, {}, {}  # type: ignore[var-annotated]

  def send(self, v: int, key: Any) -> None:
    self.pending.setdefault(v, []).append(key)
    self.refs[key] = self.refs.get(key, 0) + 1

  def drop(self, key: Any) -> None:
    self.refs[key] -= 1
    if self.refs[key] == 0:
      self.ev.append(("f", key))

  def take(self, v: int, nbytes: int) -> Any:
    """The gradient of `v` (None where none came back), its parts summed into one."""
    keys = self.pending.pop(v, [])
    if len(keys) <= 1:
      return keys[0] if keys else None
    self.ev.append(("a", ("sum", v), nbytes))
    for key in keys:
      self.drop(key)
    self.refs[("sum", v)] = 1
    return ("sum", v)


# Output-sized tensors a tile's loss holds when its backward pass starts: the label tile,
# and the per-pixel loss's difference and square (mean squared error, as measured; a
# head's step instead reads the output gradient's tile, one).
DENSE_LOSS, HEAD_LOSS = 3, 1


def train_tile_events(
  tiling: _plan.Tiling, index: Sequence[int], batch: int, itemsize: int, loss: int = DENSE_LOSS
) -> list[Event]:
  """The tensors tile `index`'s training step allocates and frees, in order: ('a', key,
  bytes) and ('f', key), as `_plan.tile_events`, and ('k', key, bytes) for what a kernel
  keeps per shape (`Step.kept`); `loss` output-sized tensors for the loss
  (`DENSE_LOSS`, `HEAD_LOSS`), freed once the output's gradient is made."""
  g = tiling.geometry
  steps = g.spatial_steps
  forward = _plan.tile_events(tiling, index, batch, itemsize, taped=True)
  # The tape keeps what the forward pass makes, but not an op's workspace ('ws', k).
  ws = {e[1][1]: e[2] for e in forward if e[0] == "a" and _is_ws(e[1])}
  size = {e[1]: e[2] for e in forward if e[0] == "a" and not _is_ws(e[1])}
  ev: list[Event] = [e for e in forward if e[0] == "a" or _is_ws(e[1])]
  needs = _with_grads(steps)
  grads = _Grads(ev)
  onednn = _pool.onednn()
  for v in g.sinks:  # the output's gradient, from the loss or the head
    if v in size and v in needs:
      ev.extend(("a", ("loss", v, j), size[v]) for j in range(loss))
      ev.append(("a", ("g", v), size[v]))
      ev.extend(("f", ("loss", v, j)) for j in range(loss))
      grads.send(v, ("g", v))
  for k in reversed(range(len(steps))):
    step = steps[k]
    if step.output not in size:
      continue
    dy = grads.take(step.output, size[step.output])
    made: list[Any] = [key for key in size if isinstance(key, tuple) and key[:2] == ("tmp", k)]
    made.append(step.output)
    read = [key for key in size if isinstance(key, tuple) and key[0] != "tmp" and key[1] == k]
    if dy is None:
      ev.extend(("f", key) for key in made + read)
      continue
    if step.kept:  # the kernel's gradient keeps a buffer per output shape (`_pool.Pool.keep`)
      spans = tiling.window(index, step.output) or []
      shape = tuple(b - a for a, b in spans)
      ev.append(("k", ("kept", k, shape), int(step.kept * size[step.output])))
    out_share = step.grads[0]
    if out_share:  # the activation's gradient, from its output: then the tape lets go of it
      ev.append(("a", ("gtmp", k), int(out_share * size[step.output])))
    ev.extend(("f", key) for key in made)
    gws: list[Any] = []
    if k in ws:  # the package's op: its gradients' passes, one after the other
      spans = tiling.window(index, step.output) or []
      gws = list(_plan.package_workspaces(tiling, step, spans, batch)[1:])
    elif step.cols[0] and not onednn:  # TensorFlow's own: the input's, then the kernel's
      spans = tiling.window(index, step.output) or []
      pixels = math.prod(b - a for a, b in spans)
      gws = _layers.grad_col_bytes(step.cols, pixels, batch, itemsize)
    _input_grads(step, k, size, needs, grads, dy, gws)
    _workspaces(ev, k, gws)
    grads.drop(dy)
    if out_share:
      ev.append(("f", ("gtmp", k)))
    ev.extend(("f", key) for key in read)
  for keys in grads.pending.values():
    for key in keys:
      grads.drop(key)
  ev.append(("f", 0))
  return ev


def _is_ws(key: Any) -> bool:
  return isinstance(key, tuple) and key[0] == "ws"


def _workspaces(ev: list[Event], k: int, gws: list[Any]) -> None:
  """The gradient passes of step `k` not yet run: each takes its workspace (`gws`, bytes
  or (bytes, bytes written); emptied) and frees it as it returns."""
  for j, nbytes in enumerate(gws):
    spec = nbytes if isinstance(nbytes, tuple) else (nbytes,)
    ev.extend([("a", ("gws", k, j), *spec), ("f", ("gws", k, j))])
  gws.clear()


def _input_grads(
  step: Any,
  k: int,
  size: dict[Any, int],
  needs: set[int],
  grads: _Grads,
  dy: Any,
  gws: list[Any],
) -> None:
  """The gradients step `k` sends to its inputs that get one, its output's gradient `dy` in
  hand: of the part it read (with a resize's scratch), scattered into a whole window where
  that part was a crop or a padded copy. A package op's gradient passes (`gws`) take their
  workspaces once the input's gradient is allocated."""
  ev = grads.ev
  _, in_share, through = step.grads
  for v in dict.fromkeys(step.inputs):
    if v not in needs or v not in size:
      continue
    read = ("pad", k) if ("pad", k) in size and v == step.inputs[0] else ("crop", k, v)
    part = size.get(read, size[v])
    if in_share:
      ev.append(("a", ("gtmp", k, v), int(in_share * part)))
      ev.append(("f", ("gtmp", k, v)))
    if through and read not in size:
      grads.send(v, dy)
      continue
    if not through:
      ev.append(("a", ("gpart", k, v), part))
      _workspaces(ev, k, gws)
    if read in size:  # scattered into the whole window
      ev.append(("a", ("gw", k, v), size[v]))
      if not through:
        ev.append(("f", ("gpart", k, v)))
      grads.send(v, ("gw", k, v))
    else:
      grads.send(v, ("gpart", k, v))


def train_pass_peak(
  tiling: _plan.Tiling, batch: int, itemsize: int, forward: bool = False, loss: int | None = None
) -> int:
  """The anonymous memory a training pass over `tiling` leaves the process holding
  (`_plan.simulate` of `train_tile_events`); with `forward`, after a streamed forward pass
  over the same tiles (a StreamingModel with a head runs one first). `loss`: as for
  `train_tile_events` (default `HEAD_LOSS` with `forward`, else `DENSE_LOSS`)."""
  pool = _plan.simulate(tiling, batch, itemsize) if forward else None
  if loss is None:
    loss = HEAD_LOSS if forward else DENSE_LOSS

  def events(tiling: _plan.Tiling, index: Sequence[int], batch: int, itemsize: int) -> Any:
    return train_tile_events(tiling, index, batch, itemsize, loss)

  return _plan.simulate(tiling, batch, itemsize, events, pool).grown


def forward_then_train_peak(tiling: _plan.Tiling, batch: int, itemsize: int) -> int:
  """`train_pass_peak` after a forward pass."""
  return train_pass_peak(tiling, batch, itemsize, forward=True)


def head_tiles_peak(tiling: _plan.Tiling, batch: int, itemsize: int) -> int:
  """`train_pass_peak` of a head streamed over the trunk's output: each tile's gradient
  comes from its share of a pooling, one tensor of the tile's size."""
  return train_pass_peak(tiling, batch, itemsize, loss=HEAD_LOSS)


def step_peak(training: bool, forward: bool) -> Any:
  """The pass function (`plan_for`'s `peak`) of a StreamingModel's step: None (the forward
  pass, `_plan.pass_peak`) unless `training`; with `forward`, a head's step, which runs
  the trunk forward over every tile before the tiles' backward passes."""
  if not training:
    return None
  return forward_then_train_peak if forward else train_pass_peak
