"""Benchmark `workers`: StreamingModel training throughput with two worker processes under
MultiWorkerMirroredStrategy against one process, each process pinned to its own core.

  python -m benchmarks.cpu.workers [--size 256] [--per-worker 2] [--steps 6] [--out DIR]

Each process is pinned to one core (os.sched_setaffinity) with TensorFlow's intra- and
inter-op thread pools at 1 thread. One process trains a StreamingModel (a 5-layer
convolutional trunk streamed in tiles of size/2, a pooled classification head) with
`fit` on batches of --per-worker images of size x size x 3; two workers on 127.0.0.1 each
stream their own --per-worker images of every global batch of 2 x --per-worker. The first
step (tracing, building) is not timed; images per second count the other --steps steps,
from the end of the first step to the end of the last, on the slowest worker. Prints the
two rates and their ratio, and the share of a two-worker step that is not the worker's own
computation (its step time minus the one-process step time), and each run's CPU time over
wall time per step (below 1: the process waited for its core or for its peer), which say
what bounds the ratio when it falls short of 2. Writes DIR/bench_workers.json.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time

from benchmarks import measure

CHILD_TIMEOUT = 900  # seconds


def _child(core, index, workers, size, per_worker, steps):
  """One worker (or the single process): trains and prints its step end times as JSON."""
  os.sched_setaffinity(0, {core})
  import keras
  import numpy as np
  import tensorflow as tf

  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  strategy = tf.distribute.MultiWorkerMirroredStrategy() if workers > 1 else None
  from tf_largeconv import stream

  L = keras.layers
  rng = np.random.default_rng(0)
  batch = per_worker * workers
  x = rng.random((batch * (steps + 1), size, size, 3), dtype=np.float32)
  y = rng.integers(0, 2, len(x))

  def build():
    keras.utils.set_random_seed(1)
    inp = keras.Input((None, None, 3))
    t = inp
    for width, kernel in ((16, 7), (16, 5), (32, 5), (32, 3), (32, 3)):
      t = L.Conv2D(width, kernel, padding="same", activation="relu")(t)
    hin = keras.Input((None, None, 32))
    head = keras.Model(hin, L.Dense(2)(L.GlobalAveragePooling2D()(hin)))
    m = stream.StreamingModel(keras.Model(inp, t), head, tile=size // 2)
    m.compile(keras.optimizers.SGD(0.01), keras.losses.SparseCategoricalCrossentropy(True))
    return m

  if strategy is None:
    model = build()
  else:
    with strategy.scope():
      model = build()
  ends, cpu = [], []

  def step_end(batch, logs):
    ends.append(time.perf_counter())
    cpu.append(time.process_time())

  done = keras.callbacks.LambdaCallback(on_train_batch_end=step_end)
  model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[done])
  print(json.dumps({"index": index, "ends": ends, "cpu": cpu, "images_per_step": batch}))


def free_ports(n):
  """`n` ports on 127.0.0.1 that are free now (also the tests' worker clusters')."""
  socks = [socket.socket() for _ in range(n)]
  for s in socks:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in socks]
  for s in socks:
    s.close()
  return ports


def tf_config(ports, index):
  """The TF_CONFIG of worker `index` of a cluster of workers on `ports` (127.0.0.1)."""
  cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
  return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


def _run(workers, args):
  """Starts `workers` pinned processes and returns (images per second, seconds per step,
  the least share of its step's wall time a worker spent computing on its core)."""
  ports = free_ports(workers)
  procs = []
  try:
    for index in range(workers):
      env = {"TF_CPP_MIN_LOG_LEVEL": "3"}
      if workers > 1:
        env["TF_CONFIG"] = tf_config(ports, index)
      argv = [
        sys.executable,
        "-m",
        "benchmarks.cpu.workers",
        "--child",
        str(index % os.cpu_count()),
      ]
      argv += [str(index), str(workers), str(args.size), str(args.per_worker), str(args.steps)]
      procs.append(
        subprocess.Popen(
          argv,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
          env=measure.child_env(**env),
        )
      )
    outs = []
    for p in procs:
      out, err = p.communicate(timeout=CHILD_TIMEOUT)
      if p.returncode != 0:
        raise RuntimeError(f"worker exited with {p.returncode}: {err.strip()[-2000:]}")
      outs.append(json.loads(out.strip().splitlines()[-1]))
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.communicate()
  seconds = max(o["ends"][-1] - o["ends"][0] for o in outs)
  busy = min((o["cpu"][-1] - o["cpu"][0]) / (o["ends"][-1] - o["ends"][0]) for o in outs)
  return outs[0]["images_per_step"] * args.steps / seconds, seconds / args.steps, busy


def main():
  parser = argparse.ArgumentParser(
    description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument("--size", type=int, default=256, help="image side in pixels")
  parser.add_argument("--per-worker", type=int, default=2, help="images per worker per step")
  parser.add_argument("--steps", type=int, default=6, help="timed steps (after one untimed)")
  parser.add_argument("--out", default=measure.RESULTS_DIR, help="folder for bench_workers.json")
  parser.add_argument("--child", nargs=6, type=int, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    _child(*args.child)
    return
  if os.cpu_count() < 2:
    sys.exit("benchmark workers: needs two cores (one per worker process)")
  one, one_step, one_busy = _run(1, args)
  two, two_step, two_busy = _run(2, args)
  result = {
    "size": args.size,
    "per_worker": args.per_worker,
    "steps": args.steps,
    "one_process_images_per_s": one,
    "two_workers_images_per_s": two,
    "ratio": two / one,
    "one_process_step_s": one_step,
    "two_workers_step_s": two_step,
    # Each worker computes the same share as the single process; the rest of its step is
    # the all-reduce, the cross-worker synchronisation and what the other core's load costs.
    "two_workers_overhead_share": (two_step - one_step) / two_step,
    # CPU time over wall time of a step (the least over the workers): 1 where a process
    # had its core to itself and never waited; below 1, the step waited for its core (other
    # load) or for the other worker (the collectives).
    "one_process_busy": one_busy,
    "two_workers_busy": two_busy,
    "load_average": os.getloadavg(),
  }
  print(f"one process  {one:8.2f} images/s  ({one_step:.3f} s/step, busy {one_busy:.2f})")
  print(f"two workers  {two:8.2f} images/s  ({two_step:.3f} s/step, busy {two_busy:.2f})")
  print(f"ratio        {two / one:8.2f}  (target >= 1.6; load average {os.getloadavg()[0]:.1f})")
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "bench_workers.json"), "w") as f:
    json.dump(result, f, indent=1)


if __name__ == "__main__":
  main()
