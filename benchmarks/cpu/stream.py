"""Benchmark `stream`: a 10-layer network streamed tile by tile (tf_largeconv.stream)
against the same Keras model run untiled, in the same run.

  python -m benchmarks.cpu.bench --cases stream [--size 16384] [--speed-size 2048 4096]
      [--cluster-size 24576] [--parts speed memory cluster]

The network (`network()`): 3x3 convolutions of 16-32 channels, one stride-2 stage, a
31x31 depthwise convolution (LargeDepthwiseConv2D) with batch normalization on a residual
branch, a 3x3 depthwise and 1x1 convolutions; float32.

1. Speed, on images that fit (--speed-size^2 x 3, default 2048 and 4096): the untiled
   `model(image)` (as a numpy array) against
   `stream.predict` with the default memory limit and with 512-pixel tiles; best of 3 each,
   in one process, per megapixel, with the plan's recomputed share.
2. Memory, on a --size^2 x 3 float32 zarr slide (16384^2: 3 GiB) written to zarr, as a
   slide user runs it (`stream.predict(model, zarr_in, out=zarr_out)`), in a child process:
   its peak RSS (VmHWM) and wall time. The untiled model on the same slide is tried in a
   child whose address space is capped at the machine's memory (prlimit --as): what it
   needs is estimated from the layers' sizes, and what happens is shown. A band of the
   streamed output is checked against the untiled model on a crop.
3. Slides on a cluster: the network over a --cluster-size^2 x 3 zarr slide (24576^2:
   6.8 GiB in, 9 GiB out) on a LocalCluster of 2 workers x 2 GiB, by `stream.to_dask` into
   zarr: wall time, each worker's peak memory (distributed's monitor), spills and restarts,
   and a band checked against the in-process stream.
4. Training (StreamingModel, the network as a frozen-BN trunk + a pooling classifier head):
   one step (train_on_batch) streamed and untiled and the streamed forward alone on a
   --train-speed-size^2 image that fits; and one streamed step on a --train-size^2 x 3
   image (8192^2) in a child (peak RSS), with the untiled step tried under an address-space
   cap at the machine's memory.

5. Networks (`benchmarks.cpu.stream_networks`, also run alone): ResNet50, a U-Net,
   EfficientNetB0 and MobileNetV3Small streamed against untiled, alternating.

Prints a table; writes DIR/bench_stream.json. The slide is kept in benchmarks/scratch/.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

from benchmarks import measure

MiB, GiB = 2**20, 2**30
# The training trunk's last pooling (see training_model).
TRAIN_POOL = 4


def network():
  import keras

  from tf_largeconv import keras as lk

  L = keras.layers
  inp = keras.Input((None, None, 3))
  x = L.Conv2D(16, 3, padding="same", activation="relu")(inp)
  x = L.Conv2D(16, 3, padding="same", activation="relu")(x)
  x = L.Conv2D(32, 3, strides=2, padding="same", activation="relu")(x)
  y = lk.LargeDepthwiseConv2D(31, padding="same")(x)
  y = L.BatchNormalization()(y)
  y = L.Conv2D(32, 1, activation="relu")(y)
  x = L.Add()([x, y])
  x = L.Conv2D(32, 3, padding="same", activation="relu")(x)
  x = L.DepthwiseConv2D(3, padding="same")(x)
  x = L.Conv2D(16, 1, activation="relu")(x)
  x = L.Conv2D(16, 3, padding="same")(x)
  model = keras.Model(inp, x)
  rng = np.random.default_rng(0)
  for v in model.weights:
    scale = 1.0 / np.sqrt(max(np.prod(v.shape[:-1]), 1))
    value = (
      rng.uniform(0.5, 2.0, v.shape) if "variance" in v.path else rng.normal(0, scale, v.shape)
    )
    v.assign(value.astype(np.float32))
  return model


def speed(size):
  from tf_largeconv import stream

  model = network()
  image = np.random.default_rng(1).standard_normal((1, size, size, 3)).astype(np.float32)
  rows = {}
  t, _ = measure.measure(lambda: np.asarray(model(image, training=False)), repeats=3)
  rows["untiled"] = dict(seconds=t)
  ref = model(image, training=False).numpy()
  for label, tile in (("streamed (default)", None), ("streamed, tile 512", 512)):
    p = stream.plan(model, image, tile=tile)
    t, _ = measure.measure(lambda tile=tile: stream.predict(model, image, tile=tile), repeats=3)
    got = stream.predict(model, image, tile=tile)
    rows[label] = dict(
      seconds=t,
      tiles=p.tiles,
      tile=p.tile,
      recompute=p.recompute,
      max_rel_error=float(np.abs(got - ref).max() / np.abs(ref).max()),
    )
  megapixels = size * size / 1e6
  for r in rows.values():
    r["us_per_pixel"] = r["seconds"] / megapixels
    r["vs_untiled"] = r["seconds"] / rows["untiled"]["seconds"]
  return rows


def _slide(size, scratch):
  import zarr

  path = os.path.join(scratch, f"stream_slide_{size}.zarr")
  if not os.path.exists(os.path.join(path, "zarr.json")):
    z = zarr.create_array(
      path,
      overwrite=True,
      shape=(size, size, 3),
      chunks=(2048, 2048, 3),
      dtype="float32",
      compressors=None,
    )
    rng = np.random.default_rng(2)
    for r in range(0, size, 2048):
      z[r : r + 2048] = rng.standard_normal((min(2048, size - r), size, 3), dtype=np.float32)
  return path


def _child_streamed(size, scratch):
  """In a child: the streamed run from zarr to zarr; prints peak RSS and time as JSON."""
  import zarr

  from tf_largeconv import stream

  model = network()
  slide = zarr.open_array(_slide(size, scratch), mode="r")
  p = stream.plan(model, slide)
  out_path = os.path.join(scratch, f"stream_out_{size}.zarr")
  out = zarr.create_array(
    out_path,
    overwrite=True,
    shape=(*p.output_size, 16),
    chunks=(1024, 1024, 16),
    dtype="float32",
    compressors=None,
  )
  base = measure.reset_peak_rss()
  t0 = time.perf_counter()
  stream.predict(model, slide, out=out)
  seconds = time.perf_counter() - t0
  peak = measure.peak_rss()
  # A band across the middle, against the untiled model on a crop around it.
  r0, c0, n, margin = size // 2, size // 2, 256, 64
  crop = slide[r0 - margin : r0 + n + margin, c0 - margin : c0 + n + margin]
  want = model(crop[None], training=False).numpy()[
    0, margin // 2 : (margin + n) // 2, margin // 2 : (margin + n) // 2
  ]
  got = out[r0 // 2 : (r0 + n) // 2, c0 // 2 : (c0 + n) // 2]
  err = float(np.abs(got - want).max() / np.abs(want).max())
  print(
    json.dumps(
      dict(
        seconds=seconds,
        peak_rss=peak,
        rss_before=base,
        tiles=p.tiles,
        tile=p.tile,
        plan_peak=p.peak_bytes,
        recompute=p.recompute,
        max_rel_error=err,
        plan=str(p),
      )
    )
  )


def _child_untiled(size, scratch):
  """In a child under an address-space cap: the untiled model on the whole slide."""
  import zarr

  model = network()
  slide = zarr.open_array(_slide(size, scratch), mode="r")
  try:
    image = slide[:][None]
    y = model(image, training=False)
    print(json.dumps(dict(outcome="finished", shape=list(y.shape), peak_rss=measure.peak_rss())))
  except BaseException as e:  # what happens is the result
    line = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
    print(json.dumps(dict(outcome=f"{type(e).__name__}: {line}", peak_rss=measure.peak_rss())))


def memory(size, scratch, timeout):
  _slide(size, scratch)
  streamed = measure.run_child(
    [
      "-m",
      "benchmarks.cpu.stream",
      "--child",
      "streamed",
      "--size",
      str(size),
      "--scratch",
      scratch,
    ],
    timeout,
  )
  cap = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  import subprocess

  env = measure.child_env(TF_CPP_MIN_LOG_LEVEL="3")
  try:
    out = subprocess.run(
      [
        "prlimit",
        f"--as={cap}",
        sys.executable,
        "-m",
        "benchmarks.cpu.stream",
        "--child",
        "untiled",
        "--size",
        str(size),
        "--scratch",
        scratch,
      ],
      capture_output=True,
      text=True,
      timeout=timeout,
      env=env,
    )
    lines = out.stdout.strip().splitlines()
    if not lines and out.returncode < 0:
      import signal

      lines = [json.dumps({"outcome": f"killed by {signal.Signals(-out.returncode).name}"})]
    untiled = (
      json.loads(lines[-1])
      if lines
      else {
        "outcome": f"exit {out.returncode}: " + (out.stderr.strip().splitlines() or [""])[-1][:200]
      }
    )
  except subprocess.TimeoutExpired:
    untiled = {"outcome": f"timed out after {timeout} s"}
  from tf_largeconv import stream

  untiled["estimate_bytes"] = stream.plan(network(), (1, size, size, 3), tile=size).peak_bytes
  untiled["cap_bytes"] = cap
  return dict(streamed=streamed, untiled=untiled)


def cluster(size, scratch, workers, worker_limit, tile_limit):
  """The network over a --cluster-size^2 x 3 zarr slide on a LocalCluster of `workers`
  processes x 1 thread with `worker_limit` bytes each, by `stream.to_dask` into zarr:
  wall time, each worker's peak memory (distributed's monitor), spills and restarts, and a
  band checked against the in-process stream."""
  import zarr

  from benchmarks.cpu import slide as slide_bench
  from tf_largeconv import stream
  from tf_largeconv.dask import open_slide

  model = network()
  path = _slide(size, scratch)
  slide = open_slide(path, chunk=2048)
  out_path = os.path.join(scratch, f"stream_cluster_out_{size}.zarr")
  with slide_bench.local_client(workers, worker_limit) as client:
    lazy = stream.to_dask(model, slide, memory_limit=tile_limit)
    p = stream.plan(model, slide, memory_limit=tile_limit)
    run = slide_bench._run_on_cluster(client, lambda: lazy.to_zarr(out_path, overwrite=True))
  found = run["workers"].values()
  r0, n = size // 2, 256
  crop = zarr.open_array(path, mode="r")[r0 - 128 : r0 + n + 128, r0 - 128 : r0 + n + 128]
  want = stream.predict(model, crop[None], tile=p.tile)[0, 64 : 64 + n // 2, 64 : 64 + n // 2]
  got = zarr.open_array(out_path, mode="r")[r0 // 2 : (r0 + n) // 2, r0 // 2 : (r0 + n) // 2]
  return dict(
    size=size,
    slide_bytes=size * size * 3 * 4,
    output_bytes=int(np.prod(lazy.shape)) * 4,
    workers=workers,
    worker_limit=worker_limit,
    tile=p.tile,
    tiles=p.tiles,
    plan_peak=p.peak_bytes,
    seconds=run["seconds"],
    peaks=[w["peak_bytes"] for w in found],
    spilled=sum(w["spills"] for w in found),
    restarted=sum(w["restarted"] for w in found) + len(run["lost_workers"]),
    max_rel_error=float(np.abs(got - want).max() / np.abs(want).max()),
  )


def training_model(tile=None, memory_limit=None, pool=TRAIN_POOL):
  """`network()` as a frozen-BN trunk ending in a `pool` x `pool` max pooling (a slide
  classifier's trunk shrinks its map before the head; 1: none), a global-pooling
  classifier head, as a StreamingModel and as the plain Keras model with the same
  variables."""
  import keras

  from tf_largeconv import stream

  body = network()
  for layer in body.layers:
    if isinstance(layer, keras.layers.BatchNormalization):
      layer.trainable = False
  trunk = body
  if pool > 1:
    trunk = keras.Model(body.input, keras.layers.MaxPooling2D(pool)(body.output))
  inp = keras.Input((None, None, 16))
  head = keras.Model(inp, keras.layers.Dense(10)(keras.layers.GlobalAveragePooling2D()(inp)))
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  streamed = stream.StreamingModel(trunk, head, tile=tile, memory_limit=memory_limit)
  streamed.compile(optimizer=keras.optimizers.SGD(1e-3), loss=loss)
  x = keras.Input((None, None, 3))
  plain = keras.Model(x, head(trunk(x)))
  plain.compile(optimizer=keras.optimizers.SGD(1e-3), loss=loss)
  return streamed, plain


def train_speed(size):
  """One training step (train_on_batch) streamed and untiled, and the streamed forward
  alone, on a size^2 image that fits; best of 3 each."""
  streamed, plain = training_model()
  x = np.random.default_rng(3).standard_normal((1, size, size, 3)).astype(np.float32)
  y = np.array([4])
  rows = {}
  rows["untiled step"], _ = measure.measure(lambda: plain.train_on_batch(x, y), repeats=3)
  rows["streamed step"], _ = measure.measure(lambda: streamed.train_on_batch(x, y), repeats=3)
  rows["streamed forward"], _ = measure.measure(lambda: streamed.predict_on_batch(x), repeats=3)
  p = streamed.plan(x.shape)
  return dict(seconds=rows, tiles=p.tiles, tile=p.tile, recompute=p.recompute)


def _child_train(size, mode, pool):
  """In a child: one training step on a size^2 x 3 image, streamed or untiled; prints
  the peak RSS and time as JSON."""
  streamed, plain = training_model(pool=pool)
  model = streamed if mode == "streamed" else plain
  x = np.random.default_rng(3).standard_normal((1, size, size, 3)).astype(np.float32)
  base = measure.reset_peak_rss()
  t0 = time.perf_counter()
  try:
    loss = float(model.train_on_batch(x, np.array([4])))
    outcome = "finished"
  except BaseException as e:  # what happens is the result
    loss, outcome = None, f"{type(e).__name__}: {str(e).strip()[:160]}"
  result = dict(
    seconds=time.perf_counter() - t0,
    peak_rss=measure.peak_rss(),
    rss_before=base,
    outcome=outcome,
    loss=loss,
  )
  if mode == "streamed":
    p = streamed.plan(x.shape)
    result.update(tiles=p.tiles, tile=p.tile, plan_peak=p.peak_bytes)
  print(json.dumps(result))


def train_memory(size, timeout, pool=TRAIN_POOL):
  child = ["--size", str(size), "--train-pool", str(pool)]
  streamed = measure.run_child(
    ["-m", "benchmarks.cpu.stream", "--child", "train-streamed", *child], timeout
  )
  cap = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  import subprocess

  env = measure.child_env(TF_CPP_MIN_LOG_LEVEL="3")
  cmd = [sys.executable, "-m", "benchmarks.cpu.stream", "--child", "train-untiled"]
  try:
    out = subprocess.run(
      ["prlimit", f"--as={cap}", *cmd, *child],
      capture_output=True,
      text=True,
      timeout=timeout,
      env=env,
    )
    lines = out.stdout.strip().splitlines()
    if lines:
      untiled = json.loads(lines[-1])
    else:
      import signal

      how = signal.Signals(-out.returncode).name if out.returncode < 0 else f"exit {out.returncode}"
      untiled = {"outcome": f"killed by {how}"}
  except subprocess.TimeoutExpired:
    untiled = {"outcome": f"timed out after {timeout} s"}
  untiled["cap_bytes"] = cap
  return dict(streamed=streamed, untiled=untiled)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", type=int, default=16384)
  parser.add_argument("--speed-size", type=int, nargs="*", default=[2048, 4096])
  parser.add_argument("--out", default=measure.RESULTS_DIR)
  parser.add_argument("--scratch", default=measure.SCRATCH_DIR)
  parser.add_argument("--timeout", type=int, default=1800)
  parser.add_argument("--cluster-size", type=int, default=24576)
  parser.add_argument("--workers", type=int, default=2)
  parser.add_argument("--worker-limit", type=int, default=2 * GiB)
  parts = ["speed", "memory", "cluster", "train-speed", "train-memory", "networks"]
  parser.add_argument("--parts", nargs="*", choices=parts, default=parts)
  parser.add_argument("--train-size", type=int, default=8192)
  parser.add_argument("--train-pool", type=int, default=TRAIN_POOL)
  parser.add_argument("--train-speed-size", type=int, default=1024)
  parser.add_argument(
    "--child",
    choices=("streamed", "untiled", "train-streamed", "train-untiled"),
    help=argparse.SUPPRESS,
  )
  args = parser.parse_args(argv)
  if args.child == "streamed":
    return _child_streamed(args.size, args.scratch)
  if args.child == "untiled":
    return _child_untiled(args.size, args.scratch)
  if args.child in ("train-streamed", "train-untiled"):
    return _child_train(args.size, args.child.split("-")[1], args.train_pool)
  os.makedirs(args.scratch, exist_ok=True)
  results = dict(size=args.size, speed_size=args.speed_size)
  if "speed" in args.parts:
    results["speed"] = {}
    for size in args.speed_size:
      rows = results["speed"][str(size)] = speed(size)
      print(f"speed, {size}^2 x 3 float32 (fits in memory), best of 3:")
      head = ("run", "seconds", "us/pixel", "vs untiled", "tiles", "recomputed")
      print(f"  {head[0]:22s}{head[1]:>9s}{head[2]:>10s}{head[3]:>12s}{head[4]:>7s}{head[5]:>12s}")
      for label, r in rows.items():
        print(
          f"  {label:22s}{r['seconds']:9.2f}{r['us_per_pixel']:10.3f}{r['vs_untiled']:11.2f}x"
          f"{r.get('tiles', 1):7d}{100 * r.get('recompute', 0):11.1f}%"
        )
  if "memory" in args.parts:
    results["memory"] = memory(args.size, args.scratch, args.timeout)
    s, u = results["memory"]["streamed"], results["memory"]["untiled"]
    print(f"memory, {args.size}^2 x 3 float32 zarr slide -> zarr:")
    if "error" in s:
      print(f"  streamed: {s['error']}")
    else:
      print(
        f"  streamed: peak RSS {s['peak_rss'] / GiB:.2f} GiB, {s['seconds']:.0f} s, "
        f"{s['tiles']} tiles of {s['tile']} px, plan's peak per tile "
        f"{s['plan_peak'] / GiB:.2f} GiB, max rel. error on a band {s['max_rel_error']:.1e}"
      )
    print(
      f"  untiled: needs at least {u['estimate_bytes'] / GiB:.1f} GiB of activations; under a "
      f"{u['cap_bytes'] / GiB:.1f} GiB address-space cap: {u['outcome']}"
    )
  if "cluster" in args.parts:
    # A tile's estimate is about half of what a task really holds (TensorFlow's and the
    # allocator's own), and TensorFlow takes about 0.55 GiB of each worker: an eighth of
    # the worker's limit per tile keeps the worker under distributed's spill threshold.
    tile_limit = args.worker_limit // 8
    r = results["cluster"] = cluster(
      args.cluster_size, args.scratch, args.workers, args.worker_limit, tile_limit
    )
    print(
      f"cluster, {args.cluster_size}^2 x 3 float32 zarr slide ({r['slide_bytes'] / GiB:.1f} GiB"
      f" in, {r['output_bytes'] / GiB:.1f} GiB out) on {args.workers} workers x "
      f"{args.worker_limit / GiB:.1f} GiB, tiles of {r['tile']} px ({r['tiles']}):\n"
      f"  {r['seconds']:.0f} s; worker peaks {[round(p / 2**20) for p in r['peaks']]} MiB; "
      f"spills {r['spilled']}, restarts {r['restarted']}; max rel. error on a band "
      f"{r['max_rel_error']:.1e}"
    )
  if "train-speed" in args.parts:
    sp = results["train_speed"] = train_speed(args.train_speed_size)
    t = sp["seconds"]
    print(
      f"training, one step on {args.train_speed_size}^2 x 3 (fits), best of 3: untiled "
      f"{t['untiled step']:.2f} s, streamed {t['streamed step']:.2f} s "
      f"({t['streamed step'] / t['untiled step']:.2f}x untiled, "
      f"{t['streamed step'] / t['streamed forward']:.2f}x the streamed forward "
      f"{t['streamed forward']:.2f} s); {sp['tiles']} tiles"
    )
  if "train-memory" in args.parts:
    mem = results["train_memory"] = train_memory(args.train_size, args.timeout, args.train_pool)
    s_, u = mem["streamed"], mem["untiled"]
    if "error" in s_:
      print(f"training on {args.train_size}^2: {s_['error']}")
    else:
      print(
        f"training, one step on {args.train_size}^2 x 3: streamed peak RSS "
        f"{s_['peak_rss'] / GiB:.2f} GiB, {s_['seconds']:.0f} s, {s_['tiles']} tiles of "
        f"{s_['tile']} px ({s_['outcome']}); untiled under a {u['cap_bytes'] / GiB:.1f} GiB "
        f"cap: {u['outcome']}"
      )
  if "networks" in args.parts:  # Keras's applications and a U-Net: its own table and file
    from benchmarks.cpu import stream_networks

    stream_networks.main(["--out", args.out])
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "bench_stream.json"), "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
