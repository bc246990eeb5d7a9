"""Benchmark `slide`: a slide on disk larger than a dask.distributed cluster's memory,
convolved with a 101x101 filter by tf_largeconv.dask, against the baselines.

  python -m benchmarks.cpu.bench --cases slide [--size 34000] [--chunk 4096] [--out DIR]

Writes a float32 zarr slide of size x size (34000^2: 4.3 GiB) to --dir (kept for later runs
of the same size and chunk with --keep-slide), starts a LocalCluster of --workers processes
x 1 thread with --memory-limit each (default 2 x 2 GiB: less than the slide), copies the
slide once untimed (see ZARR_OUT and the warm-up below), and measures, end to end (read
zarr, convolve SAME with stride 1, write zarr):

  tf_largeconv.dask.conv2d; a plain dask.array.map_overlap around tf_largeconv.conv2d (the
  baseline); a copy of the slide from zarr to zarr on the same cluster (the share of the
  time that is reading and writing zarr); dask_image.ndfilters.convolve on a --crop x
  --crop crop (a direct sum: the whole slide would take hours); and the in-memory op on a
  crop in this process (compute time per megapixel without dask).

For each: wall time, megapixels per second, the peak memory of each worker (distributed's
system monitor, sampled every 100 ms), spills and restarts; the output is checked against
the in-memory op on three bands. Prints a table; writes DIR/bench_slide.json.
"""

import argparse
import contextlib
import json
import os
import shutil
import sys
import time

import numpy as np

from benchmarks import measure

MiB = 2**20
GiB = 2**30
FILTER = 101
# Every zarr array is written uncompressed and without zarr's check of each chunk against
# the fill value (write_empty_chunks=False, zarr's default, reads every chunk once more
# before writing it, which takes many times as long as the write itself), as the command
# line writes; the same for every run, so the comparison is of the convolutions.
ZARR_OUT = dict(compressors=None, config={"write_empty_chunks": True})


def _slide_chunk(seed, block_info=None):
  info = block_info[None]
  rng = np.random.default_rng((seed,) + tuple(info["chunk-location"]))
  return rng.random(info["chunk-shape"], dtype=np.float32)


def _make_slide(path, size, chunk):
  """The slide, uniform random float32 in uncompressed zarr chunks of chunk x chunk, made
  chunk by chunk (never whole in memory); reused when it exists."""
  import dask
  import dask.array as da
  import zarr

  if os.path.isdir(path):
    z = zarr.open(path, mode="r")
    if z.shape == (size, size) and z.chunks == (chunk, chunk):
      return 0.0
    shutil.rmtree(path)
  start = time.perf_counter()
  grid = da.core.normalize_chunks((chunk, chunk), (size, size))
  slide = da.map_blocks(_slide_chunk, 0, chunks=grid, dtype=np.float32)
  with dask.config.set(scheduler="threads"):
    slide.to_zarr(path, **ZARR_OUT)
  return time.perf_counter() - start


def _worker_state(dask_worker):
  m = dask_worker.monitor.quantities
  return dict(
    pid=os.getpid(),
    limit=dask_worker.memory_manager.memory_limit,
    samples=list(zip(m["time"], m["memory"])),
    spilled=dask_worker.data.cumulative_metrics.get(("disk-write", "count"), 0),
  )


@contextlib.contextmanager
def local_client(workers, memory_limit):
  """A Client of a LocalCluster of `workers` processes of 1 thread each, on 127.0.0.1 and
  without a dashboard, whose workers sample their memory every 100 ms (for
  _run_on_cluster's peaks)."""
  import dask
  import distributed

  with (
    dask.config.set({"distributed.admin.system-monitor.interval": "100ms"}),
    distributed.LocalCluster(
      n_workers=workers,
      threads_per_worker=1,
      memory_limit=memory_limit,
      host="127.0.0.1",
      dashboard_address=None,
    ) as cluster,
    distributed.Client(cluster) as client,
  ):
    yield client


