"""What the command lines over slides share: reaching a dask scheduler, the progress line
and the closing summary of a resumable run."""

import os
import sys


def connect(address, timeout):
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


def progress():
  """Prints chunks done / total, rate and time left; on a terminal, on one line."""
  tty = sys.stdout.isatty()
  state = {"first": None, "shown": -1}

  def show(done, total, seconds):
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


def summary(output, report):
  mp = report.pixels / 1e6
  rate = mp / report.seconds if report.seconds else 0.0
  pyramid = (
    f"; pyramid levels in {report.pyramid_seconds:.1f} s"
    if getattr(report, "pyramid_seconds", 0)
    else ""
  )
  return (
    f"wrote {output}: {report.total} chunks: {report.computed} computed, {report.skipped} "
    f"already done (resumed), {report.recomputed} computed again (in flight when an earlier "
    f"run stopped), {report.retried} retried (a worker lost); {report.seconds:.1f} s, "
    f"{rate:.1f} MP/s (output megapixels computed per second){pyramid}"
  )


def write_failed(error, output, total, unit="chunks"):
  """Says that a write failed (a full disk, or another OSError), how much of the output is
  recorded and how to finish it; returns the command's exit status."""
  from tf_largeconv.dask import _record

  done = len(_record.Record(os.path.abspath(output)).done())
  what = "the disk is full" if _record.is_disk_full(error) else "a write failed"
  print(
    f"\nerror: {what}: {error}. {done} of {total} {unit} of {output} are written and "
    f"recorded; the failed ones are not. Fix the cause, then run the same command with "
    f"--resume to compute only the rest.",
    file=sys.stderr,
  )
  return 1


def print_summary(output, report):
  print(("\n" if sys.stdout.isatty() else "") + summary(output, report))
