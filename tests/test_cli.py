"""The command line (tf_largeconv.cli): `tf-largeconv` / `python -m tf_largeconv` with its
subcommands conv, model, plan and info; sizes with units; the total memory limit lowering
the tasks in flight; the exit codes; the model command's OME-Zarr output (read back and
validated by ngff-zarr); and `python -m tf_largeconv.dask` as an alias. Outputs are checked
against the in-memory op and `stream.predict`."""

import json
import os
import threading
import time

import keras
import numpy as np
import pytest
import subproc

import tf_largeconv as lc
from tf_largeconv import cli
from tf_largeconv import stream
from tf_largeconv.cli import _options
from tf_largeconv.cli import _run

zarr = pytest.importorskip("zarr")
pytest.importorskip("dask.array")
pytest.importorskip("distributed")

MiB = 2**20


def _main(capsys, *argv, alias=False):
  """Runs the command line in this process: (exit code, stdout, stderr)."""
  try:
    code = (cli.dask_alias if alias else cli.main)([str(a) for a in argv])
  except SystemExit as e:
    code = e.code
  out = capsys.readouterr()
  return code, out.out, out.err


# --- sizes -------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "text, value",
  [
    ("256MiB", 256 * MiB),
    ("1GiB", 2**30),
    ("1gib", 2**30),
    ("1.5Gi", 3 * 2**29),
    ("512M", 512 * 10**6),
    ("2GB", 2 * 10**9),
    ("64 KiB", 64 * 1024),
    ("1024", 1024 * MiB),
    ("0.5", MiB // 2),
    ("1e3", 1000 * MiB),
    ("4096B", 4096),
  ],
)
def test_sizes_with_units(text, value):
  assert _options.parse_size(text, "--memory-limit") == value


@pytest.mark.parametrize("text", ["12 apples", "MiB", "-5", "0", "1,5GiB", "", "1GiB2", "0.1B"])
def test_bad_sizes_name_the_option_and_the_forms(text):
  with pytest.raises(ValueError) as e:
    _options.parse_size(text, "--memory-limit")
  message = str(e.value)
  assert message.startswith("--memory-limit: ") and repr(text) in message, message
  for form in ("MiB", "256MiB", "1GiB", "512M", "powers of 1024", "powers of 1000"):
    assert form in message, (form, message)


def test_bad_size_on_the_command_line(capsys, tmp_path):
  for option in ("--memory-limit", "--task-memory", "--workspace-limit"):
    code, _, err = _main(
      capsys, "conv", tmp_path / "s.npy", tmp_path / "o.zarr", "--filter", "f.npy", option, "1x"
    )
    assert code == _run.USAGE and f"argument {option}" in err and "256MiB" in err, err
    assert "Traceback" not in err
  assert not (tmp_path / "o.zarr").exists()


# --- tasks in flight under a total limit ------------------------------------------------


def test_in_flight_fits_the_total(monkeypatch):
  monkeypatch.setattr(os, "cpu_count", lambda: 8)
  assert _run.in_flight(100 * MiB, None, None, "x")[0] == 8
  n, line = _run.in_flight(100 * MiB, 350 * MiB, None, "x")
  assert n == 3 and "3 tasks at once" in line and "lowered from 8" in line, line
  n, line = _run.in_flight(100 * MiB, 2**30, None, "x")
  assert n == 8 and "lowered" not in line and "within --memory-limit 1024.0 MiB" in line
  with pytest.raises(_run.UsageError, match=r"--memory-limit 99.0 MiB: one task needs"):
    _run.in_flight(100 * MiB, 99 * MiB, None, "x")

  class Cluster:  # two workers of 2 threads: the command cannot lower their threads
    def scheduler_info(self):
      return {"workers": {"a": {"nthreads": 2}, "b": {"nthreads": 2}}}

  assert _run.in_flight(100 * MiB, 400 * MiB, Cluster(), "x")[0] == 4
  with pytest.raises(_run.UsageError, match="the cluster runs 4 tasks at once"):
    _run.in_flight(100 * MiB, 399 * MiB, Cluster(), "x")


