"""Command line: convolve a slide on disk with a filter, chunk by chunk, into a zarr array
or an OME-Zarr image, resumably.

  python -m tf_largeconv.dask INPUT OUTPUT --filter FILTER.npy [--padding same]
      [--strides N] [--scheduler ADDRESS] [--chunk N] [--resume | --overwrite] ...

Run with --help for the full description.
"""

import argparse
import math
import os
import sys

DESCRIPTION = """\
Convolve a slide (a whole-slide image, a mosaic: any image larger than memory) with a
filter, and write the result as a zarr array or an OME-Zarr image. The slide is read and
convolved piece by piece ("chunks" of --chunk x --chunk pixels), so it never has to fit in
memory; the result is exactly what convolving the whole image at once would give. Each
output chunk is recorded when it is written, so a run that was stopped (killed, a machine
gone) continues with --resume where it stopped.

What goes in:
  INPUT   the slide: a TIFF file (.tif .tiff .svs .ndpi ...; the full-resolution level
          unless --level), an OME-Zarr image (NGFF 0.4 or 0.5: level --level, its axes
          and channel axis from its metadata), a zarr array (a directory) or a numpy .npy
          file.
            2-D array, H x W:      a grayscale slide (one channel).
            3-D array, H x W x C:  C channels, e.g. RGB (C x H x W with --channels-first).
          Integer pixels (e.g. 8-bit RGB) are converted to float32 (see --dtype); other
          pixel types (complex, text, ...) are refused.
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
          An OUTPUT ending in .ome.zarr (or --format ome-zarr) is an OME-Zarr image
          with axes c, y, x (y, x for one channel from a 2-D filter), a pyramid of
          --levels levels and the pixel size of the input's metadata times the stride;
          napari, QuPath and OMERO open it.
          Inside OUTPUT, .largeconv-record/ records the chunks written and what the run
          was (input, filter, options). An existing OUTPUT is an error unless --overwrite
          (start again) or --resume (compute only the chunks not recorded; refused if the
          input, filter or options differ from the run that wrote it).

Internally a slide is a 4-D array in TensorFlow's NHWC layout: H x W becomes
1 x H x W x 1, H x W x C becomes 1 x H x W x C (C x H x W: NCHW, 1 x C x H x W).

Examples:
  python -m tf_largeconv.dask slide.svs blurred.zarr --filter gauss101.npy
  python -m tf_largeconv.dask slide.tif out.zarr --filter f.npy --strides 4 \\
      --scheduler tcp://10.0.0.5:8786
  python -m tf_largeconv.dask slide.ome.zarr out.ome.zarr --filter f.npy --resume

A whole Keras network instead of one filter: give the saved model first,
  python -m tf_largeconv.dask MODEL.keras INPUT OUTPUT [--tile N] [--resume] ...
(python -m tf_largeconv.dask MODEL.keras --help for its options).
"""

