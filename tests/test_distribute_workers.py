"""StreamingModel under MultiWorkerMirroredStrategy: two worker processes on 127.0.0.1,
started and stopped by the test with bounded time, killed if anything fails.

- `fit` in both training modes (classification head, dense without a head): each worker
  streams its own half of every global batch, and after three steps both workers hold the
  weights of single-device training on the whole batches (the oracle, trained in worker 0
  outside the strategy), to float32 summation order. The same fit from a PyDataset of zarr
  arrays reads only the worker's rows and ends at the same weights, bit for bit.
- `keras.callbacks.BackupAndRestore`: a worker SIGKILLed in the middle of an epoch. The
  surviving worker cannot go on alone (its collective is aborted when the dead peer's
  heartbeats stop, and it exits), so, as Keras documents for MultiWorkerMirroredStrategy,
  the whole cluster is restarted; it resumes from the last completed epoch and ends at the
  weights of an undisturbed run.
"""

import json
import os
import signal
import time

import numpy as np
import workers

# As tests/test_distribute.py: float32 summation order across two replicas, far below how
# far training moves the weights.
RTOL = ATOL = 1e-5
TIMEOUT = 120  # seconds a worker process may run

HEAD = """
import sys, time
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
"""

FIT = (
  HEAD
  + workers.STREAMING_MODELS
  + """
OUT, INDEX = sys.argv[1], int(sys.argv[2])
assert strategy.num_replicas_in_sync == 2
"""
  + workers.ZARR_BATCHES
  + """
for kind, y in labels.items():
  with strategy.scope():
    dist = build(kind)
  init = [w.copy() for w in dist.get_weights()]
  fit = dict(batch_size=4, epochs=3, shuffle=False, verbose=0)
  loss = dist.fit(x, y, **fit).history["loss"]
  # Each worker streamed its own half of every batch of 4.
  assert {key[0] for key in dist._plans} == {2}, list(dist._plans)
  np.savez(f"{OUT}/{kind}{INDEX}.npz", *dist.get_weights(), loss=loss)
  # The same fit from a PyDataset of zarr arrays: this worker reads only its rows of each
  # global batch, and ends where the numpy fit did.
  data = Batches(saved(f"x{kind}{INDEX}", x), saved(f"y{kind}{INDEX}", y) if y.ndim > 1 else y)
  with strategy.scope():
    lazy = build(kind)
  assert lazy.fit(data, epochs=3, verbose=0).history["loss"] == loss, kind
  for a, b in zip(lazy.get_weights(), dist.get_weights(), strict=True):
    np.testing.assert_array_equal(a, b, err_msg=kind)
  assert {r[:2] for r in reads} == {(2 * INDEX, 2 * INDEX + 2)}, (kind, reads[:3])
  reads.clear()
  if INDEX == 0:
    ref = build(kind)  # outside the strategy: one device, whole batches
    ref.set_weights(init)
    loss = ref.fit(x, y, **fit).history["loss"]
    np.savez(f"{OUT}/{kind}_ref.npz", *ref.get_weights(), loss=loss)
    np.savez(f"{OUT}/{kind}_init.npz", *init)
print("ok")
"""
)


def _load(path):
  with np.load(path) as f:
    return [f[f"arr_{i}"] for i in range(len(f.files) - ("loss" in f.files))], (
      f["loss"] if "loss" in f.files else None
    )


def _assert_single_device(got, want, init, err_msg):
  moved = 0.0
  for a, b, w0 in zip(got, want, init, strict=True):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=err_msg)
    moved = max(moved, float(np.abs(b - w0).max()))
  assert moved > 100 * ATOL, (err_msg, moved)


def test_streaming_model_fit_under_multi_worker_mirrored_strategy(tmp_path):
  procs, _ = workers.start(FIT, tmp_path)
  try:
    outs = workers.wait(procs, timeout=TIMEOUT)
  finally:
    workers.kill(procs)
  assert all(o.startswith("ok") for o in outs)
  for kind in ("class", "dense"):
    (w0, loss0), (w1, loss1) = (_load(tmp_path / f"{kind}{i}.npz") for i in range(2))
    ref, ref_loss = _load(tmp_path / f"{kind}_ref.npz")
    init, _ = _load(tmp_path / f"{kind}_init.npz")
    assert len(w0) == len(ref) == 6, kind
    for a, b in zip(w0, w1, strict=True):
      np.testing.assert_array_equal(a, b, err_msg=kind)  # the workers agree exactly
    np.testing.assert_array_equal(loss0, loss1, err_msg=kind)
    np.testing.assert_allclose(loss0, ref_loss, rtol=RTOL, err_msg=kind)
    _assert_single_device(w0, ref, init, kind)


