"""Command line: run a saved Keras model over a slide, tile by tile, into a zarr array,
resumably. Reached through the slide command when its first argument is a `.keras` file:

  python -m tf_largeconv.dask MODEL.keras INPUT OUTPUT [--tile N] [--memory-limit MIB]
      [--up-to LAYER] [--scheduler ADDRESS] [--resume | --overwrite] ...
"""

from __future__ import annotations

import argparse
import hashlib
import os
from typing import Any

DESCRIPTION = """\
Run a Keras model (a .keras file) over a slide too large for the model's activations, and
write its output as a zarr array. The model runs tile by tile; each tile reads only the
part of the slide it needs, and the result equals running the model on the whole slide at
once (up to float rounding).

What goes in:
  MODEL   a Keras 3 model saved with model.save('MODEL.keras'), channels last, taking
          images of any size: (batch, height, width, channels). Its layers must be ones
          tf_largeconv.stream can run on tiles (convolutions, pooling, upsampling,
          normalization, merges, ...); the error names any that cannot.
  INPUT   the slide: a TIFF file, a zarr array or OME-Zarr image, or a .npy file, as for
          the convolution command (H x W x C, or H x W for a one-channel model).
          Integer pixels are converted to the model's input type.

What comes out:
  OUTPUT  a zarr directory holding the model's output for the slide, H' x W' x C' (the
          batch axis dropped), chunked by tile.

The run is recorded chunk by chunk inside OUTPUT: after an interruption, the same command
with --resume computes only the tiles not yet written.

Examples:
  python -m tf_largeconv.dask unet.keras slide.ome.zarr mask.zarr --tile 2048
  python -m tf_largeconv.dask net.keras slide.tif feat.zarr --scheduler tcp://10.0.0.5:8786
"""


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog="python -m tf_largeconv.dask MODEL.keras",
    description=DESCRIPTION,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument("model", metavar="MODEL.keras", help="the Keras model to run")
  p.add_argument("input", metavar="INPUT", help="slide to read: TIFF, zarr, OME-Zarr or .npy")
  p.add_argument("output", metavar="OUTPUT", help="zarr directory to write")
  p.add_argument(
    "--tile",
    type=int,
    metavar="N",
    help="input pixels per tile side (default: the largest within --memory-limit)",
  )
  p.add_argument(
    "--memory-limit",
    type=float,
    default=1024,
    metavar="MIB",
    help="memory one tile may hold, in MiB (default 1024); sets the tile size",
  )
  p.add_argument("--up-to", metavar="LAYER", help="run the model up to this layer's output")
  p.add_argument(
    "--chunk", type=int, default=2048, metavar="N", help="slide rows and columns read at once"
  )
  p.add_argument("--level", type=int, default=0, help="pyramid level to read (default 0)")
  p.add_argument(
    "--channels-first", action="store_true", help="a 3-D slide is C x H x W (default H x W x C)"
  )
  p.add_argument("--scheduler", metavar="ADDRESS", help="a dask.distributed scheduler")
  p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS")
  again = p.add_mutually_exclusive_group()
  again.add_argument("--resume", action="store_true", help="finish an interrupted run")
  again.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
  return p


def _digest(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def build(args: argparse.Namespace) -> tuple[Any, Any, dict]:
  """Loads the model, opens the slide and plans the run (nothing computed).

  Returns:
    (the lazy result, its StreamPlan, the fingerprint of what defines the output)."""
  import keras

  import tf_largeconv  # noqa: F401 (registers the package's layers for loading)
  import tf_largeconv.dask as ldask
  from tf_largeconv import stream
  from tf_largeconv.dask import _output

  if not os.path.isfile(args.model):
    raise FileNotFoundError(f"MODEL: no such file: {args.model}")
  if args.memory_limit <= 0 or args.chunk < 1 or (args.tile is not None and args.tile < 1):
    raise ValueError("--memory-limit, --chunk and --tile must be positive")
  try:
    model = keras.saving.load_model(args.model, compile=False)
  except Exception as e:  # any failure to read the file is the user's to fix
    raise ValueError(f"MODEL {args.model} could not be loaded: {type(e).__name__}: {e}") from e
  slide = ldask.open_slide(
    args.input, chunk=args.chunk, level=args.level, channels_first=args.channels_first
  )
  if args.channels_first and slide.ndim == 3:
    slide = slide.transpose(1, 2, 0)
  limit = int(args.memory_limit * 2**20)
  plan = stream.plan(model, slide, tile=args.tile, memory_limit=limit, up_to=args.up_to)
  lazy = stream.to_dask(model, slide, tile=plan.tile, up_to=args.up_to)
  fingerprint = {
    "model_sha256": _digest(args.model),
    "input_file": _output.file_signature(args.input),
    "level": args.level,
    "channels_first": args.channels_first,
    "tile": plan.tile,
    "up_to": args.up_to,
    "output": {"shape": list(lazy.shape), "chunks": [c[0] for c in lazy.chunks]},
  }
  return lazy, plan, fingerprint


def _identity(block: Any) -> Any:
  return block


def write(lazy: Any, output: str, fingerprint: dict, mode: str, client: Any, progress: Any) -> Any:
  """Computes `lazy` into the zarr array `output`, one recorded chunk per tile."""
  import zarr

  from tf_largeconv.dask import _record

  path = os.path.abspath(output)

  def create() -> None:
    zarr.create_array(
      path, shape=lazy.shape, chunks=tuple(c[0] for c in lazy.chunks), dtype=lazy.dtype
    )

  record = _record.open_output(path, fingerprint, mode, create, what=f"OUTPUT {output}")
  axes = tuple(range(lazy.ndim))
  sink = _record.ZarrSink(record, "", lazy.chunks, axes)
  tasks = {
    idx: (_record.run_chunk, sink, idx, _identity, (lazy.name,) + idx) for idx in sink.names()
  }
  return _record.run(lazy.__dask_graph__(), tasks, sink, client=client, progress=progress)


def main(argv: list[str] | None = None) -> int:
  from tf_largeconv.dask import _cli_common

  parser = _parser()
  args = parser.parse_args(argv)
  try:
    lazy, plan, fingerprint = build(args)
  except (ValueError, TypeError, FileNotFoundError, ImportError) as e:
    parser.error(str(e))
  print(f"{args.input} through {args.model}:\n{plan}", flush=True)
  client = _cli_common.connect(args.scheduler, args.timeout) if args.scheduler else None
  mode = "resume" if args.resume else ("overwrite" if args.overwrite else "new")
  try:
    report = write(lazy, args.output, fingerprint, mode, client, _cli_common.progress())
  except (ValueError, FileExistsError) as e:
    parser.error(str(e))
  except OSError as e:
    return _cli_common.write_failed(e, args.output, plan.tiles, "tiles")
  finally:
    if client is not None:
      client.close()
  _cli_common.print_summary(args.output, report)
  return 0
