"""tf.distribute: model.fit with LargeConv2D under MirroredStrategy (two logical CPUs),
and training under MultiWorkerMirroredStrategy (two worker processes on loopback), each in
fresh processes with bounded time: the loss falls and every replica ends with the same
weights.

Keras 3.15's model.fit fails under MultiWorkerMirroredStrategy on this setup even with
keras.layers.Conv2D alone ("Attempt to convert a value (PerReplica...)"), so the
multi-worker test trains with a tf.distribute step (strategy.run, all-reduced gradients)
over the same layers."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
           PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))

TRAIN = """
import numpy as np, keras, tensorflow as tf
import tf_largeconv
from tf_largeconv.keras import LargeConv2D, LargeDepthwiseConv2D

def data():
  rng = np.random.default_rng(0)
  x = rng.random((32, 28, 28, 2)).astype("float32")
  y = x.mean(axis=(1, 2, 3))[:, None].astype("float32")
  return x, y

def build():
  keras.utils.set_random_seed(1)
  m = keras.Sequential([keras.Input((28, 28, 2)),
                        LargeConv2D(4, 15, padding="same", activation="relu"),
                        LargeDepthwiseConv2D(9, padding="same"),
                        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1)])
  m.compile(keras.optimizers.SGD(0.02), "mse")
  return m
"""


def _run(code, env=ENV, timeout=240):
  return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait(proc, timeout=240):
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    out, err = proc.communicate()
    raise AssertionError(f"timed out; stderr: {err[-3000:]}")
  assert proc.returncode == 0, err[-3000:]
  return out


def test_mirrored_strategy_on_two_logical_cpus():
  out = _wait(_run(TRAIN + """
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
assert strategy.num_replicas_in_sync == 2
with strategy.scope():
  m = build()
x, y = data()
loss = m.fit(x, y, batch_size=8, epochs=4, verbose=0).history["loss"]
assert loss[-1] < loss[0], loss
for v in m.trainable_variables:
  parts = [p.numpy() for p in strategy.experimental_local_results(v.value)]
  assert len(parts) == 2
  np.testing.assert_array_equal(parts[0], parts[1])
print("ok", loss)
"""))
  assert out.startswith("ok")


def _free_ports(n):
  socks = [socket.socket() for _ in range(n)]
  for s in socks:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in socks]
  for s in socks:
    s.close()
  return ports


def test_multi_worker_mirrored_strategy_two_local_workers(tmp_path):
  ports = _free_ports(2)
  cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
  procs = []
  for index in range(2):
    env = dict(ENV, TF_CONFIG=json.dumps({"cluster": cluster,
                                          "task": {"type": "worker", "index": index}}))
    procs.append(_run(TRAIN + f"""
strategy = tf.distribute.MultiWorkerMirroredStrategy()
assert strategy.num_replicas_in_sync == 2
with strategy.scope():
  m = build()
x, y = data()
dist = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat(4))

@tf.function
def step(xb, yb):
  def replica(xb, yb):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean((m(xb, training=True) - yb) ** 2)
    grads = tape.gradient(loss, [v.value for v in m.trainable_variables])
    return loss, grads
  loss, grads = strategy.run(replica, args=(xb, yb))
  loss = strategy.reduce("MEAN", loss, axis=None)
  for v, g in zip(m.trainable_variables, grads):
    v.assign_sub(0.02 * strategy.reduce("MEAN", g, axis=None))
  return loss

losses = [float(step(xb, yb)) for xb, yb in dist]
assert losses[-1] < losses[0], losses
np.savez({str(tmp_path / f"w{index}.npz")!r}, *[w for w in m.get_weights()])
print("ok", losses[0], losses[-1])
""", env=env))
  outs = [_wait(p) for p in procs]
  assert all(o.startswith("ok") for o in outs)
  w0, w1 = (np.load(tmp_path / f"w{i}.npz") for i in range(2))
  assert len(w0.files) == len(w1.files) > 0
  for k in w0.files:
    np.testing.assert_array_equal(w0[k], w1[k])
