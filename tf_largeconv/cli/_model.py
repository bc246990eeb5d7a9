"""`model`: a saved Keras model run over a slide, tile by tile, into zarr or OME-Zarr."""

from __future__ import annotations

import argparse
import hashlib
import math
import os
from typing import Any

from tf_largeconv.cli import _run
from tf_largeconv.cli._options import Refused
from tf_largeconv.cli._options import add_command
from tf_largeconv.cli._options import add_slide_paths
from tf_largeconv.cli._options import mib
from tf_largeconv.cli._options import positive

DEFAULT_MEMORY_LIMIT = 2**30
DEFAULT_READ_CHUNK = 2048


def add(subparsers: Any, parent: argparse.ArgumentParser, prog: str | None) -> None:
  p = add_command(subparsers, "model", prog, [parent])
  p.add_argument(
    "model",
    metavar="MODEL.keras",
    help="the Keras model to run: a .keras or .h5 file, or a tf_keras SavedModel directory",
  )
  add_slide_paths(p)
  g = p.add_argument_group("the model")
  g.add_argument("--up-to", metavar="LAYER", help="run the model up to this layer's output")
  g.add_argument(
    "--read-chunk",
    type=positive,
    default=DEFAULT_READ_CHUNK,
    metavar="N",
    help=f"slide rows and columns read at once (default {DEFAULT_READ_CHUNK})",
  )
  g.add_argument(
    "--chunk",
    nargs="?",
    action=Refused,
    help="the model command has --tile N (input pixels per task) and --read-chunk N "
    "(slide rows and columns read at once); --chunk of `python -m tf_largeconv.dask "
    "MODEL.keras` is --read-chunk",
  )
  p.set_defaults(run=run, parser=p)


def _digest(path: str) -> str:
  """SHA-256 of the model file, or of a SavedModel directory's files (names and contents)."""
  h = hashlib.sha256()
  files = [path]
  if os.path.isdir(path):
    found = (os.path.join(d, f) for d, _, names in os.walk(path) for f in names)
    files = sorted(found)
  for name in files:
    if name != path:
      h.update(os.path.relpath(name, path).encode() + b"\0")
    with open(name, "rb") as f:
      while block := f.read(1 << 20):
        h.update(block)
  return h.hexdigest()


MODEL_FORMS = "a .keras or .h5 file, or a SavedModel directory saved by tf_keras"


def _saved_model(path: str, name: str) -> Any:
  """The tf_keras model saved at directory `path`, as its Keras 3 twin (`stream._convert`)."""
  from tf_largeconv.stream import _convert

  if not os.path.isfile(os.path.join(path, "saved_model.pb")):
    raise _run.UsageError(
      f"{name} {path} is a directory without saved_model.pb; expected {MODEL_FORMS}"
    )
  try:
    import tf_keras
  except ImportError:
    raise _run.UsageError(
      f"{name} {path} is a SavedModel directory: loading it needs tf_keras (pip install tf_keras)"
    ) from None
  try:
    model = tf_keras.models.load_model(path, compile=False)
  except Exception as e:  # any failure to read the directory is the user's to fix
    raise _run.UsageError(
      f"{name} {path} could not be loaded as a tf_keras SavedModel: {type(e).__name__}: {e}"
    ) from e
  if not _convert.is_tf_keras(model):
    raise _run.UsageError(
      f"{name} {path} holds a SavedModel that is not a tf_keras model "
      f"({type(model).__name__}); expected {MODEL_FORMS}"
    )
  try:
    return _convert.keras3(model)
  except ValueError as e:
    raise _run.UsageError(f"{name} {path}: {e}") from e


def load_model(path: str, name: str = "MODEL") -> Any:
  """The Keras model saved at `path` (a .keras or .h5 file, or a tf_keras SavedModel
  directory; a tf_keras model as its Keras 3 twin), or a UsageError naming it as `name`."""
  import keras

  import tf_largeconv  # noqa: F401 (registers the package's layers for loading)
  from tf_largeconv.stream import _convert

  if os.path.isdir(path):
    return _saved_model(path, name)
  if not os.path.isfile(path):
    raise _run.UsageError(f"{name}: no such file or directory: {path}; expected {MODEL_FORMS}")
  try:
    if path.lower().endswith((".h5", ".hdf5")):
      return _convert.load_h5(path)
    return keras.saving.load_model(path, compile=False)
  except Exception as e:  # any failure to read the file is the user's to fix
    raise _run.UsageError(
      f"{name} {path} could not be loaded: {type(e).__name__}: {e}; expected {MODEL_FORMS}"
    ) from e


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
  """(the model, the slide as H x W x C or H x W)."""
  import tf_largeconv.dask as ldask

  model = load_model(args.model)
  slide = ldask.open_slide(
    args.input, chunk=args.read_chunk, level=args.level, channels_first=args.channels_first
  )
  if args.channels_first and slide.ndim == 3:
    slide = slide.transpose(1, 2, 0)
  return model, slide