def _run_on_cluster(client, fn):
  """Runs fn() (which computes on the cluster); returns its seconds and, per worker, the
  peak memory over the run, its spills and whether it was restarted."""
  before = client.run(_worker_state)
  t0 = time.time()
  fn()
  t1 = time.time()
  after = client.run(_worker_state)
  workers = {}
  for address, state in after.items():
    peak = max((mem for t, mem in state["samples"] if t0 <= t <= t1 + 0.2), default=0)
    old = before.get(address)
    workers[address] = dict(
      peak_bytes=peak,
      limit_bytes=state["limit"],
      spills=state["spilled"] - (old["spilled"] if old else 0),
      restarted=old is None or old["pid"] != state["pid"],
    )
  lost = [a for a in before if a not in after]
  return dict(seconds=t1 - t0, workers=workers, lost_workers=lost)


def _check_output(out_path, slide_path, weights, size):
  """Largest error of the output, relative to the largest |x| * |w| sum, on three bands of
  rows (top edge, middle, bottom edge) against tf_largeconv.conv2d on the padded rows."""
  import zarr

  import tf_largeconv as lc

  out, src = zarr.open(out_path, mode="r"), zarr.open(slide_path, mode="r")
  half = FILTER // 2
  worst = 0.0
  for r0 in (0, size // 2 - 256, size - 512):
    r1 = r0 + 512
    a, b = r0 - half, r1 + half
    band = np.zeros((b - a, size + 2 * half), np.float32)
    band[max(-a, 0) : min(b, size) - a, half : half + size] = src[max(a, 0) : min(b, size)]
    want = lc.conv2d(band[None, :, :, None], weights, 1, "VALID").numpy()[0, :, :, 0]
    scale = lc.conv2d(np.abs(band)[None, :, :, None], np.abs(weights), 1, "VALID").numpy().max()
    worst = max(worst, float(np.abs(out[r0:r1] - want).max() / scale))
  return worst


def _in_memory(weights, crop):
  """Seconds per megapixel of tf_largeconv.conv2d on a crop x crop image in this process,
  with TensorFlow's default threads (all cores); min of 3 warm runs."""
  import tf_largeconv as lc

  x = np.random.default_rng(0).random((1, crop, crop, 1), dtype=np.float32)
  lc.conv2d(x, weights, 1, "SAME").numpy()
  best = float("inf")
  for _ in range(3):
    t = time.perf_counter()
    lc.conv2d(x, weights, 1, "SAME").numpy()
    best = min(best, time.perf_counter() - t)
  return best / (crop * crop / 1e6)


def _map_overlap_conv(block, weights):
  import tf_largeconv as lc

  return lc.conv2d(block[None, :, :, None], weights, 1, "SAME").numpy()[0, :, :, 0]


def _fmt_workers(r):
  peaks = [w["peak_bytes"] / GiB for w in r["workers"].values()]
  spills = int(sum(w["spills"] for w in r["workers"].values()))
  restarts = sum(w["restarted"] for w in r["workers"].values()) + len(r["lost_workers"])
  return f"{' / '.join(f'{p:.2f}' for p in peaks)} GiB", spills, restarts


def run(args):
  """Runs the benchmark (see the module docstring); returns the results dict."""
  import dask.array as da

  import tf_largeconv.dask as ldask

  if args.crop:
    try:
      import dask_image.ndfilters
    except ImportError:
      sys.exit(
        "the dask-image baseline needs dask-image: pip install dask-image, or the "
        "`bench` extra (or pass --crop 0 to skip it)"
      )
  os.makedirs(args.dir, exist_ok=True)
  size, chunk = args.size, args.chunk
  slide_path = os.path.join(args.dir, f"slide_{size}_{chunk}.zarr")
  made = _make_slide(slide_path, size, chunk)
  slide_bytes = size * size * 4
  mpix = size * size / 1e6
  rng = np.random.default_rng(1)
  weights = (rng.standard_normal((FILTER, FILTER, 1, 1)) / FILTER).astype(np.float32)
  results = dict(
    size=size,
    chunk=chunk,
    slide_gib=slide_bytes / GiB,
    filter=FILTER,
    workers=args.workers,
    memory_limit_gib=args.memory_limit / GiB,
    cores=len(os.sched_getaffinity(0)),
    slide_made_seconds=made,
  )
  print(
    f"slide {size}x{size} float32 ({slide_bytes / GiB:.2f} GiB, zarr chunks {chunk}^2, "
    f"uncompressed) at {slide_path}; cluster {args.workers} workers x 1 thread x "
    f"{args.memory_limit / GiB:.2f} GiB; filter {FILTER}x{FILTER}, SAME, stride 1",
    flush=True,
  )
  _header()

  def out_path(name):
    path = os.path.join(args.dir, f"out_{name}.zarr")
    shutil.rmtree(path, ignore_errors=True)
    return path

  with local_client(args.workers, args.memory_limit) as client:
    # Every worker imports TensorFlow and runs the op once before any timing.
    warm = ldask.conv2d(
      da.ones((1, 64, 64, 1), chunks=32, dtype=np.float32), weights[:9, :9], 1, "SAME"
    )
    client.compute(warm, sync=True)
    client.run(
      lambda: __import__("tf_largeconv").conv2d(
        np.ones((1, 8, 8, 1), np.float32), np.ones((3, 3, 1, 1), np.float32), 1, "SAME"
      )
    )
    x = da.from_zarr(slide_path)
    # A first copy, untimed, so that no timed run is the first to fault in the page cache
    # its output needs (a fresh virtual machine backs memory slowly at its first touch,
    # which would charge whichever run went first).
    path = out_path("warm")
    results["zarr_copy_first"] = _run_on_cluster(client, lambda: x.to_zarr(path, **ZARR_OUT))
    shutil.rmtree(path)
    _row("zarr copy (warm-up)", results["zarr_copy_first"], mpix)

    path = out_path("tf_largeconv_dask")
    y = ldask.conv2d(x[None, :, :, None], weights, 1, "SAME")[0, :, :, 0]
    ours = _run_on_cluster(client, lambda: y.to_zarr(path, **ZARR_OUT))
    ours["mpix_per_s"] = mpix / ours["seconds"]
    ours["max_relative_error"] = _check_output(path, slide_path, weights, size)
    shutil.rmtree(path)
    results["tf_largeconv.dask"] = ours
    _row("tf_largeconv.dask", ours, mpix)

    # The same convolution written chunk by chunk with the record that resumes it
    # (conv2d_to_zarr, what the command line runs).
    path = out_path("resumable")
    resumable = _run_on_cluster(
      client,
      lambda: ldask.conv2d_to_zarr(
        x[None, :, :, None], weights, 1, "SAME", path, output_axes="HW", compressors=None
      ),
    )
    resumable["mpix_per_s"] = mpix / resumable["seconds"]
    resumable["max_relative_error"] = _check_output(path, slide_path, weights, size)
    shutil.rmtree(path)
    results["conv2d_to_zarr"] = resumable
    _row("conv2d_to_zarr (resumable)", resumable, mpix)

    path = out_path("copy")
    copy = _run_on_cluster(client, lambda: x.to_zarr(path, **ZARR_OUT))
    shutil.rmtree(path)
    results["zarr_copy"] = copy
    _row("zarr copy (read + write)", copy, mpix)

    if not args.skip_map_overlap:
      path = out_path("map_overlap")
      half = FILTER // 2
      # meta given, so dask does not call the op on an empty block to infer it.
      z = x.map_overlap(
        _map_overlap_conv,
        depth=half,
        boundary=0,
        dtype=np.float32,
        meta=np.empty((0, 0), np.float32),
        weights=weights,
      )
      base = _run_on_cluster(client, lambda: z.to_zarr(path, **ZARR_OUT))
      base["mpix_per_s"] = mpix / base["seconds"]
      shutil.rmtree(path)
      results["map_overlap"] = base
      _row("map_overlap + conv2d", base, mpix)

    if args.crop:
      import dask_image.ndfilters

      crop = x[: args.crop, : args.crop].rechunk(args.crop // 2)
      # convolve flips the weights: flipped back, it is the same correlation as ours.
      di = dask_image.ndfilters.convolve(crop, weights[::-1, ::-1, 0, 0], mode="constant", cval=0.0)
      got = {}
      r = _run_on_cluster(client, lambda: got.setdefault("y", di.compute()))
      r["crop"] = args.crop
      r["mpix_per_s"] = args.crop**2 / 1e6 / r["seconds"]
      mine = ldask.conv2d(crop[None, :, :, None], weights, 1, "SAME")[0, :, :, 0].compute()
      r["max_abs_difference_to_ours"] = float(np.abs(got["y"] - mine).max())
      results["dask_image"] = r
      _row(f"dask-image ({args.crop}^2 crop)", r, mpix)
  results["in_memory_seconds_per_mpix"] = _in_memory(weights, args.in_memory_crop)
  results["in_memory_crop"] = args.in_memory_crop
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "bench_slide.json"), "w", encoding="ascii") as f:
    json.dump(results, f, indent=1)
  _report(results)
  print(f"wrote {os.path.join(args.out, 'bench_slide.json')}")
  if not args.keep_slide:
    shutil.rmtree(slide_path)
  return results


