"""tf.distribute worker processes on 127.0.0.1 for the tests: a cluster of fresh Python
processes, each with its TF_CONFIG, on ports picked free, waited for with a bound in time
and killed if anything fails."""

import threading
import time

import subproc

from benchmarks.cpu.workers import free_ports
from benchmarks.cpu.workers import tf_config


def start(code, *args, n=2, ports=None):
  """Starts `n` workers running `code` with `args` and their index as arguments (on new
  free ports, or `ports` to restart a cluster); returns (processes, ports)."""
  ports = ports or free_ports(n)
  procs = [
    subproc.start(code, *args, index, env=subproc.child_env(TF_CONFIG=tf_config(ports, index)))
    for index in range(n)
  ]
  return procs, ports


def kill(procs):
  """Kills the workers still running and reaps them."""
  for p in procs:
    if p.poll() is None:
      p.kill()
  for p in procs:
    p.communicate()


def wait(procs, timeout):
  """Waits for all workers and returns their stdout. A worker that fails ends the others
  (they would wait for it until the timeout), and the failure shows every worker's output."""
  results = [None] * len(procs)

  def wait_one(i):
    try:
      results[i] = subproc.wait(procs[i], timeout)[0]
    except AssertionError as e:
      results[i] = e

  threads = [threading.Thread(target=wait_one, args=(i,)) for i in range(len(procs))]
  for t in threads:
    t.start()
  while any(t.is_alive() for t in threads):
    if any(isinstance(r, AssertionError) for r in results):
      for p in procs:
        if p.poll() is None:
          p.kill()
    time.sleep(0.2)
  for t in threads:
    t.join()
  errors = [f"worker {i}: {r}" for i, r in enumerate(results) if isinstance(r, Exception)]
  assert not errors, "\n".join(errors)
  return results


# The data and the StreamingModels that the distributed tests train (after the test's own
# strategy is set up): a convolutional trunk streamed in tiles of 12, with a classification
# head or, for "dense", a 1 x 1 convolution ending the streamed model (no head).
STREAMING_MODELS = """
import numpy as np, keras
from tf_largeconv import stream
L = keras.layers
rng = np.random.default_rng(0)
x = rng.random((4, 36, 40, 3)).astype("float32")
labels = {"class": np.array([0, 1, 1, 0]), "dense": rng.integers(0, 3, (4, 18, 20))}

def build(kind, optimizer=None):
  keras.utils.set_random_seed(1)
  inp = keras.Input((None, None, 3))
  t = L.Conv2D(6, 5, padding="same", activation="relu")(inp)
  t = L.DepthwiseConv2D(9, strides=2, padding="same")(t)
  if kind == "dense":
    model = stream.StreamingModel(keras.Model(inp, L.Conv2D(3, 1)(t)), tile=12)
  else:
    hin = keras.Input((None, None, 6))
    head = keras.Model(hin, L.Dense(2)(L.GlobalAveragePooling2D()(hin)))
    model = stream.StreamingModel(keras.Model(inp, t), head, tile=12)
  model.compile(optimizer or keras.optimizers.SGD(0.5),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model
"""

# One global batch of four images an epoch from a PyDataset of zarr arrays written to OUT
# (`saved`), every zarr read recorded as (first row, row after the last, elements) in
# `reads`; converting a whole zarr array into numpy fails.
ZARR_BATCHES = """
import zarr
reads = []
read = zarr.Array.__getitem__
def recorded(array, index):
  part = read(array, index)
  rows = index[0] if isinstance(index, tuple) else index
  reads.append((rows.start, rows.stop, int(np.size(part))))
  return part
zarr.Array.__getitem__ = recorded
def whole(array, *args, **kwargs):
  raise AssertionError(f"a zarr array of shape {array.shape} was converted whole")
zarr.Array.__array__ = whole

class Batches(keras.utils.PyDataset):
  def __init__(self, *arrays):
    super().__init__()
    self.arrays = arrays
  def __len__(self):
    return 1
  def __getitem__(self, i):
    return self.arrays

def saved(name, a):
  zarr.create_array(f"{OUT}/{name}.zarr", data=a, chunks=(1, 6, 6) + a.shape[3:])
  return zarr.open_array(f"{OUT}/{name}.zarr", mode="r")
"""
