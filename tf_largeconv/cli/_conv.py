"""`conv`: a slide convolved with a filter, chunk by chunk, into zarr or OME-Zarr."""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

from tf_largeconv.cli import _run
from tf_largeconv.cli import _text
from tf_largeconv.cli._options import Size
from tf_largeconv.cli._options import add_command
from tf_largeconv.cli._options import add_slide_paths
from tf_largeconv.cli._options import mib
from tf_largeconv.cli._options import positive

DEFAULT_TILE = 2048
_PIXEL_KINDS = "biuf"  # bool, signed and unsigned integers, floating point


def add(subparsers: Any, parent: argparse.ArgumentParser, prog: str | None) -> None:
  p = add_command(subparsers, "conv", prog, [parent])
  add_slide_paths(p)
  g = p.add_argument_group("the convolution")
  g.add_argument("--filter", required=True, metavar="FILTER.npy", help=_text.FILTER_HELP)
  g.add_argument(
    "--padding",
    default="same",
    type=str.lower,
    choices=("same", "valid"),
    help="same (default): output covers the whole slide, zeros assumed outside it; "
    "valid: only where the filter fits inside the slide",
  )
  g.add_argument("--strides", type=positive, default=1, metavar="N", help="keep every N-th "
                 "output row and column (default 1)")  # fmt: skip
  g.add_argument("--dilations", type=positive, default=1, metavar="N", help="spread the "
                 "filter taps N pixels apart (default 1)")  # fmt: skip
  g.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                 help="arithmetic and output type (default float32)")  # fmt: skip
  g.add_argument("--algorithm", default="auto", choices=("auto", "direct", "fft"),
                 help="the op's algorithm (default auto: the planner's choice)")  # fmt: skip
  g.add_argument(
    "--workspace-limit",
    type=Size("--workspace-limit"),
    metavar="SIZE",
    help="scratch memory per task (default 64MiB)",
  )
  g.add_argument("--chunk", dest="tile", type=positive, metavar="N", help="old spelling of --tile")
  p.set_defaults(run=run, parser=p)


def _slide(args: argparse.Namespace, chunk: int) -> Any:
  import tf_largeconv.dask as ldask

  slide = ldask.open_slide(
    args.input, chunk=chunk, level=args.level, channels_first=args.channels_first
  )
  if slide.dtype.kind not in _PIXEL_KINDS:
    raise _run.UsageError(
      f"INPUT {args.input} has pixels of type {slide.dtype}; the convolution takes integer "
      f"or floating-point pixels (converted to --dtype {args.dtype})"
    )
  return slide


def _filter(args: argparse.Namespace) -> Any:
  import numpy as np

  if not os.path.isfile(args.filter):
    raise _run.UsageError(f"--filter: no such file: {args.filter}")
  weights = np.load(args.filter)
  if weights.ndim not in (2, 4) or weights.dtype.kind not in _PIXEL_KINDS:
    raise _run.UsageError(
      f"--filter {args.filter} has shape {weights.shape} and type {weights.dtype}: it must "
      f"be h x w (each channel separately) or h x w x C x OUT, of numbers"
    )
  return weights


def build(args: argparse.Namespace) -> tuple[Any, Any, dict]:
  """Opens the slide and the filter and checks the convolution (no task runs).

  Returns:
    (the `_graph.Forward`, its output axes, the input's pixel size and units).
  """
  import numpy as np

  from tf_largeconv._problem import ConvProblem
  from tf_largeconv.dask import _graph
  from tf_largeconv.dask import _slides

  tile = args.tile or DEFAULT_TILE
  slide = _slide(args, -(-tile // args.strides) * args.strides)
  weights = _filter(args)
  dtype = np.dtype(args.dtype)
  slide = slide.astype(dtype) if slide.dtype != dtype else slide
  fmt = "NCHW" if args.channels_first else "NHWC"
  if slide.ndim == 3:
    x = slide[None]
  else:
    x = slide[None, None] if args.channels_first else slide[None, ..., None]
  # A 2-D filter convolves each channel separately: a depthwise problem, multiplier 1.
  per_channel = weights.ndim == 2
  build_problem = ConvProblem.depthwise if per_channel else ConvProblem.conv2d
  problem = build_problem(
    args.strides, args.padding.upper(), fmt, args.dilations, algorithm=args.algorithm,
    workspace_limit=args.workspace_limit,
  )  # fmt: skip
  if per_channel:
    channels = x.shape[fmt.index("C")]
    weights = np.broadcast_to(weights[:, :, None, None], weights.shape + (channels, 1))
  forward = _graph.Forward(x, np.ascontiguousarray(weights, dtype), problem)
  gray = slide.ndim == 2 and forward.filters.shape[3] == 1
  ome_out = _run.output_format(args) == "ome-zarr"
  axes = "HW" if gray else ("CHW" if ome_out or args.channels_first else "HWC")
  physical: dict = {}
  if _slides.is_ome_zarr(args.input):
    ome = _slides.ome_image(args.input, args.level)
    physical = dict(
      scale={d: ome.scale[d] for d in "yx"}, units={d: ome.units.get(d) for d in "yx"}
    )
  return forward, axes, physical


def run(args: argparse.Namespace) -> int:
  from tf_largeconv.dask import _output

  forward, axes, physical = build(args)
  memory = forward.task_memory()
  need = memory.total + memory.input_bytes
  layout = _output.Layout(forward.attrs["data_format"], forward.out_chunks, axes, "zarr")
  tasks = math.prod(len(c) for c in forward.out_chunks)
  print(
    f"{args.input}: output {'x'.join(map(str, layout.shape))} {args.dtype} in {tasks} chunks; "
    f"memory per task up to {mib(memory.total)} (window {mib(memory.window_bytes)} + output "
    f"{mib(memory.output_bytes)} + workspace {mib(memory.workspace_bytes)}), input "
    f"chunks held {mib(memory.input_bytes)}",
    flush=True,
  )
  client = _run.connect(args.scheduler, args.timeout) if args.scheduler else None
  try:
    limit = args.task_memory or _run.task_share(client)
    if limit is not None and need > limit:
      raise _run.UsageError(
        f"--tile {args.tile or DEFAULT_TILE}: the largest task needs {mib(need)} (its "
        f"window: the chunk plus the filter's reach of {mib(memory.window_bytes)}, its "
        f"output, workspace and inputs), more than the {mib(limit)} a task may use "
        f"(--task-memory). Use a smaller --tile (--chunk)"
      )
    workers, line = _run.in_flight(
      need, args.memory_limit, client, "its window, output, workspace and inputs"
    )
    print(f"memory: {line}", flush=True)
    fingerprint = {
      "input_file": _output.file_signature(args.input),
      "level": args.level,
      "channels_first": args.channels_first,
    }
    result = _output.conv_result(forward, physical.get("scale"))
    return _run.write(
      args, result, tasks, workers, client, output_axes=axes, units=physical.get("units"),
      fingerprint=fingerprint,
    )  # fmt: skip
  finally:
    if client is not None:
      client.close()