def _count_concurrency(monkeypatch):
  """Wraps the chunk task to record how many run at once (each lasts at least 50 ms)."""
  from tf_largeconv.dask import _record

  state = {"now": 0, "most": 0}
  lock = threading.Lock()
  real = _record.run_chunk

  def counted(*args):
    with lock:
      state["now"] += 1
      state["most"] = max(state["most"], state["now"])
    time.sleep(0.05)
    try:
      return real(*args)
    finally:
      with lock:
        state["now"] -= 1

  monkeypatch.setattr(_record, "run_chunk", counted)
  return state


def test_memory_limit_lowers_the_tasks_in_flight(rng, tmp_path, capsys, monkeypatch):
  slide = rng.random((64, 64), dtype=np.float32)
  f = rng.standard_normal((5, 5)).astype(np.float32)
  np.save(tmp_path / "s.npy", slide)
  np.save(tmp_path / "f.npy", f)
  want = lc.conv2d(slide[None, :, :, None], f[:, :, None, None], 1, "SAME", algorithm="direct")
  monkeypatch.setattr(os, "cpu_count", lambda: 3)
  base = ["conv", tmp_path / "s.npy", None, "--filter", tmp_path / "f.npy", "--tile", 16]
  base += ["--workspace-limit", "8MiB", "--algorithm", "direct"]
  # A task holds up to 8 MiB of workspace and a little more: 20 MiB fits two of three.
  for limit, most in (("20MiB", 2), ("9MiB", 1), (None, 3)):
    state = _count_concurrency(monkeypatch)
    out = tmp_path / f"o{limit}.zarr"
    argv = [out if a is None else a for a in base] + (["--memory-limit", limit] if limit else [])
    code, text, err = _main(capsys, *argv)
    assert code == _run.OK, err
    assert f"memory: {most} task{'s' * (most != 1)} at once" in text, text
    assert ("lowered from 3" in text) == (most < 3), text
    assert state["most"] == most, (limit, state)
    got = zarr.open_array(str(out), mode="r")[:]
    np.testing.assert_array_equal(got, want.numpy()[0, :, :, 0])
  code, _, err = _main(capsys, *base[:2], tmp_path / "x.zarr", *base[3:], "--memory-limit", "4MiB")
  assert code == _run.USAGE and "one task needs up to" in err and "smaller --tile" in err, err
  assert not (tmp_path / "x.zarr").exists()


# --- plan and info -----------------------------------------------------------------------


def test_plan_prints_the_planners_plan(capsys):
  code, text, err = _main(
    capsys, "plan", "--input-shape", "1,64,64,3", "--filter-shape", "9x9x3x4", "--strides", 2,
    "--workspace-limit", "16MiB",
  )  # fmt: skip
  assert code == _run.OK, err
  want = lc.plan([1, 64, 64, 3], [9, 9, 3, 4], 2, "SAME", workspace_limit=16 * MiB)
  assert text.strip() == str(want).strip()


def test_plan_of_a_model(capsys, tmp_path):
  inp = keras.Input((None, None, 2))
  model = keras.Model(inp, keras.layers.Conv2D(3, 5, padding="same")(inp))
  model.save(tmp_path / "m.keras")
  code, text, err = _main(
    capsys, "plan", "--model", tmp_path / "m.keras", "--image-shape", "64,48,2", "--tile", 16
  )
  assert code == _run.OK, err
  assert text.strip() == str(stream.plan(model, (1, 64, 48, 2), tile=16)).strip()
  code, text, err = _main(
    capsys, "plan", "--model", tmp_path / "m.keras", "--image-shape", "64,48,2",
    "--task-memory", "1MiB",
  )  # fmt: skip
  assert code == _run.OK, err
  assert text.strip() == str(stream.plan(model, (1, 64, 48, 2), memory_limit=MiB)).strip()


def test_plan_bad_input(capsys, tmp_path):
  cases = [
    (["plan"], "give --input-shape and --filter-shape, or --model"),
    (["plan", "--input-shape", "1,64,64,3"], "--input-shape and --filter-shape together"),
    (["plan", "--input-shape", "1,a,64,3", "--filter-shape", "3,3,3,1"], "argument --input-shape"),
    (["plan", "--input-shape", "1,8,8,3", "--filter-shape", "3,3,4,1"], "evenly divisible"),
    (["plan", "--model", tmp_path / "none.keras", "--image-shape", "8,8,2"], "no such file"),
    (["plan", "--model", tmp_path / "none.keras"], "--model needs --image-shape"),
  ]
  for argv, phrase in cases:
    code, _, err = _main(capsys, *argv)
    assert code == _run.USAGE and phrase in err and "Traceback" not in err, (argv, err)


