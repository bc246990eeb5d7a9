"""Benchmark `stream` on the networks people bring: each streamed with the default memory
limit against the same model called untiled, alternating in one process.

  python -m benchmarks.cpu.stream_networks [--nets resnet50 unet efficientnetb0
      mobilenetv3small] [--resnet-size 2048] [--unet-size 4096] [--se-size 1024]
      [--repeats 2] [--copies] [--one-stage] [--profile NET] [--memory NET]
  (also: python -m benchmarks.cpu.stream --parts networks)

- resnet50: keras.applications.ResNet50 (random weights, no top) on a --resnet-size^2 x 3
  image; target: streamed <= 1.2x untiled.
- unet: a 3-level U-Net (3x3 convolutions of 8-32 channels, max pooling, nearest
  upsampling, skip concatenations) on --unet-size^2 x 3; target <= 1.1x.
- efficientnetb0, mobilenetv3small (no top; squeeze-excitation streamed in passes) on
  --se-size^2 x 3; target: streamed <= passes x untiled + 20%.

Each row: the best of --repeats timed runs of each (after one warm-up of each; the untiled
and streamed runs alternate so that a change in the machine's load reaches both), their
ratio, the plan's tiles, tile, passes and the share of the work recomputed in overlaps, and
the largest difference from the untiled output. With --copies, a third run streams with
each windowed layer padding a copy of its window (what the explicit padding replaced);
with --one-stage, one streams the network in one stage (`stages=False`), where `predict`
runs it in stages through disk (`stages` in the row: how many).
--profile NET prints where the streamed run of NET spends its time (cProfile, top
functions by own time). --memory NET: the peak RSS growth of NET's streamed run with
explicit padding and with padded copies, each in a fresh process. Timings on a loaded
machine are noisy: compare the ratios of one run. Writes DIR/bench_stream_networks.json.
"""

import argparse
import contextlib
import json
import os
import sys
import time

import numpy as np

from benchmarks import measure

NETS = ("resnet50", "unet", "efficientnetb0", "mobilenetv3small")
TARGET = {"resnet50": 1.2, "unet": 1.1}  # the SE networks: passes x untiled + 20%


def _randomize(model, seed=0):
  rng = np.random.default_rng(seed)
  for v in model.weights:
    shape = tuple(v.shape)
    if "variance" in v.path:
      value = rng.uniform(0.5, 2.0, shape)
    else:
      value = rng.normal(0, 1.0 / np.sqrt(max(np.prod(shape[:-1]), 1)), shape)
    v.assign(value.astype(np.float32))
  return model


def unet(channels=(8, 16, 32)):
  import keras

  L = keras.layers
  inp = keras.Input((None, None, 3))
  x, skips = inp, []
  for c in channels[:-1]:
    x = L.Conv2D(c, 3, padding="same", activation="relu")(x)
    x = L.Conv2D(c, 3, padding="same", activation="relu")(x)
    skips.append(x)
    x = L.MaxPooling2D(2)(x)
  x = L.Conv2D(channels[-1], 3, padding="same", activation="relu")(x)
  for c, skip in zip(reversed(channels[:-1]), reversed(skips)):
    x = L.Concatenate()([L.UpSampling2D(2)(x), skip])
    x = L.Conv2D(c, 3, padding="same", activation="relu")(x)
    x = L.Conv2D(c, 3, padding="same", activation="relu")(x)
  return _randomize(keras.Model(inp, L.Conv2D(2, 1)(x)))


def network(name):
  import keras

  if name == "unet":
    return unet()
  make = {
    "resnet50": keras.applications.ResNet50,
    "efficientnetb0": keras.applications.EfficientNetB0,
    "mobilenetv3small": keras.applications.MobileNetV3Small,
  }[name]
  return make(weights=None, include_top=False, input_shape=(None, None, 3))


@contextlib.contextmanager
def padded_copies():
  """Windowed layers stream by padding a copy of each window (no explicit padding)."""
  from tf_largeconv.stream import _windowed

  real = _windowed.explicit_call
  _windowed.explicit_call = lambda op, rank: None
  try:
    yield
  finally:
    _windowed.explicit_call = real


def _timed(fn):
  t0 = time.perf_counter()
  out = fn()
  return time.perf_counter() - t0, out


