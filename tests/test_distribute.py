"""tf.distribute: model.fit with LargeConv2D under MirroredStrategy (two logical CPUs), and
training under MultiWorkerMirroredStrategy (two worker processes on loopback), each in fresh
processes with bounded time. Every replica ends with the same weights, and those weights
match the same training run on a single device (same initial weights, same data, same batch
order), with the convolution kernels moved far beyond the tolerance.

The single-device run is the oracle: with equal shares per replica, the mean of the replica
losses (and of their gradients) is the mean over the global batch, so distributed and
single-device training take the same steps up to float32 summation order.

Keras 3.15's model.fit fails under MultiWorkerMirroredStrategy on this setup even with
keras.layers.Conv2D alone ("Attempt to convert a value (PerReplica...)"), so the
multi-worker test trains with a tf.distribute step (strategy.run, all-reduced gradients)
over the same layers."""

import numpy as np
import subproc
import workers

# Distributed and single-device weights differ only by float32 summation order (a batch
# of 8 summed as 4 + 4 across replicas): at most 2e-6 after the 16 steps, so 1e-5
# leaves a margin of five while the convolution kernels move by 1e-2 or more; a layer
# that does not train, or gradients reduced wrongly (summed, not averaged), miss it by
# orders of magnitude.
RTOL = ATOL = 1e-5
# The convolution kernels must move by far more than the tolerance.
MIN_MOVE = 100 * ATOL

TRAIN = """
import sys
import numpy as np, keras, tensorflow as tf
import tf_largeconv
from tf_largeconv.keras import LargeConv2D, LargeDepthwiseConv2D

OUT = sys.argv[1]
LR, BATCH, EPOCHS = 0.05, 8, 4

def data():
  rng = np.random.default_rng(0)
  x = rng.random((32, 28, 28, 2)).astype("float32")
  y = x.mean(axis=(1, 2, 3))[:, None].astype("float32")
  return x, y

def build():
  keras.utils.set_random_seed(1)
  # Explicit algorithms: with 'auto' the planner may hand such small convolutions to
  # TensorFlow's own kernel, and the test would not run the op at all.
  m = keras.Sequential([keras.Input((28, 28, 2)),
                        LargeConv2D(4, 15, padding="same", activation="relu",
                                    algorithm="fft"),
                        LargeDepthwiseConv2D(9, padding="same", algorithm="direct"),
                        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1)])
  m.compile(keras.optimizers.SGD(LR), "mse")
  return m

def save(name, weights):
  # Keyed by layer class and variable, the same in models built under any strategy.
  np.savez(f"{OUT}/{name}.npz", **weights)

def weights(m):
  return {f"{type(l).__name__}.{v.name}": np.array(v.numpy()) for l in m.layers
          for v in l.weights}
"""


def _load(folder, name):
  with np.load(folder / f"{name}.npz") as f:
    return {k: f[k] for k in f.files}


def _assert_matches_single_device(folder, distributed="dist"):
  """Distributed weights equal single-device ones; the convolution kernels trained."""
  init, dist, ref = (_load(folder, n) for n in ("init", distributed, "ref"))
  assert (
    sorted(dist)
    == sorted(ref)
    == sorted(init)
    == [
      "Dense.bias",
      "Dense.kernel",
      "LargeConv2D.bias",
      "LargeConv2D.kernel",
      "LargeDepthwiseConv2D.bias",
      "LargeDepthwiseConv2D.kernel",
    ]
  )
  for k in ref:
    np.testing.assert_allclose(dist[k], ref[k], rtol=RTOL, atol=ATOL, equal_nan=False, err_msg=k)
  for k in ("LargeConv2D.kernel", "LargeDepthwiseConv2D.kernel"):
    moved = np.abs(dist[k] - init[k]).max()
    assert moved > MIN_MOVE, f"{k} moved by only {moved} in training"


