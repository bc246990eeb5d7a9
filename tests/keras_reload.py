"""A Keras model reloaded in a fresh process computes and trains as the original does: the
shared parts of the layers' reload tests (test_keras.py, test_keras3d.py).

One SGD step on fixed data, in the test process and in the fresh one: the same ops on the
same machine, so the results agree to float32 rounding (in practice bit for bit); the
LargeConv kernels move by 3e-3 or more, far beyond the tolerance.
"""

import keras
import numpy as np
import subproc

LR = 0.1
RELOAD_RTOL, RELOAD_ATOL = 1e-6, 1e-7


def save_data(tmp_path, model, x, t):
  """Saves the input, the training target and the output before training for a child."""
  for name, a in (("x", x), ("t", t), ("y", model(x).numpy())):
    np.save(tmp_path / f"{name}.npy", a)


def load_list(path):
  with np.load(path) as f:
    return [f[f"arr_{i}"] for i in range(len(f.files))]


def assert_trained_alike(before, ours, theirs, names):
  """The child's trained weights equal ours, and the two Large layers' kernels moved."""
  assert len(ours) == len(theirs) == len(names)
  for name, a, b in zip(names, ours, theirs):
    np.testing.assert_allclose(
      b, a, rtol=RELOAD_RTOL, atol=RELOAD_ATOL, equal_nan=False, err_msg=name
    )
  kernels = [
    i
    for i, name in enumerate(names)
    if name.split("/")[-2].startswith("large_") and name.endswith("/kernel")
  ]
  assert len(kernels) == 2, names
  for i in kernels:
    moved = np.abs(ours[i] - before[i]).max()
    assert moved > 1000 * RELOAD_ATOL, f"{names[i]} moved by only {moved}"


def keras_file_trains_alike(model, x, t, tmp_path, checks):
  """Saves `model` as a .keras file, which a fresh process loads; there `checks` (lines of
  Python about the loaded model `m`) must hold, its output on `x` must be the original's bit
  for bit, and it takes one SGD step on (x, t). The same step here must give the same
  weights (`assert_trained_alike`)."""
  save_data(tmp_path, model, x, t)
  model.save(tmp_path / "m.keras")
  checks = "\n      ".join(checks)
  subproc.run(
    f"""
      import sys
      import numpy as np, keras
      import tf_largeconv  # registers the ops and layers
      out = sys.argv[1]
      m = keras.saving.load_model(out + "/m.keras")
      x = np.load(out + "/x.npy")
      {checks}
      np.testing.assert_array_equal(m(x).numpy(), np.load(out + "/y.npy"))
      # The reloaded model trains: one SGD step, as the test process takes on the original.
      m.compile(keras.optimizers.SGD({LR}), "mse")
      m.train_on_batch(x, np.load(out + "/t.npy"))
      np.savez(out + "/trained.npz", *m.get_weights())
      """,
    tmp_path,
    timeout=300,
  )
  before = model.get_weights()
  model.compile(keras.optimizers.SGD(LR), "mse")
  model.train_on_batch(x, t)
  assert_trained_alike(
    before,
    model.get_weights(),
    load_list(tmp_path / "trained.npz"),
    [w.path for w in model.weights],
  )
