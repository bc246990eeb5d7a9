"""`tf-largeconv model` on tf_keras (Keras 2) models, saved as HDF5 and as SavedModel
directories: the zarr it writes against the tf_keras model itself, untiled; a model path
that is neither a Keras file nor a SavedModel is refused with exit status 2."""

import numpy as np
import pytest
from test_cli import _main
from test_stream_tf_keras import resnet_block

from tf_largeconv.cli import _run

tf_keras = pytest.importorskip("tf_keras")
pytest.importorskip("h5py")
zarr = pytest.importorskip("zarr")
pytest.importorskip("dask.array")


@pytest.mark.parametrize("form", ["h5", "savedmodel"])
def test_model_command_streams_a_tf_keras_model(tmp_path, capsys, form):
  model = resnet_block()
  path = tmp_path / ("net.h5" if form == "h5" else "net_savedmodel")
  model.save(str(path), save_format="h5" if form == "h5" else "tf")
  image = np.random.default_rng(6).standard_normal((70, 61, 3)).astype("float32")
  np.save(tmp_path / "in.npy", image)
  out = tmp_path / "out.zarr"
  code, text, err = _main(capsys, "model", path, tmp_path / "in.npy", out, "--tile", 16)
  assert code == _run.OK, err
  assert "tiles" in text, text
  want = model(image[None], training=False).numpy()[0]  # the tf_keras model, untiled
  got = zarr.open_array(str(out), mode="r")[:]
  assert got.shape == want.shape
  assert np.abs(got - want).max() <= 2e-5 * np.abs(want).max()


def test_model_command_refuses_what_is_not_a_model(tmp_path, capsys):
  np.save(tmp_path / "in.npy", np.zeros((16, 16, 3), "float32"))
  (tmp_path / "text.h5").write_text("not a model")
  (tmp_path / "empty").mkdir()
  cases = [
    (tmp_path / "text.h5", "could not be loaded"),
    (tmp_path / "empty", "without saved_model.pb"),
    (tmp_path / "none.h5", "no such file or directory"),
  ]
  for path, why in cases:
    out = tmp_path / "out.zarr"
    code, _, err = _main(capsys, "model", path, tmp_path / "in.npy", out)
    assert code == _run.USAGE, (path, err)
    assert why in err and str(path) in err and "SavedModel directory saved by tf_keras" in err, err
    assert not out.exists()