def run_net(name, size, repeats, copies, one_stage=False):
  from tf_largeconv import stream

  model = network(name)
  image = np.random.default_rng(1).standard_normal((1, size, size, 3)).astype(np.float32)
  p = stream.plan(model, image)
  runs = {
    "untiled": lambda: np.asarray(model(image, training=False)),
    "streamed": lambda: stream.predict(model, image),
  }
  if copies:

    def with_copies():
      with padded_copies():
        return stream.predict(model, image)

    runs["streamed, padded copies"] = with_copies
  if one_stage:
    runs["streamed, one stage"] = lambda: stream.predict(model, image, stages=False)
  best, outs = {}, {}
  for r in range(repeats + 1):  # the first round warms up
    for label, fn in runs.items():
      t, out = _timed(fn)
      outs[label] = out
      if r > 0:
        best[label] = min(best.get(label, float("inf")), t)
  ref = outs["untiled"]
  row = dict(
    size=size,
    seconds=best,
    tiles=p.tiles,
    tile=p.tile,
    passes=p.passes,
    stages=len(p.stages),
    recompute=p.recompute,
    max_rel_error=float(np.abs(outs["streamed"] - ref).max() / np.abs(ref).max()),
  )
  row["ratio"] = best["streamed"] / best["untiled"]
  if copies:
    row["copies_ratio"] = best["streamed, padded copies"] / best["untiled"]
  if one_stage:
    row["one_stage_ratio"] = best["streamed, one stage"] / best["untiled"]
  row["target"] = TARGET.get(name, 1.2 * p.passes)
  return row


def child_memory(name, size, copies):
  """In a fresh process: the peak RSS growth of one streamed run (after a warm-up on a
  small image), as JSON."""
  from tf_largeconv import stream

  model = network(name)
  image = np.random.default_rng(1).standard_normal((1, size, size, 3)).astype(np.float32)
  with padded_copies() if copies else contextlib.nullcontext():
    stream.predict(model, image[:, :256, :256])
    base = measure.reset_peak_rss()
    stream.predict(model, image)
  print(json.dumps(dict(peak_growth=measure.peak_rss() - base)))
  return 0


def memory(name, size):
  """Peak RSS growth of the streamed run with explicit padding and with padded copies,
  each in a fresh process."""
  args = ["-m", "benchmarks.cpu.stream_networks", "--size", str(size), "--child-memory", name]
  return {
    label: measure.run_child([*args, *extra], timeout=1800).get("peak_growth")
    for label, extra in (("explicit padding", []), ("padded copies", ["--copies"]))
  }


def profile(name, size, top=20):
  import cProfile
  import pstats

  from tf_largeconv import stream

  model = network(name)
  image = np.random.default_rng(1).standard_normal((1, size, size, 3)).astype(np.float32)
  stream.predict(model, image)  # warm-up
  prof = cProfile.Profile()
  prof.enable()
  stream.predict(model, image)
  prof.disable()
  pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--nets", nargs="*", choices=NETS, default=list(NETS))
  parser.add_argument("--resnet-size", type=int, default=2048)
  parser.add_argument("--unet-size", type=int, default=4096)
  parser.add_argument("--se-size", type=int, default=1024)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--copies", action="store_true")
  parser.add_argument("--one-stage", action="store_true")
  parser.add_argument("--profile", choices=NETS)
  parser.add_argument("--memory", choices=NETS)
  parser.add_argument("--out", default=measure.RESULTS_DIR)
  parser.add_argument("--child-memory", choices=NETS, help=argparse.SUPPRESS)
  parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child_memory:
    return child_memory(args.child_memory, args.size, args.copies)
  sizes = {"resnet50": args.resnet_size, "unet": args.unet_size}
  if args.memory:
    size = sizes.get(args.memory, args.se_size)
    for label, peak in memory(args.memory, size).items():
      print(f"{args.memory} {size}^2 streamed, {label}: peak RSS growth {peak / 2**20:.0f} MiB")
    return 0
  if args.profile:
    profile(args.profile, sizes.get(args.profile, args.se_size))
    return 0
  results = {}
  head = f"{'network':18s}{'size':>6s}{'untiled s':>10s}{'streamed s':>11s}{'ratio':>7s}"
  head += f"{'target':>8s}{'tiles':>6s}{'tile':>6s}{'passes':>7s}{'overlap':>8s}{'rel.err':>9s}"
  rows = []
  for name in args.nets:
    size = sizes.get(name, args.se_size)
    r = results[name] = run_net(name, size, args.repeats, args.copies, args.one_stage)
    s = r["seconds"]
    line = (
      f"{name:18s}{r['size']:6d}{s['untiled']:10.2f}{s['streamed']:11.2f}{r['ratio']:6.2f}x"
      f"{r['target']:7.2f}x{r['tiles']:6d}{r['tile']:6d}{r['passes']:7d}"
      f"{100 * r['recompute']:7.1f}%{r['max_rel_error']:9.1e}"
    )
    if args.copies:
      line += f"  (padded copies: {r['copies_ratio']:.2f}x)"
    if args.one_stage:
      line += f"  ({r['stages']} stages; one stage: {r['one_stage_ratio']:.2f}x)"
    rows.append(line)
    print(line if len(rows) > 1 else head + "\n" + line, flush=True)
  print(
    f"best of {args.repeats} alternating runs each, float32, {len(os.sched_getaffinity(0))} "
    "cores; overlap: work recomputed in overlaps, as a share of the untiled run's"
  )
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "bench_stream_networks.json"), "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
