"""Trains a small U-Net to segment whole synthetic "slides" with dense streamed training
(tf_largeconv.stream.StreamingModel without a head), then runs the trained model over a
third slide with the command line, into OME-Zarr.

  python examples/segment_slides.py [--size 16384] [--steps 2] [--memory-limit-mib 1024]
      [--folder slides]

Each slide is an RGB image of noise with bright disks, stored as zarr, and its mask (1 on
a disk, 0 elsewhere) is a zarr array beside it: both are written chunk by chunk, and
training reads them window by window, so neither is ever whole in memory. A training step
runs every output tile once, from its input window, against the same tile of the mask.
The script prints the plan of a step, the loss and accuracy of each step, the command it
runs for the third slide, the accuracy of the written mask against the truth, and the
process's peak memory.
"""

import argparse
import os
import subprocess
import sys
import time

import keras
import numpy as np

from tf_largeconv import stream

L = keras.layers
CHUNK = 1024


def peak_rss():
  """The process's memory high-water mark (VmHWM, Linux) in bytes."""
  with open("/proc/self/status", encoding="ascii") as f:
    return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def write_slide(folder, name, size, seed):
  """A size x size x 3 slide and its mask as zarr arrays in `folder`, chunk by chunk."""
  import zarr

  rng = np.random.default_rng(seed)
  count = max(4, (size // 256) ** 2 // 8)
  centres = rng.uniform(0, size, (count, 2))
  radii = rng.uniform(size / 200 + 4, size / 60 + 8, count)
  image = zarr.create_array(
    os.path.join(folder, f"{name}.zarr"),
    shape=(size, size, 3),
    chunks=(CHUNK, CHUNK, 3),
    dtype="float32",
    overwrite=True,
  )
  mask = zarr.create_array(
    os.path.join(folder, f"{name}_mask.zarr"),
    shape=(size, size),
    chunks=(CHUNK, CHUNK),
    dtype="int32",
    overwrite=True,
  )
  for r0 in range(0, size, CHUNK):
    for c0 in range(0, size, CHUNK):
      rows, cols = np.mgrid[r0 : min(r0 + CHUNK, size), c0 : min(c0 + CHUNK, size)]
      inside = np.zeros(rows.shape, bool)
      near = np.abs(centres - [r0 + CHUNK / 2, c0 + CHUNK / 2]).max(axis=1) < CHUNK + radii
      for (cr, cc), rad in zip(centres[near], radii[near]):
        inside |= (rows - cr) ** 2 + (cols - cc) ** 2 < rad**2
      noise = rng.normal(0.0, 0.4, rows.shape + (3,)).astype(np.float32)
      image[r0 : r0 + rows.shape[0], c0 : c0 + rows.shape[1]] = noise + inside[..., None]
      mask[r0 : r0 + rows.shape[0], c0 : c0 + rows.shape[1]] = inside


def unet():
  """A two-level U-Net with two classes per pixel (logits)."""
  inp = keras.Input((None, None, 3))
  a = L.Conv2D(8, 3, padding="same", activation="relu")(inp)
  b = L.MaxPooling2D(2)(a)
  b = L.Conv2D(16, 3, padding="same", activation="relu")(b)
  b = L.Conv2D(16, 3, padding="same", activation="relu")(b)
  up = L.UpSampling2D(2)(b)
  x = L.Concatenate()([a, up])
  x = L.Conv2D(8, 3, padding="same", activation="relu")(x)
  return keras.Model(inp, L.Conv2D(2, 1)(x), name="unet")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--size", type=int, default=16384, help="slide side, pixels")
  parser.add_argument("--steps", type=int, default=2, help="passes over the two slides")
  parser.add_argument("--memory-limit-mib", type=int, default=1024)
  parser.add_argument("--folder", default="slides")
  args = parser.parse_args()
  if args.size % 2:
    parser.error("--size must be even (the U-Net halves and doubles it)")
  import dask.array as da

  from tf_largeconv.dask import open_slide

  os.makedirs(args.folder, exist_ok=True)
  start = time.time()
  for i, name in enumerate(("train0", "train1", "test")):
    write_slide(args.folder, name, args.size, seed=i)
  print(f"wrote 3 slides of {args.size}^2 x 3 and their masks in {time.time() - start:.0f} s")

  keras.utils.set_random_seed(0)
  model = stream.StreamingModel(unet(), memory_limit=args.memory_limit_mib << 20)
  model.compile(
    optimizer=keras.optimizers.Adam(0.01),
    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    metrics=["accuracy"],
  )
  print(model.plan((1, args.size, args.size, 3)))

  def lazy(name):
    x = open_slide(os.path.join(args.folder, f"{name}.zarr"), chunk=CHUNK)[None]
    y = da.from_zarr(os.path.join(args.folder, f"{name}_mask.zarr"))[None]
    return x, y

  for step in range(args.steps):
    for name in ("train0", "train1"):
      t0 = time.time()
      result = model.train_on_batch(*lazy(name), return_dict=True)
      print(
        f"step {step + 1}, {name}: loss {result['loss']:.4f}, accuracy "
        f"{result['accuracy']:.4f} ({time.time() - t0:.1f} s)"
      )

  saved = os.path.join(args.folder, "unet.keras")
  model.trunk.save(saved)
  out = os.path.join(args.folder, "test_mask.ome.zarr")
  command = [
    sys.executable,
    "-m",
    "tf_largeconv",
    "model",
    saved,
    os.path.join(args.folder, "test.zarr"),
    out,
    "--overwrite",
    "--memory-limit",
    f"{args.memory_limit_mib}MiB",
  ]
  print("$", " ".join(command[1:]))
  subprocess.run(command, check=True)

  import zarr

  logits = open_slide(out, chunk=CHUNK)  # the OME-Zarr image, H x W x 2, read lazily
  truth = zarr.open_array(os.path.join(args.folder, "test_mask.zarr"), mode="r")
  hits = 0
  for r0 in range(0, args.size, CHUNK):  # compared window by window, as it was written
    part = logits[r0 : r0 + CHUNK].compute()
    hits += int((part.argmax(-1) == truth[r0 : r0 + CHUNK]).sum())
  print(f"test slide: accuracy of the written mask {hits / args.size**2:.4f}")
  print(f"peak memory of this process: {peak_rss() / 2**20:.0f} MiB")


if __name__ == "__main__":
  main()