def input_bytes(plan: Any, chunk: int, slide: Any) -> int:
  """The most a task holds of the slide: the read chunks its input window overlaps."""
  tiling, sides = plan.tiling, []
  for axis, bounds in enumerate(tiling.bounds):
    worst = 0
    for t in range(len(bounds)):
      a, b = tiling.ranges(axis, t)[0]
      worst = max(worst, ((b - 1) // chunk - a // chunk + 1) * chunk if b > a else 0)
    sides.append(min(worst, slide.shape[axis]))
  channels = slide.shape[2] if slide.ndim == 3 else 1
  return math.prod(sides) * channels * slide.dtype.itemsize


def plan(
  args: argparse.Namespace, model: Any, slide: Any, task_limit: int, fallbacks: Any = ()
) -> tuple[Any, int]:
  """The stream plan and what one task holds (the tile's memory at its worst and the read
  chunks of its input): --tile, or the largest tile whose task fits `task_limit`, else
  the first of the larger `fallbacks` (fewer tasks at once) that one fits."""
  from tf_largeconv import stream

  def planned(limit: int) -> tuple[Any, int]:
    p = stream.plan(
      model, slide, tile=args.tile, memory_limit=limit, up_to=args.up_to, stages=False
    )
    return p, p.worst_bytes + input_bytes(p, args.read_chunk, slide)

  found = None
  for limit in () if args.tile else (task_limit, *fallbacks):
    found = _largest_fitting(planned, limit)
    if found is not None:
      break
  p, need = found or planned(task_limit)
  if args.task_memory and need > args.task_memory:
    raise _run.UsageError(
      f"--tile {p.tile}: a task needs up to {mib(need)}, more than --task-memory "
      f"{mib(args.task_memory)}; use a smaller --tile, or leave it out"
    )
  return p, need


def _largest_fitting(planned: Any, task_limit: int) -> tuple[Any, int] | None:
  """`planned(limit)` (a plan and its task's bytes) for the largest tiles' limit whose task
  fits `task_limit`, by bisection; None where none does."""

  def fitting(limit: int) -> tuple[Any, int] | None:
    try:
      got = planned(limit)
    except ValueError:  # below one output pixel's step
      return None
    return got if got[1] <= task_limit else None

  best = fitting(task_limit)
  if best is not None:
    return best
  lo, hi = 0, task_limit  # no task fits at hi
  while hi - lo > max(1, task_limit // 256):
    mid = (lo + hi) // 2
    got = fitting(mid)
    if got is None:
      hi = mid
    else:
      best, lo = got, mid
  return best


def _physical(args: argparse.Namespace, p: Any) -> dict:
  """The output pixels' size and origin (y, x) and units, from an OME-Zarr input's: an
  output pixel stands for the block of input pixels it downsamples (or a part of one)."""
  from tf_largeconv.dask import _slides

  s, units = {"y": 1.0, "x": 1.0}, None
  if _slides.is_ome_zarr(args.input):
    ome = _slides.ome_image(args.input, args.level)
    s = {d: float(ome.scale[d]) for d in "yx"}
    units = {d: ome.units.get(d) for d in "yx"}
  factor = dict(zip("yx", (1 / float(f) for f in p.tiling.geometry.sink_scale)))
  scale = {d: s[d] * factor[d] for d in "yx"}
  translation = {d: s[d] * (factor[d] - 1) / 2 for d in "yx"}
  return dict(scale=scale, translation=translation, units=units)


def run(args: argparse.Namespace) -> int:
  from tf_largeconv import stream
  from tf_largeconv.dask import _output

  model, slide = _load(args)
  client = _run.connect(args.scheduler, args.timeout) if args.scheduler else None
  try:
    total = args.memory_limit or DEFAULT_MEMORY_LIMIT
    cores = _run.slots(client)
    # Fewer tasks at once (halved, down to one) where no task fits a share, as when a
    # task's read chunks alone exceed it.
    counts = sorted({max(1, cores >> k) for k in range(1, cores.bit_length() + 1)} - {cores})[::-1]
    fewer = () if args.task_memory or client else [total // n for n in counts]
    p, need = plan(args, model, slide, args.task_memory or total // cores, fewer)
    workers, line = _run.in_flight(need, total, client, "its tile and input")
    print(f"{args.input} through {args.model}:\n{p}\nmemory: {line}", flush=True)
    lazy = stream.to_dask(model, slide, tile=p.tile, up_to=args.up_to)
    source = "HWC" if lazy.ndim == 3 else "HW"
    ome = _run.output_format(args) == "ome-zarr"
    identity = {  # the input file itself: the caller's input_file (--read-chunk is free)
      "input": {"shape": list(slide.shape), "dtype": slide.dtype.name},
      "model_sha256": _digest(args.model),
      "tile": p.tile,
      "up_to": args.up_to,
    }
    physical = _physical(args, p)
    units = physical.pop("units")
    result = _output.array_result(lazy, source, identity, **physical)
    fingerprint = {
      "input_file": _output.file_signature(args.input),
      "level": args.level,
      "channels_first": args.channels_first,
    }
    axes = ("CHW" if source == "HWC" else "HW") if ome else source
    return _run.write(
      args, result, p.tiles, workers, client, output_axes=axes, units=units,
      fingerprint=fingerprint,
    )  # fmt: skip
  finally:
    if client is not None:
      client.close()