def _header():
  print(
    f"{'':26s}{'wall':>9s}{'MP/s':>9s}{'peak worker memory':>22s}{'spills':>8s}{'restarts':>10s}",
    flush=True,
  )


def _row(name, row, mpix):
  """One measured run's line of the table, printed as soon as it is measured."""
  peaks, spills, restarts = _fmt_workers(row)
  rate = row.get("mpix_per_s", mpix / row["seconds"])
  print(
    f"{name:26s}{row['seconds']:>8.1f}s{rate:>9.1f}{peaks:>22s}{spills:>8d}{restarts:>10d}",
    flush=True,
  )


def _report(r):
  mpix = r["size"] ** 2 / 1e6
  ours = r["tf_largeconv.dask"]
  print(
    f"output vs in-memory op: max error {ours['max_relative_error']:.1e} of the largest |x|*|w| sum"
  )
  print(
    f"reading + writing zarr (copy run): {r['zarr_copy']['seconds'] / ours['seconds']:.0%} "
    f"of tf_largeconv.dask's wall time"
  )
  per_mpix = ours["seconds"] / mpix
  print(
    f"time per megapixel: {per_mpix * 1e3:.1f} ms end to end, "
    f"{(ours['seconds'] - r['zarr_copy']['seconds']) / mpix * 1e3:.1f} ms without the "
    f"copy's time; in-memory op ({r['in_memory_crop']}^2, this process, all cores): "
    f"{r['in_memory_seconds_per_mpix'] * 1e3:.1f} ms"
  )
  if r.get("map_overlap"):
    print(f"speedup over map_overlap: {r['map_overlap']['seconds'] / ours['seconds']:.2f}x")
  if r.get("dask_image"):
    print(
      f"speedup over dask-image (MP/s): "
      f"{ours['mpix_per_s'] / r['dask_image']['mpix_per_s']:.0f}x; its result differs "
      f"from ours by at most {r['dask_image']['max_abs_difference_to_ours']:.1e}"
    )


