"""Command line: convolve a slide on disk with a filter, chunk by chunk, into a zarr array.

  python -m tf_largeconv.dask INPUT OUTPUT --filter FILTER.npy [--padding same]
      [--strides N] [--scheduler ADDRESS] [--chunk N] ...

Run with --help for the full description.
"""

import argparse
import math
import os
import shutil
import sys
import time

DESCRIPTION = """\
Convolve a slide (a whole-slide image, a mosaic: any image larger than memory) with a
filter, and write the result as a zarr array. The slide is read and convolved piece by
piece ("chunks" of --chunk x --chunk pixels), so it never has to fit in memory; the
result is exactly what convolving the whole image at once would give.

What goes in:
  INPUT   the slide: a TIFF file (.tif .tiff .svs .ndpi ...; the full-resolution level
          unless --level), a zarr array (a directory; for an OME-Zarr group, its level 0)
          or a numpy .npy file.
            2-D array, H x W:      a grayscale slide (one channel).
            3-D array, H x W x C:  C channels, e.g. RGB (C x H x W with --channels-first).
          Integer pixels (e.g. 8-bit RGB) are converted to float32 (see --dtype).
  FILTER  a numpy .npy file (numpy.save) holding the filter weights:
            2-D, h x w:               applied to each channel separately; the output has
                                      as many channels as the slide.
            4-D, h x w x C x OUT:     a full convolution: C must be the slide's channels,
                                      OUT is the number of output channels.
          Each output pixel is the sum of filter x the h x w pixels around it (a
          correlation, as in TensorFlow: the filter is not flipped).

What comes out:
  OUTPUT  a zarr directory holding an array of float32 (or --dtype): H' x W' for a
          grayscale slide and a 2-D filter, otherwise H' x W' x OUT (OUT x H' x W' with
          --channels-first). With --padding same, H' = ceil(H / stride), W' likewise;
          with valid, H' = floor((H - h) / stride) + 1 (the filter stays inside).

Internally a slide is a 4-D array in TensorFlow's NHWC layout: H x W becomes
1 x H x W x 1, H x W x C becomes 1 x H x W x C (C x H x W: NCHW, 1 x C x H x W).

Examples:
  python -m tf_largeconv.dask slide.svs blurred.zarr --filter gauss101.npy
  python -m tf_largeconv.dask slide.tif out.zarr --filter f.npy --strides 4 \\
      --scheduler tcp://10.0.0.5:8786
"""

EPILOG = """\
Memory: each task holds its window (chunk + filter - 1 on each axis, times the channels),
its output chunk and at most --workspace-limit of scratch, plus the input chunks around it;
each process running tasks pays about 0.5 GiB once for TensorFlow. The line printed before
the run gives the numbers for your slide. Smaller --chunk: less memory per task, more tasks.

Without --scheduler the work runs on this machine, on all its cores. With --scheduler it
runs on a dask.distributed cluster (start one with `dask scheduler` and `dask worker
ADDRESS`); the workers must see INPUT and OUTPUT at the same paths (a shared disk).
"""

_DEFAULT_CHUNK = 2048