def test_mirrored_strategy_on_two_logical_cpus(tmp_path):
  out = subproc.run(
    TRAIN
    + """
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
assert strategy.num_replicas_in_sync == 2
with strategy.scope():
  m = build()
init = m.get_weights()
save("init", weights(m))
x, y = data()
# No shuffling: the single-device run below sees the same batches in the same order.
fit = dict(batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
m.fit(x, y, **fit)
for v in m.trainable_variables:
  parts = [p.numpy() for p in strategy.experimental_local_results(v.value)]
  assert len(parts) == 2
  np.testing.assert_array_equal(parts[0], parts[1])
save("dist", weights(m))
ref = build()  # outside the strategy: one device
ref.set_weights(init)
ref.fit(x, y, **fit)
save("ref", weights(ref))
print("ok")
""",
    tmp_path,
    timeout=240,
  )
  assert out.stdout.startswith("ok")
  _assert_matches_single_device(tmp_path)


WORKER = (
  TRAIN
  + """
index = int(sys.argv[2])
strategy = tf.distribute.MultiWorkerMirroredStrategy()
assert strategy.num_replicas_in_sync == 2
with strategy.scope():
  m = build()
init = m.get_weights()
if index == 0:
  save("init", weights(m))
x, y = data()
batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).repeat(EPOCHS)

def shard(ctx):
  # This worker's equal share of every global batch, in the global order: the replicas'
  # mean gradient is then the global batch's.
  n = ctx.get_per_replica_batch_size(BATCH)
  i = ctx.input_pipeline_id
  return batches.map(lambda xb, yb: (xb[i * n:(i + 1) * n], yb[i * n:(i + 1) * n]))

def grads(model, xb, yb):
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean((model(xb, training=True) - yb) ** 2)
  return tape.gradient(loss, [v.value for v in model.trainable_variables])

@tf.function
def step(xb, yb):
  g = strategy.run(lambda xb, yb: grads(m, xb, yb), args=(xb, yb))
  for v, gv in zip(m.trainable_variables, g):
    v.assign_sub(LR * strategy.reduce("MEAN", gv, axis=None))

for xb, yb in strategy.distribute_datasets_from_function(shard):
  step(xb, yb)
save(f"dist{index}", weights(m))
if index == 0:
  ref = build()  # outside the strategy: one device, whole batches
  ref.set_weights(init)

  @tf.function
  def ref_step(xb, yb):
    for v, gv in zip(ref.trainable_variables, grads(ref, xb, yb)):
      v.assign_sub(LR * gv)

  for xb, yb in batches:
    ref_step(xb, yb)
  save("ref", weights(ref))
print("ok")
"""
)


def test_multi_worker_mirrored_strategy_two_local_workers(tmp_path):
  procs, _ = workers.start(WORKER, tmp_path)
  try:
    outs = workers.wait(procs, timeout=240)
  finally:
    workers.kill(procs)
  assert all(o.startswith("ok") for o in outs)
  w0, w1 = (_load(tmp_path, f"dist{i}") for i in range(2))
  assert sorted(w0) == sorted(w1) and len(w0) == 6
  for k in w0:
    np.testing.assert_array_equal(w0[k], w1[k], err_msg=k)
  _assert_matches_single_device(tmp_path, "dist0")


STREAMED = (
  """
import numpy as np, keras, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
assert strategy.num_replicas_in_sync == 2
"""
  + workers.STREAMING_MODELS
  + """
for kind, y in labels.items():
  with strategy.scope():
    dist = build(kind)
  ref = build(kind)  # outside the strategy: one device
  init = [w.copy() for w in ref.get_weights()]
  assert dist.plan((2, 36, 40, 3)).tiles > 1
  fit = dict(batch_size=4, epochs=3, shuffle=False, verbose=0)
  got = dist.fit(x, y, **fit).history["loss"]
  want = ref.fit(x, y, **fit).history["loss"]
  np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=kind)
  for v in dist.trainable_variables:
    parts = [p.numpy() for p in strategy.experimental_local_results(v.value)]
    np.testing.assert_array_equal(parts[0], parts[1])
  moved = 0.0
  for a, b, w0 in zip(dist.get_weights(), ref.get_weights(), init):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=kind)
    moved = max(moved, float(np.abs(b - w0).max()))
  assert moved > 100 * ATOL, (kind, moved)
print("ok")
"""
)


def test_streaming_model_under_mirrored_strategy(tmp_path):
  """StreamingModel, classification and dense, on two logical CPUs: each replica streams its
  half of the batch; three steps end at the single-device weights."""
  out = subproc.run(f"RTOL = ATOL = {RTOL}\n" + STREAMED, tmp_path, timeout=300)
  assert out.stdout.startswith("ok")
