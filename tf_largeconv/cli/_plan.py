"""`plan` (the op planner's plan for shapes, a model's stream plan) and `info`."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from tf_largeconv.cli import _run
from tf_largeconv.cli._options import Size
from tf_largeconv.cli._options import add_command
from tf_largeconv.cli._options import positive


class Ints:
  """argparse type of a shape or window: whole numbers separated by ',' or 'x'."""

  def __init__(self, low: int) -> None:
    self.low = low
    self.__name__ = "shape"

  def __call__(self, text: str) -> list[int]:
    parts = [p for p in re.split(r"[,x\s]+", text.strip().lower()) if p]
    try:
      values = [int(p) for p in parts]
    except ValueError:
      values = []
    if not values or min(values) < self.low:
      raise argparse.ArgumentTypeError(
        f"{text!r} is not a list of whole numbers of at least {self.low}, e.g. 1,4096,4096,3 "
        f"or 1x4096x4096x3"
      )
    return values


def add(subparsers: Any, prog: str | None) -> None:
  p = add_command(subparsers, "plan", prog and f"{prog} plan", [])
  op = p.add_argument_group("a convolution (the op planner)")
  op.add_argument("--input-shape", type=Ints(1), metavar="SHAPE", help="e.g. 1,4096,4096,3")
  op.add_argument("--filter-shape", type=Ints(1), metavar="SHAPE", help="e.g. 101,101,3,8")
  op.add_argument("--strides", type=Ints(1), default=[1], metavar="N[,N...]", help="default 1")
  op.add_argument("--dilations", type=Ints(1), default=[1], metavar="N[,N...]")
  op.add_argument("--padding", default="SAME", type=str.upper, choices=("SAME", "VALID"))
  op.add_argument("--data-format", default="NHWC", metavar="FORMAT", help="NHWC (default), NCHW")
  op.add_argument("--dtype", default="float32", help="float32 (default), float64, float16, ...")
  op.add_argument("--algorithm", default="auto", help="auto (default), direct, fft or tf")
  op.add_argument("--workspace-limit", type=Size("--workspace-limit"), metavar="SIZE")
  op.add_argument("--threads", type=positive, metavar="N", help="threads to plan for")
  st = p.add_argument_group("a Keras model (the stream plan)")
  st.add_argument("--model", metavar="MODEL.keras", help="a saved Keras model")
  st.add_argument("--image-shape", type=Ints(1), metavar="SHAPE", help="e.g. 4096,4096,3")
  st.add_argument("--tile", type=positive, metavar="N", help="input pixels per tile side")
  st.add_argument(
    "--task-memory",
    type=Size("--task-memory"),
    metavar="SIZE",
    help="the most one tile may hold; sets the tile when --tile is not given (default 1GiB)",
  )
  st.add_argument("--up-to", metavar="LAYER", help="stream the model up to this layer")
  p.set_defaults(run=run_plan, parser=p)
  i = add_command(subparsers, "info", prog and f"{prog} info", [])
  i.add_argument("--json", action="store_true", help="one JSON object instead of lines")
  i.set_defaults(run=run_info, parser=i)


def _op_plan(args: argparse.Namespace) -> Any:
  import tf_largeconv as lc

  if not (args.input_shape and args.filter_shape):
    raise _run.UsageError("plan: give --input-shape and --filter-shape together")
  window = [args.strides, args.dilations]
  strides, dilations = (v[0] if len(v) == 1 else v for v in window)
  return lc.plan(
    args.input_shape, args.filter_shape, strides, args.padding, args.data_format, dilations,
    args.dtype, algorithm=args.algorithm, workspace_limit=args.workspace_limit,
    num_threads=args.threads,
  )  # fmt: skip


def _stream_plan(args: argparse.Namespace) -> Any:
  from tf_largeconv import stream
  from tf_largeconv.cli import _model

  if not args.image_shape:
    raise _run.UsageError("plan: --model needs --image-shape (e.g. 4096,4096,3)")
  model = _model.load_model(args.model, "--model")
  shape = tuple(args.image_shape)
  batched = shape if len(shape) == len(model.inputs[0].shape) else (1, *shape)
  return stream.plan(
    model, batched, tile=args.tile, memory_limit=args.task_memory, up_to=args.up_to, stages=False
  )


def run_plan(args: argparse.Namespace) -> int:
  if not (args.input_shape or args.filter_shape or args.model):
    raise _run.UsageError("plan: give --input-shape and --filter-shape, or --model (or both)")
  if args.input_shape or args.filter_shape:
    print(_op_plan(args))
  if args.model:
    print(_stream_plan(args))
  return _run.OK


def run_info(args: argparse.Namespace) -> int:
  import tf_largeconv as lc

  found = lc.info()
  if args.json:
    print(json.dumps(found, indent=1, default=str))
  else:
    width = max(len(k) for k in found)
    for key, value in found.items():
      print(f"{key:<{width}}  {value}")
  return _run.OK
