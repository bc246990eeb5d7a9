"""The model command line's total --memory-limit against the memory the command takes: a
U-Net (two levels, 32 and 64 channels) over a 4096^2 x 3 float32 zarr slide into zarr, at
each limit. The command runs as a child process; a thread samples its RssAnon every 5 ms;
measured is the peak's growth over the RssAnon when the command prints its plan (model
loaded, slide opened, before any tile runs).

  python -m benchmarks.cpu.cli_memory [--size N] [--limits 256MiB 1GiB] [--out DIR]

Writes DIR/cli_memory.json.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks import measure

MiB = 1 << 20


def unet(keras):
  L = keras.layers
  x = inp = keras.Input((None, None, 3))
  a = L.Conv2D(32, 3, padding="same", activation="relu")(x)
  a = L.Conv2D(32, 3, padding="same", activation="relu")(a)
  b = L.Conv2D(64, 3, padding="same", activation="relu")(L.MaxPooling2D()(a))
  b = L.Conv2D(64, 3, padding="same", activation="relu")(b)
  x = L.Concatenate()([a, L.UpSampling2D()(b)])
  x = L.Conv2D(32, 3, padding="same", activation="relu")(x)
  return keras.Model(inp, L.Conv2D(2, 1)(x))


def _rss_anon(pid):
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("RssAnon:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return 0


def run_command(args, env):
  """(peak RssAnon growth after the plan is printed, the printed lines, exit code)."""
  proc = subprocess.Popen(
    args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
  )
  state = {"base": None, "peak": 0}
  done = threading.Event()

  def sample():
    while not done.is_set():
      rss = _rss_anon(proc.pid)
      if state["base"] is not None:
        state["peak"] = max(state["peak"], rss)
      time.sleep(0.005)

  thread = threading.Thread(target=sample, daemon=True)
  thread.start()
  lines = []
  for line in proc.stdout:
    lines.append(line.rstrip())
    if line.startswith("memory:") and state["base"] is None:
      state["base"] = _rss_anon(proc.pid)
  code = proc.wait()
  done.set()
  thread.join()
  return state["peak"] - (state["base"] or 0), lines, code


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=4096)
  parser.add_argument("--limits", nargs="*", default=["256MiB", "512MiB", "1GiB"])
  parser.add_argument("--out", default=measure.RESULTS_DIR)
  args = parser.parse_args(argv)

  import keras
  import numpy as np
  import zarr

  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    model_path = os.path.join(tmp, "unet.keras")
    unet(keras).save(model_path)
    slide = zarr.open(
      os.path.join(tmp, "slide.zarr"), mode="w", shape=(args.size, args.size, 3),
      chunks=(1024, 1024, 3), dtype="float32",
    )  # fmt: skip
    for row in range(0, args.size, 1024):
      rng = np.random.default_rng(row)
      slide[row : row + 1024] = rng.random((min(1024, args.size - row), args.size, 3), "float32")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    for limit in args.limits:
      out = os.path.join(tmp, f"out_{limit}.zarr")
      command = [sys.executable, "-m", "tf_largeconv", "model", model_path]
      command += [os.path.join(tmp, "slide.zarr"), out, "--memory-limit", limit]
      grown, lines, code = run_command(command, env)
      planned = next((line for line in lines if line.startswith("memory:")), "")
      if code != 0:
        print(f"{limit}: the command failed ({code}):\n" + "\n".join(lines[-20:]))
        continue
      limit_bytes = int(limit[:-3]) * (MiB if limit.endswith("MiB") else 1024 * MiB)
      held = grown <= limit_bytes
      rows.append(dict(limit=limit, measured=grown, held=held, plan=planned))
      verdict = "held" if held else "EXCEEDED"
      print(f"--memory-limit {limit}: grew {grown / MiB:.0f} MiB ({verdict}); {planned}")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "cli_memory.json"), "w") as f:
    json.dump(dict(size=args.size, rows=rows), f, indent=1)
  return 0


if __name__ == "__main__":
  main()