def main(argv=None):
  p = argparse.ArgumentParser(
    prog="python -m benchmarks.cpu.bench --cases slide", description=__doc__.splitlines()[0]
  )
  p.add_argument("--size", type=int, default=34000, help="slide rows = columns")
  p.add_argument("--chunk", type=int, default=4096, help="zarr and dask chunk rows/columns")
  p.add_argument("--workers", type=int, default=2)
  p.add_argument("--memory-limit", type=float, default=2.0, help="GiB per worker")
  p.add_argument(
    "--crop", type=int, default=1024, help="dask-image's crop (rows = columns); 0 skips it"
  )
  p.add_argument("--in-memory-crop", type=int, default=4096)
  p.add_argument("--skip-map-overlap", action="store_true")
  p.add_argument(
    "--dir",
    default=os.path.join(measure.SCRATCH_DIR, "slide"),
    help="where the slide and the outputs are written (default: benchmarks/scratch/slide)",
  )
  p.add_argument("--keep-slide", action="store_true", help="keep the slide for later runs")
  p.add_argument(
    "--out",
    default=measure.RESULTS_DIR,
    help="where bench_slide.json goes (default: benchmarks/results/cpu)",
  )
  args = p.parse_args(argv)
  args.memory_limit = int(args.memory_limit * GiB)
  run(args)
  return 0


if __name__ == "__main__":
  sys.exit(main())