EPILOG = """\
Memory: each task holds its window (chunk + filter - 1 on each axis, times the channels),
its output chunk and at most --workspace-limit of scratch, plus the input chunks around it;
each process running tasks pays about 0.5 GiB once for TensorFlow. The line printed before
the run gives the numbers for your slide. Smaller --chunk: less memory per task, more tasks.

A task larger than --max-task-memory (default: what one thread of a worker may use) is
refused before anything runs: use a smaller --chunk.

Without --scheduler the work runs on this machine, on all its cores. With --scheduler it
runs on a dask.distributed cluster (start one with `dask scheduler` and `dask worker
ADDRESS`); the workers must see INPUT and OUTPUT at the same paths (a shared disk). A
worker that dies has its chunks computed again by the others.

Progress: chunks done / total, rate and time left, then a summary: chunks computed,
already done (resumed), computed again (in flight when an earlier run stopped), retried
(their worker was lost); wall time; output megapixels per second. Exit status: 0 done,
1 the run failed (e.g. the disk is full: free space, then run again with --resume),
2 bad arguments or input.
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
    "--level",
    type=int,
    default=0,
    help="TIFF or OME-Zarr pyramid level to read (default 0, full resolution)",
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
  p.add_argument(
    "--format",
    choices=("zarr", "ome-zarr"),
    default=None,
    help="OUTPUT's format (default: ome-zarr if OUTPUT ends in .ome.zarr, else zarr)",
  )
  p.add_argument(
    "--levels",
    type=int,
    default=None,
    metavar="N",
    help="OME-Zarr pyramid levels, each half the size of the one before (default: until "
    "the longer side is at most 1024)",
  )
  p.add_argument(
    "--ngff-version",
    choices=("0.4", "0.5"),
    default="0.5",
    help="OME-Zarr version to write (default 0.5, zarr v3; 0.4 is zarr v2)",
  )
  p.add_argument(
    "--max-task-memory",
    type=float,
    default=None,
    metavar="MiB",
    help="refuse to run if one task needs more (default: a worker thread's share of the "
    "worker's memory limit, or of this machine's available memory)",
  )
  mode = p.add_mutually_exclusive_group()
  mode.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
  mode.add_argument(
    "--resume",
    action="store_true",
    help="finish an interrupted run into OUTPUT: compute only the chunks not recorded",
  )
  return p


def _mib(n):
  return f"{n / 2**20:.1f} MiB"


_PIXEL_KINDS = "biuf"  # bool, signed and unsigned integers, floating point


def build(args):
  """Opens the slide and the filter and checks the convolution (no task runs).

  Returns:
    (the conv2d_to_zarr arguments as a dict, TaskMemory, number of tasks, the output's
    shape, the input's OME metadata or None).
  """
  import numpy as np

  import tf_largeconv.dask as ldask
  from tf_largeconv.dask import _output
  from tf_largeconv.dask import _slides

  if args.strides < 1 or args.dilations < 1 or args.chunk < 1:
    raise ValueError("--strides, --dilations and --chunk must be positive")
  chunk = -(-args.chunk // args.strides) * args.strides
  slide = ldask.open_slide(
    args.input, chunk=chunk, level=args.level, channels_first=args.channels_first
  )
  if slide.dtype.kind not in _PIXEL_KINDS:
    raise TypeError(
      f"INPUT {args.input} has pixels of type {slide.dtype}; the convolution takes integer "
      f"or floating-point pixels (converted to --dtype {args.dtype})"
    )
  if not os.path.isfile(args.filter):
    raise FileNotFoundError(f"--filter: no such file: {args.filter}")
  weights = np.load(args.filter)
  if weights.ndim not in (2, 4) or weights.dtype.kind not in _PIXEL_KINDS:
    raise ValueError(
      f"--filter {args.filter} has shape {weights.shape} and type {weights.dtype}: it must "
      f"be h x w (each channel separately) or h x w x C x OUT, of numbers"
    )
  ome = _slides.ome_image(args.input, args.level) if _slides.is_ome_zarr(args.input) else None
  dtype = np.dtype(args.dtype)
  if slide.dtype != dtype:
    slide = slide.astype(dtype)
  channels_first = args.channels_first
  fmt = "NCHW" if channels_first else "NHWC"
  x = (
    slide[None]
    if slide.ndim == 3
    else (slide[None, None] if channels_first else slide[None, ..., None])
  )
  channels = x.shape[1 if channels_first else 3]
  if weights.ndim == 2:  # each channel separately: the grouped (depthwise) filter
    weights = np.ascontiguousarray(
      np.broadcast_to(weights[:, :, None, None], weights.shape + (1, channels))
    )
  output_format = args.format or (
    "ome-zarr" if args.output.rstrip("/").endswith(".ome.zarr") else "zarr"
  )
  gray = slide.ndim == 2 and weights.shape[3] == 1
  if output_format == "ome-zarr":
    axes = "HW" if gray else "CHW"
  else:
    axes = "HW" if gray else ("CHW" if channels_first else "HWC")
  limit = None if args.workspace_limit is None else int(args.workspace_limit * 2**20)
  conv = dict(
    input=x,
    filters=weights.astype(dtype),
    strides=args.strides,
    padding=args.padding.upper(),
    data_format=fmt,
    dilations=args.dilations,
    algorithm=args.algorithm,
    workspace_limit=limit,
  )
  memory = ldask.task_memory(**conv)
  y = ldask.conv2d(**conv)
  tasks = math.prod(len(c) for c in y.chunks)
  shape = tuple(y.shape[fmt.index(a)] for a in axes)
  write = dict(
    output_axes=axes,
    output_format=output_format,
    levels=args.levels,
    ngff_version=args.ngff_version,
    fingerprint={
      "input_file": _output.file_signature(args.input),
      "level": args.level,
      "channels_first": channels_first,
    },
  )
  if ome is not None:
    write.update(
      scale={d: ome.scale[d] for d in ("y", "x")},
      units={d: ome.units.get(d) for d in ("y", "x")},
    )
  return dict(conv, **write), memory, tasks, shape


def _memory_limit(client):
  """Bytes one task may use: the smallest share of a worker's memory limit per thread, or
  of this machine's available memory per core (dask's threaded scheduler)."""
  if client is None:
    import psutil

    return psutil.virtual_memory().available // (os.cpu_count() or 1)
  workers = client.scheduler_info()["workers"].values()
  shares = [w["memory_limit"] // max(w["nthreads"], 1) for w in workers if w.get("memory_limit")]
  return min(shares) if shares else None


def main(argv=None):
  from tf_largeconv.dask import _cli_common

  argv = sys.argv[1:] if argv is None else list(argv)
  if argv and argv[0].lower().endswith(".keras"):  # a Keras model over a slide
    from tf_largeconv.stream import _cli

    return _cli.main(argv)
  parser = _parser()
  args = parser.parse_args(argv)
  try:
    kwargs, memory, tasks, shape = build(args)
  except (ValueError, TypeError, FileNotFoundError, ImportError) as e:
    parser.error(str(e))
  print(
    f"{args.input}: output {'x'.join(map(str, shape))} {args.dtype} in {tasks} chunks; "
    f"memory per task up to {_mib(memory.total)} (window {_mib(memory.window_bytes)} + output "
    f"{_mib(memory.output_bytes)} + workspace {_mib(memory.workspace_bytes)}), input "
    f"chunks held {_mib(memory.input_bytes)}",
    flush=True,
  )
  client = _cli_common.connect(args.scheduler, args.timeout) if args.scheduler else None
  try:
    limit = (
      int(args.max_task_memory * 2**20)
      if args.max_task_memory is not None
      else _memory_limit(client)
    )
    need = memory.total + memory.input_bytes
    if limit is not None and need > limit:
      parser.error(
        f"--chunk {args.chunk}: the largest task needs {_mib(need)} (its window: the chunk "
        f"plus the filter's reach of {_mib(memory.window_bytes)}, its output, workspace and "
        f"inputs), more than the {_mib(limit)} a task may use (--max-task-memory). Use a "
        f"smaller --chunk"
      )
    import tf_largeconv.dask as ldask

    mode = dict(resume=args.resume, overwrite=args.overwrite)
    report = ldask.conv2d_to_zarr(
      output=args.output, client=client, progress=_cli_common.progress(), **mode, **kwargs
    )
  except (ValueError, TypeError, FileExistsError) as e:
    parser.error(str(e))
  except OSError as e:
    return _cli_common.write_failed(e, args.output, tasks)
  finally:
    if client is not None:
      client.close()
  _cli_common.print_summary(args.output, report)
  return 0


if __name__ == "__main__":
  sys.exit(main())