def test_info(capsys):
  code, text, _ = _main(capsys, "info", "--json")
  assert code == _run.OK
  assert json.loads(text) == json.loads(json.dumps(lc.info(), default=str))
  code, text, _ = _main(capsys, "info")
  assert code == _run.OK and text.startswith("version ") and "cpu_kernels" in text


# --- the entry points --------------------------------------------------------------------


def test_python_m_tf_largeconv_and_the_console_script(tmp_path):
  out = subproc.run("-m tf_largeconv --help", timeout=120, cwd=tmp_path)
  for word in ("conv", "model", "plan", "info", "tf-largeconv"):
    assert word in out.stdout, out.stdout
  out = subproc.run("-m tf_largeconv", timeout=120, cwd=tmp_path, check=False)
  assert out.returncode == _run.USAGE and "COMMAND" in out.stderr
  tomllib = pytest.importorskip("tomllib")
  with open(os.path.join(subproc.REPO_ROOT, "pyproject.toml"), "rb") as f:
    scripts = tomllib.load(f)["project"]["scripts"]
  assert scripts == {"tf-largeconv": "tf_largeconv.cli:main"}
  assert cli.main is __import__("tf_largeconv.cli", fromlist=["main"]).main


def test_exit_codes_are_distinct():
  assert len({_run.OK, _run.FAILED, _run.USAGE, _run.REFUSED}) == 4 and _run.USAGE == 2


# --- the model command -------------------------------------------------------------------


def _unet():
  L = keras.layers
  inp = keras.Input((None, None, 3))
  a = L.Conv2D(6, 3, padding="same", activation="relu")(inp)
  b = L.Conv2D(8, 3, padding="same", activation="relu")(L.MaxPooling2D(2)(a))
  x = L.Concatenate()([L.UpSampling2D(2)(b), a])
  model = keras.Model(inp, L.Conv2D(2, 1)(x))
  rng = np.random.default_rng(3)
  model.set_weights([rng.standard_normal(w.shape).astype("float32") * 0.3 for w in model.weights])
  return model


def test_model_command_writes_ome_zarr_with_a_pyramid(tmp_path, capsys):
  nz = pytest.importorskip("ngff_zarr")
  pytest.importorskip("jsonschema")  # ngff-zarr's validation of the metadata
  model = _unet()
  model.save(tmp_path / "net.keras")
  image = np.random.default_rng(4).random((3, 90, 76), dtype=np.float32)  # c y x
  source = str(tmp_path / "in.ome.zarr")
  ngff = nz.to_ngff_image(
    image, dims=("c", "y", "x"), scale={"y": 0.25, "x": 0.5},
    axes_units={"y": "micrometer", "x": "micrometer"},
  )  # fmt: skip
  nz.to_ome_zarr(source, nz.to_multiscales(ngff, scale_factors=[], chunks=32), version="0.4")
  want = stream.predict(model, np.moveaxis(image, 0, -1), tile=32)  # 90 x 76 x 2
  out = tmp_path / "out.ome.zarr"
  argv = ["model", tmp_path / "net.keras", source, out, "--tile", 32, "--read-chunk", 32]
  code, text, err = _main(capsys, *argv, "--levels", 3)
  assert code == _run.OK, err
  assert "pyramid levels in" in text and "memory: " in text, text
  back = nz.from_ome_zarr(str(out), validate=True)
  assert len(back.images) == 3
  for k, im in enumerate(back.images):
    assert tuple(im.dims) == ("c", "y", "x")
    assert im.scale["y"] == 0.25 * 2**k and im.scale["x"] == 0.5 * 2**k, im.scale
    assert im.axes_units["y"] == "micrometer"
  level0 = back.images[0].data.compute()
  np.testing.assert_array_equal(level0, np.moveaxis(want, -1, 0))
  half = back.images[1].data.compute()  # level 1: the means of level 0's 2x2 blocks
  quarters = [
    level0[:, i::2, j::2][:, : half.shape[1], : half.shape[2]] for i in (0, 1) for j in (0, 1)
  ]
  np.testing.assert_allclose(half, sum(quarters) / 4, rtol=0, atol=2e-6 * np.abs(level0).max())
  # resumed: nothing to do; another tile: refused with its own exit status, output kept
  code, text, err = _main(capsys, *argv, "--levels", 3, "--resume")
  assert code == _run.OK and "0 computed, " in text, text + err
  argv[5] = 16
  code, _, err = _main(capsys, *argv, "--levels", 3, "--resume")
  assert code == _run.REFUSED and "--resume refused" in err and "tile" in err, err
  np.testing.assert_array_equal(nz.from_ome_zarr(str(out)).images[0].data.compute(), level0)


