"""What the slide commands share when they run: the exit codes, reaching a dask scheduler,
tasks in flight under a total memory limit, the progress line, and the write with its
closing summary."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

from tf_largeconv.cli._options import mib

# The command's exit status.
OK = 0  # done
FAILED = 1  # the run failed (a write failed, a task failed, no scheduler): --resume after
USAGE = 2  # bad arguments or input; nothing written
REFUSED = 3  # --resume refused: OUTPUT was written by another run, or has no record


class UsageError(Exception):
  """Bad arguments or input found after parsing: exit status USAGE."""


def connect(address: str, timeout: float) -> Any:
  """A distributed Client for `address`, or SystemExit(FAILED) with a clear message."""
  import distributed

  try:
    return distributed.Client(address, timeout=timeout, set_as_default=True)
  except (OSError, TimeoutError, ValueError) as e:
    print(
      f"error: --scheduler {address}: could not reach a dask scheduler there within "
      f"{timeout:g} s ({type(e).__name__}: {e}). Check the address (e.g. "
      f"tcp://HOST:8786, printed by `dask scheduler`), or leave --scheduler out to run on "
      f"this machine.",
      file=sys.stderr,
    )
    raise SystemExit(FAILED) from None


def slots(client: Any) -> int:
  """Tasks that run at once: the threads of dask's threaded scheduler (dask's num_workers
  setting where one is made, else this machine's cores), or the cluster's worker threads."""
  if client is None:
    import dask

    return int(dask.config.get("num_workers", None) or os.cpu_count() or 1)
  return sum(w["nthreads"] for w in client.scheduler_info()["workers"].values()) or 1


def task_share(client: Any) -> int | None:
  """Bytes one task may use by default: the smallest share of a worker's memory limit per
  thread, or of this machine's available memory per core."""
  if client is None:
    import psutil

    return psutil.virtual_memory().available // (os.cpu_count() or 1)
  workers = client.scheduler_info()["workers"].values()
  shares = [w["memory_limit"] // max(w["nthreads"], 1) for w in workers if w.get("memory_limit")]
  return min(shares) if shares else None


def in_flight(need: int, total: int | None, client: Any, what: str) -> tuple[int, str]:
  """How many tasks of `need` bytes each run at once so that together they fit `total`
  (None: no total), and the line that says so.

  Raises:
    UsageError: one task does not fit `total`, or a cluster's threads would exceed it
      (the command cannot lower a cluster's threads).
  """
  cores = slots(client)
  if total is None:
    return cores, f"{cores} tasks at once x up to {mib(need)} each"
  n = min(cores, total // need)
  if n < 1:
    raise UsageError(
      f"--memory-limit {mib(total)}: one task needs up to {mib(need)} ({what}); use a "
      f"smaller --tile, or a larger --memory-limit"
    )
  if client is not None and n < cores:
    raise UsageError(
      f"--memory-limit {mib(total)}: the cluster runs {cores} tasks at once, up to "
      f"{mib(need)} each ({mib(cores * need)} in all); start its workers with fewer "
      f"threads, use a smaller --tile, or a larger --memory-limit"
    )
  line = f"{n} task{'s' * (n != 1)} at once x up to {mib(need)} each = {mib(n * need)}"
  line += f", within --memory-limit {mib(total)}"
  if n < cores:
    line += f" (lowered from {cores}, the threads this machine would run, to fit it)"
  return n, line


def progress() -> Any:
  """Prints chunks done / total, rate and time left; on a terminal, on one line."""
  tty = sys.stdout.isatty()
  state: dict[str, Any] = {"first": None, "shown": -1}

  def show(done: int, total: int, seconds: float) -> None:
    if state["first"] is None:
      state["first"] = (done, seconds)
    if done == state["shown"] and done < total:
      return
    state["shown"] = done
    d0, s0 = state["first"]
    rate = (done - d0) / (seconds - s0) if seconds > s0 and done > d0 else 0.0
    left = f"{(total - done) / rate:.0f} s" if rate else "?"
    line = (
      f"chunks {done}/{total} ({100 * done // max(total, 1)}%), {rate:.2f} chunks/s, "
      f"time left {left}"
    )
    print(("\r" + line) if tty else line, end="" if tty else "\n", flush=True)

  return show


def summary(output: str, report: Any) -> str:
  mp = report.pixels / 1e6
  rate = mp / report.seconds if report.seconds else 0.0
  pyramid = f"; pyramid levels in {report.pyramid_seconds:.1f} s" if report.pyramid_seconds else ""
  return (
    f"wrote {output}: {report.total} chunks: {report.computed} computed, {report.skipped} "
    f"already done (resumed), {report.recomputed} computed again (in flight when an earlier "
    f"run stopped), {report.retried} retried (a worker lost); {report.seconds:.1f} s, "
    f"{rate:.1f} MP/s (output megapixels computed per second){pyramid}"
  )


def _failed(error: BaseException, output: str, total: int) -> int:
  """Says that the run failed (a full disk, another OSError, a task's error), how much of
  the output is recorded and how to finish it; returns FAILED."""
  from tf_largeconv.dask import _record

  done = len(_record.Record(os.path.abspath(output)).done())
  if _record.is_disk_full(error):
    what = "the disk is full"
  elif isinstance(error, OSError):
    what = "a write failed"
  else:
    what = f"a task failed ({type(error).__name__})"
  print(
    f"\nerror: {what}: {error}. {done} of {total} chunks of {output} are written and "
    f"recorded; the failed ones are not. Fix the cause, then run the same command with "
    f"--resume to compute only the rest.",
    file=sys.stderr,
  )
  return FAILED


def output_format(args: Any) -> str:
  """--format, or ome-zarr for an OUTPUT ending in .ome.zarr, else zarr."""
  return args.format or ("ome-zarr" if args.output.rstrip("/").endswith(".ome.zarr") else "zarr")


def write(args: Any, result: Any, total: int, workers: int, client: Any, **options: Any) -> int:
  """Writes `result` (an `_output.Result`) into args.output with `workers` tasks at once;
  prints the summary and returns the exit status."""
  import dask

  from tf_largeconv.dask import _output
  from tf_largeconv.dask import _record

  mode = "resume" if args.resume else ("overwrite" if args.overwrite else "new")
  fmt = output_format(args)
  limit = dask.config.set(num_workers=workers) if client is None else contextlib.nullcontext()
  try:
    with limit:
      report = _output.write_result(
        result, args.output, fmt=fmt, levels=args.levels, ngff_version=args.ngff_version,
        mode=mode, client=client, progress=progress(), **options,
      )  # fmt: skip
  except (_record.FingerprintMismatch, _record.NoRecord) as e:
    print(f"error: --resume refused: {e}", file=sys.stderr)
    return REFUSED
  except (ValueError, TypeError, FileExistsError) as e:
    raise UsageError(str(e)) from e
  except Exception as e:  # a chunk's write or computation: recorded chunks stay
    return _failed(e, args.output, total)
  print(("\n" if sys.stdout.isatty() else "") + summary(args.output, report))
  return OK