# Three epochs of two steps (a global batch of 2: one image per worker), SGD with momentum
# (the optimizer's state must come back too). MODE "kill": worker 1 writes `killme` after
# the first step of the second epoch and waits there for the test's SIGKILL. MODE "resume":
# the restarted cluster trains to the end; worker 0 then trains the undisturbed
# single-device run from the same initial weights.
BACKUP = (
  HEAD
  + workers.STREAMING_MODELS
  + """
OUT, MODE, INDEX = sys.argv[1], sys.argv[2], int(sys.argv[3])
y = labels["dense"]
sgd = lambda: keras.optimizers.SGD(0.3, momentum=0.9)
with strategy.scope():
  m = build("dense", sgd())
init = [w.copy() for w in m.get_weights()]

class Steps(keras.callbacks.Callback):
  def on_epoch_begin(self, epoch, logs=None):
    self.epoch = epoch
    print("epoch", epoch, flush=True)

  def on_train_batch_end(self, batch, logs=None):
    if MODE == "kill" and INDEX == 1 and (self.epoch, batch) == (1, 0):
      open(f"{OUT}/killme", "w").close()
      time.sleep(3600)

fit = dict(batch_size=2, epochs=3, shuffle=False, verbose=0)
backup = keras.callbacks.BackupAndRestore(f"{OUT}/backup{INDEX}")
m.fit(x, y, callbacks=[backup, Steps()], **fit)
np.savez(f"{OUT}/{MODE}{INDEX}.npz", *m.get_weights())
if INDEX == 0:
  keras.utils.set_random_seed(1)
  ref = build("dense", sgd())
  ref.set_weights(init)
  ref.fit(x, y, **fit)
  np.savez(f"{OUT}/ref.npz", *ref.get_weights())
  np.savez(f"{OUT}/init.npz", *init)
print("ok")
"""
)


def _wait_for(path, procs, timeout):
  end = time.monotonic() + timeout
  while not path.exists():
    for i, p in enumerate(procs):
      assert p.poll() is None, f"worker {i} ended before {path.name}: " + "".join(p.communicate())
    assert time.monotonic() < end, f"no {path.name} after {timeout} s"
    time.sleep(0.1)


def test_backup_and_restore_resumes_after_a_worker_is_killed(tmp_path):
  procs, _ = workers.start(BACKUP, tmp_path, "kill")
  try:
    _wait_for(tmp_path / "killme", procs, TIMEOUT)
    os.kill(procs[1].pid, signal.SIGKILL)
    procs[1].wait(10)
    assert procs[1].returncode == -signal.SIGKILL
    # The survivor cannot go on alone: its collective is aborted once the dead peer's
    # heartbeats stop (about 10 s), and it exits with an error.
    _, err = procs[0].communicate(timeout=TIMEOUT)
    assert procs[0].returncode != 0 and "UnavailableError" in err, err[-3000:]
  finally:
    workers.kill(procs)
  # Nothing of the killed run reads as done: no final weights; the backup is epoch 1's.
  assert not list(tmp_path.glob("kill*.npz"))
  for i in range(2):
    with open(tmp_path / f"backup{i}" / "training_metadata.json") as f:
      assert json.load(f)["epoch"] == 1
  procs, _ = workers.start(BACKUP, tmp_path, "resume")
  try:
    outs = workers.wait(procs, timeout=TIMEOUT)
  finally:
    workers.kill(procs)
  for out in outs:  # resumed at the epoch the kill interrupted, not from the start
    assert out.split("\n")[:2] == ["epoch 1", "epoch 2"] and out.endswith("ok\n"), out
  (w0, _), (w1, _) = (_load(tmp_path / f"resume{i}.npz") for i in range(2))
  for a, b in zip(w0, w1, strict=True):
    np.testing.assert_array_equal(a, b)
  _assert_single_device(w0, _load(tmp_path / "ref.npz")[0], _load(tmp_path / "init.npz")[0], "")
  assert not (tmp_path / "backup0").exists()  # the finished run removed its backup
