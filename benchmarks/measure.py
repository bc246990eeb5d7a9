"""Timing and peak-memory helpers shared by the demo and the benchmarks (Linux /proc), and
the children they run each measurement in."""

import json
import os
import subprocess
import sys
import time

# The folder holding `benchmarks`: children find the benchmarks there wherever they start.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Where the CPU benchmarks write their tables and plots by default (the results kept in the
# repository), and their scratch data (the slide benchmark's zarr arrays; ignored by git).
RESULTS_DIR = os.path.join(REPO_ROOT, "benchmarks", "results", "cpu")
SCRATCH_DIR = os.path.join(REPO_ROOT, "benchmarks", "scratch")

# The op's budget for filter spectra kept between calls (cc/core/cpu/spectrum_cache.h), and
# the caller's own setting of it, which forward steps keep.
SPECTRUM_CACHE_ENV = "LARGECONV_SPECTRUM_CACHE_MIB"
_CALLERS_CACHE_SETTING = os.environ.get(SPECTRUM_CACHE_ENV)


def like_training_loop(mode):
  """Makes a timed step behave as in a training loop: there the filter changes every step,
  so the op never reuses filter spectra from an earlier call, while a benchmark's repeated
  step with fixed weights would. Training steps ("train" mode) run with the cache off;
  forward ("inference") steps run with the caller's setting (the default keeps spectra,
  as a model serving images would)."""
  if mode == "train":
    os.environ[SPECTRUM_CACHE_ENV] = "0"
  elif _CALLERS_CACHE_SETTING is None:
    os.environ.pop(SPECTRUM_CACHE_ENV, None)
  else:
    os.environ[SPECTRUM_CACHE_ENV] = _CALLERS_CACHE_SETTING


def _status_kib(field):
  with open("/proc/self/status", encoding="ascii") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  raise RuntimeError(f"{field} not found in /proc/self/status")


def reset_peak_rss():
  """Resets the process high-water mark to the current RSS; returns the RSS in bytes."""
  with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
    f.write("5")
  return _status_kib("VmRSS") * 1024


def peak_rss():
  """The process high-water mark (VmHWM) in bytes."""
  return _status_kib("VmHWM") * 1024


def measure(fn, repeats=3, seconds=0.0, max_repeats=200):
  """Runs fn once to warm up, then `repeats` times, and more (up to `max_repeats`) while the
  timed runs have taken less than `seconds`: a call of a few milliseconds needs many runs
  for its minimum to settle on a machine whose speed wanders.

  Returns:
    (min seconds over the timed runs, or the warm-up run's seconds where `repeats` is 0;
    peak RSS growth in bytes over the warm-up run).
  """
  base = reset_peak_rss()
  t0 = time.perf_counter()
  fn()
  first = time.perf_counter() - t0
  extra = max(peak_rss() - base, 0)
  best = first if repeats == 0 else float("inf")
  spent, runs = 0.0, 0
  while repeats > 0 and (runs < repeats or (spent < seconds and runs < max_repeats)):
    t0 = time.perf_counter()
    fn()
    took = time.perf_counter() - t0
    best, spent, runs = min(best, took), spent + took, runs + 1
  return best, extra


def pyplot():
  """matplotlib.pyplot on the file-only Agg backend, or None (with a note) when matplotlib
  is not installed; the benchmarks then skip their plots."""
  try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("matplotlib not installed: no plot written")
    return None
  return plt


def child_env(**env_vars):
  """This process's environment with `env_vars`, and REPO_ROOT last on PYTHONPATH: a child
  finds `benchmarks` wherever it starts, and a tf_largeconv earlier on the path (an installed
  copy) still comes first."""
  path = [os.environ.get("PYTHONPATH"), REPO_ROOT]
  return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p), **env_vars)


def run_child(args, timeout, **env_vars):
  """Runs `python <args>` in a fresh process whose last stdout line is JSON, with the
  extra environment variables given.

  Returns:
    The parsed JSON, or {"error": why} for a timeout or a failure (the last stderr line).
  """
  env = child_env(**{"TF_CPP_MIN_LOG_LEVEL": "3", "OPENBLAS_NUM_THREADS": "1", **env_vars})
  try:
    out = subprocess.run(
      [sys.executable] + list(args),
      capture_output=True,
      text=True,
      timeout=timeout,
      env=env,
      check=True,
    )
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout} s"}
  except subprocess.CalledProcessError as e:
    return {"error": e.stderr.strip().splitlines()[-1] if e.stderr.strip() else "failed"}
  return json.loads(out.stdout.strip().splitlines()[-1])