def test_model_command_chunk_is_refused_and_the_alias_translates_it(tmp_path, capsys):
  _unet().save(tmp_path / "net.keras")
  image = np.random.default_rng(5).random((40, 36, 3), dtype=np.float32)
  np.save(tmp_path / "in.npy", image)
  out = tmp_path / "o.zarr"
  code, _, err = _main(capsys, "model", tmp_path / "net.keras", tmp_path / "in.npy", out,
                       "--chunk", 16)  # fmt: skip
  assert code == _run.USAGE and "--read-chunk" in err and "--tile" in err, err
  assert not out.exists()
  code, text, err = _main(
    capsys, tmp_path / "net.keras", tmp_path / "in.npy", out, "--chunk", 16, "--tile", 16,
    alias=True,
  )  # fmt: skip
  assert code == _run.OK, err
  want = stream.predict(_unet(), image, tile=16)
  np.testing.assert_array_equal(zarr.open_array(str(out), mode="r")[:], want)


def test_model_command_fits_its_tasks_when_a_share_holds_no_task(tmp_path, capsys, monkeypatch):
  """Two cores and 6 MiB: a share of 3 MiB cannot hold a task, whose input alone is four
  read chunks of 0.75 MiB. The command runs one task at a time, its tile lowered until it
  fits the 6 MiB, and the result is the model's."""
  model = _unet()
  model.save(tmp_path / "net.keras")
  image = np.random.default_rng(6).random((512, 512, 3), dtype=np.float32)
  np.save(tmp_path / "in.npy", image)
  assert stream.plan(model, image, memory_limit=6 << 20).worst_bytes > 3 << 20
  monkeypatch.setattr(os, "cpu_count", lambda: 2)
  out = tmp_path / "o.zarr"
  code, text, err = _main(
    capsys, "model", tmp_path / "net.keras", tmp_path / "in.npy", out,
    "--memory-limit", "6MiB", "--read-chunk", 256,
  )  # fmt: skip
  assert code == _run.OK, err
  assert "memory: 1 task at once" in text and "lowered from 2" in text, text
  tiles = int(text.split(" tiles (")[0].rsplit(" ", 1)[-1])
  assert tiles > 1, text
  want = np.asarray(model(image[None], training=False))[0]
  got = zarr.open_array(str(out), mode="r")[:]
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


# --- the alias ---------------------------------------------------------------------------


def test_dask_alias_equals_conv(rng, tmp_path, capsys):
  slide = rng.random((50, 44, 3), dtype=np.float32)
  w = rng.standard_normal((7, 7, 3, 2)).astype(np.float32)
  np.save(tmp_path / "s.npy", slide)
  np.save(tmp_path / "w.npy", w)
  common = ["--filter", tmp_path / "w.npy", "--strides", 2, "--algorithm", "direct"]
  code, _, err = _main(capsys, tmp_path / "s.npy", tmp_path / "a.zarr", *common, "--chunk", 20,
                       alias=True)  # fmt: skip
  assert code == _run.OK, err
  code, _, err = _main(capsys, "conv", tmp_path / "s.npy", tmp_path / "b.zarr", *common,
                       "--tile", 20)  # fmt: skip
  assert code == _run.OK, err
  a, b = (zarr.open_array(str(tmp_path / n), mode="r") for n in ("a.zarr", "b.zarr"))
  want = lc.conv2d(slide[None], w, 2, "SAME", algorithm="direct").numpy()[0]
  assert a.chunks == b.chunks == (10, 10, 2)
  np.testing.assert_array_equal(a[:], want)
  np.testing.assert_array_equal(b[:], want)
  code, text, _ = _main(capsys, "--help", alias=True)
  assert code == 0 and "python -m tf_largeconv.dask" in text and "--filter" in text
  code, text, _ = _main(capsys, "x.keras", "--help", alias=True)
  assert code == 0 and "python -m tf_largeconv.dask MODEL.keras" in text and "--up-to" in text