def _parser():
  p = argparse.ArgumentParser(
    prog="python -m tf_largeconv.dask",
    description=DESCRIPTION,
    epilog=EPILOG,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  p.add_argument("input", metavar="INPUT", help="slide to read: TIFF, zarr or .npy")
  p.add_argument("output", metavar="OUTPUT", help="zarr directory to write")
  p.add_argument(
    "--filter",
    required=True,
    metavar="FILTER.npy",
    help="filter weights, h x w or h x w x C x OUT (numpy .npy)",
  )
  p.add_argument(
    "--padding",
    default="same",
    type=str.lower,
    choices=("same", "valid"),
    help="same (default): output covers the whole slide, zeros assumed outside "
    "it; valid: only where the filter fits inside the slide",
  )
  p.add_argument(
    "--strides",
    type=int,
    default=1,
    metavar="N",
    help="keep every N-th output row and column (default 1)",
  )
  p.add_argument(
    "--dilations",
    type=int,
    default=1,
    metavar="N",
    help="spread the filter taps N pixels apart (default 1)",
  )
  p.add_argument(
    "--chunk",
    type=int,
    default=_DEFAULT_CHUNK,
    metavar="N",
    help=f"rows and columns per task (default {_DEFAULT_CHUNK}; rounded up to "
    f"a multiple of --strides)",
  )
  p.add_argument(
    "--scheduler",
    metavar="ADDRESS",
    help="address of a running dask.distributed scheduler, e.g. "
    "tcp://10.0.0.5:8786 (default: run on this machine)",
  )
  p.add_argument(
    "--timeout",
    type=float,
    default=10.0,
    metavar="SECONDS",
    help="how long to try reaching the scheduler (default 10)",
  )
  p.add_argument(
    "--level", type=int, default=0, help="TIFF pyramid level to read (default 0, full resolution)"
  )
  p.add_argument(
    "--channels-first",
    action="store_true",
    help="a 3-D slide is C x H x W (default H x W x C); the output follows",
  )
  p.add_argument(
    "--dtype",
    default="float32",
    choices=("float32", "float64"),
    help="arithmetic and output type (default float32)",
  )
  p.add_argument(
    "--algorithm",
    default="auto",
    choices=("auto", "direct", "fft"),
    help="the op's algorithm (default auto: the planner's choice)",
  )
  p.add_argument(
    "--workspace-limit",
    type=float,
    default=None,
    metavar="MiB",
    help="scratch memory per task in MiB (default 64)",
  )
  p.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
  return p


def _connect(address, timeout):
  """A distributed Client for `address`, or SystemExit with a clear message."""
  import distributed

  try:
    return distributed.Client(address, timeout=timeout, set_as_default=True)
  except (OSError, TimeoutError, ValueError) as e:
    raise SystemExit(
      f"error: --scheduler {address}: could not reach a dask scheduler there within "
      f"{timeout:g} s ({type(e).__name__}: {e}). Check the address (e.g. "
      f"tcp://HOST:8786, printed by `dask scheduler`), or leave --scheduler out to run on "
      f"this machine."
    ) from None


def _mib(n):
  return f"{n / 2**20:.1f} MiB"


def build(args):
  """Opens the slide and the filter and builds the lazy result (no task runs).

  Returns:
    (result to write: 2-D or 3-D dask array, TaskMemory, number of tasks).
  """
  import numpy as np

  import tf_largeconv.dask as ldask

  if args.strides < 1 or args.dilations < 1 or args.chunk < 1:
    raise ValueError("--strides, --dilations and --chunk must be positive")
  chunk = -(-args.chunk // args.strides) * args.strides
  slide = ldask.open_slide(
    args.input, chunk=chunk, level=args.level, channels_first=args.channels_first
  )
  if not os.path.isfile(args.filter):
    raise FileNotFoundError(f"no such filter file: {args.filter}")
  weights = np.load(args.filter)
  if weights.ndim not in (2, 4):
    raise ValueError(
      f"--filter {args.filter} has shape {weights.shape}: it must be h x w "
      f"(each channel separately) or h x w x C x OUT"
    )
  dtype = np.dtype(args.dtype)
  if slide.dtype != dtype:
    slide = slide.astype(dtype)
  fmt = "NCHW" if args.channels_first else "NHWC"
  x = (
    slide[None]
    if slide.ndim == 3
    else (slide[None, None] if args.channels_first else slide[None, ..., None])
  )
  limit = None if args.workspace_limit is None else int(args.workspace_limit * 2**20)
  kwargs = dict(
    strides=args.strides,
    padding=args.padding.upper(),
    data_format=fmt,
    dilations=args.dilations,
    algorithm=args.algorithm,
    workspace_limit=limit,
  )
  if weights.ndim == 2:
    channels = x.shape[1 if args.channels_first else 3]
    w = np.broadcast_to(weights[:, :, None, None], weights.shape + (channels, 1))
    y = ldask.depthwise_conv2d(x, np.ascontiguousarray(w), **kwargs)
    memory = ldask.task_memory(x, w.reshape(w.shape[0], w.shape[1], 1, channels), **kwargs)
  else:
    y = ldask.conv2d(x, weights, **kwargs)
    memory = ldask.task_memory(x, weights, **kwargs)
  y = y[0]
  if slide.ndim == 2:
    y = y[0] if args.channels_first else y[..., 0]
  return y, memory, math.prod(len(c) for c in y.chunks)


def main(argv=None):
  parser = _parser()
  args = parser.parse_args(argv)
  if os.path.exists(args.output) and not args.overwrite:
    parser.error(f"{args.output} exists; pass --overwrite to replace it")
  try:
    y, memory, tasks = build(args)
  except (ValueError, TypeError, FileNotFoundError) as e:
    parser.error(str(e))
  print(
    f"{args.input}: output {'x'.join(map(str, y.shape))} {y.dtype} in {tasks} chunks of "
    f"up to {'x'.join(str(max(c)) for c in y.chunks)}; memory per task up to "
    f"{_mib(memory.total)} (window {_mib(memory.window_bytes)} + output "
    f"{_mib(memory.output_bytes)} + workspace {_mib(memory.workspace_bytes)}), input "
    f"chunks held {_mib(memory.input_bytes)}",
    flush=True,
  )
  client = _connect(args.scheduler, args.timeout) if args.scheduler else None
  if args.overwrite and os.path.isdir(args.output):
    shutil.rmtree(args.output)
  start = time.perf_counter()
  try:
    # Every chunk is written without zarr's check against the fill value first (its
    # default), which reads each chunk again and costs more than the write itself.
    store = y.to_zarr(args.output, compute=False, config={"write_empty_chunks": True})
    if client is None:
      from dask.diagnostics import ProgressBar

      with ProgressBar():
        store.compute()
    else:
      import distributed

      future = client.compute(store)
      distributed.progress(future)
      future.result()
  finally:
    if client is not None:
      client.close()
  print(f"\nwrote {args.output} in {time.perf_counter() - start:.1f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
