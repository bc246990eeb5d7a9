"""The wheel installs and runs without a compiler. `make wheel` builds it from this checkout;
a fresh virtual environment gets TensorFlow (the release the tests run on) and numpy only;
pip installs the wheel there with nothing but that environment on PATH; tests/wheel_smoke.py
then checks it against TensorFlow's own kernels. The same installation under another
TensorFlow minor release (that release put first on the path) imports with one warning and
gives the same results through the portable path. `make sdist` holds what a build needs.

One environment serves every test here (module-scoped), so TensorFlow is installed once.
"""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile

import pytest
import subproc
import tensorflow as tf

SMOKE = os.path.join(subproc.TESTS_DIR, "wheel_smoke.py")
WHEEL_TOOLS = os.path.join(subproc.REPO_ROOT, "build", "wheel-tools", "bin")
# What the smoke run prints (and the test reads back) besides its own checks' lines.
FIELDS = ("WARNINGS", "LATER_WARNINGS", "FILE", "INFO", "COMPILERS")


def _run(argv, timeout, **kw):
  out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
  assert out.returncode == 0, subproc.describe(out, out.stdout, out.stderr)
  return out


def _source_checkout():
  if not os.path.isfile(os.path.join(subproc.REPO_ROOT, "Makefile")):
    pytest.skip(f"{subproc.REPO_ROOT} is not a source checkout: there is no wheel to build")


def _make(target, **variables):
  _source_checkout()
  argv = ["make", "--no-print-directory", target] + [f"{k}={v}" for k, v in variables.items()]
  return _run(argv, timeout=1800, cwd=subproc.REPO_ROOT)


def _tensorflow_dist():
  """The installed TensorFlow's distribution name: tensorflow-cpu or tensorflow."""
  for name in ("tensorflow-cpu", "tensorflow"):
    try:
      if importlib.metadata.version(name) == tf.__version__:
        return name
    except importlib.metadata.PackageNotFoundError:
      pass
  raise AssertionError(f"no tensorflow-cpu or tensorflow distribution of {tf.__version__}")


def _distributions(python):
  out = _run([python, "-m", "pip", "list", "--format", "json"], timeout=120)
  return {d["name"].lower().replace("_", "-"): d["version"] for d in json.loads(out.stdout)}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
  """The wheel `make wheel` builds, and what it printed."""
  dist = tmp_path_factory.mktemp("dist")
  out = _make("wheel", PY=sys.executable, DIST=dist)
  (path,) = dist.glob("*.whl")
  return path, out.stdout


@pytest.fixture(scope="module")
def clean_env(tmp_path_factory, wheel):
  """A new virtual environment with TensorFlow and numpy, the wheel installed there by a pip
  that sees no compiler; yields (its python, the environment to run it in, timings, its
  folder) and removes it after the module's tests."""
  root = tmp_path_factory.mktemp("clean")
  venv = root / "venv"
  python = str(venv / "bin" / "python")
  start = time.monotonic()
  _run([sys.executable, "-m", "venv", str(venv)], timeout=300)
  _run(
    [python, "-m", "pip", "install", "-q", f"{_tensorflow_dist()}=={tf.__version__}", "numpy"],
    timeout=1200,
  )
  seconds = {"venv_and_tensorflow": time.monotonic() - start}
  before = _distributions(python)
  # Nothing but the venv on PATH, no compiler variables, no user site-packages.
  env = {k: os.environ[k] for k in ("HOME", "LANG", "TMPDIR") if k in os.environ}
  env.update(PATH=str(venv / "bin"), PYTHONNOUSERSITE="1", TF_CPP_MIN_LOG_LEVEL="2")
  env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
  start = time.monotonic()
  out = _run(
    [python, "-m", "pip", "install", "--no-index", str(wheel[0])], timeout=600, env=env, cwd=root
  )
  seconds["pip_install_wheel"] = time.monotonic() - start
  print(f"\nwheel test: {seconds}")
  added = set(_distributions(python).items()) - set(before.items())
  assert added == {("tf-largeconv", "0.1.0")}, (added, out.stdout)
  assert "Building wheel" not in out.stdout and "setup.py" not in out.stdout, out.stdout
  yield python, env, seconds, root
  shutil.rmtree(root)  # TensorFlow twice: over a GiB that no later run reads


def _smoke(clean_env, mode, tmp_path, pythonpath=None):
  """Runs tests/wheel_smoke.py in the clean environment; returns its printed fields."""
  python, env, _, _ = clean_env
  env = dict(env, **({"PYTHONPATH": pythonpath} if pythonpath else {}))
  out = _run([python, SMOKE, mode, str(tmp_path)], timeout=900, env=env, cwd=tmp_path)
  lines = out.stdout.splitlines()
  assert lines[-1] == "OK", subproc.describe(out, out.stdout, out.stderr)
  fields = {}
  for line in lines:
    key, _, value = line.partition(": ")
    if key in FIELDS:
      fields[key] = value if key == "FILE" else json.loads(value)
  return fields


def test_wheel_installs_without_a_compiler_and_runs(wheel, clean_env, tmp_path):
  path, make_output = wheel
  _, _, seconds, root = clean_env
  # An honest manylinux tag: the one the libraries' symbol versions allow, which `make
  # wheel` printed; TensorFlow's framework library linked, not vendored.
  show = _run([os.path.join(WHEEL_TOOLS, "auditwheel"), "show", "--json", str(path)], 120)
  show = json.loads(show.stdout)
  platform = path.name[: -len(".whl")].split("-")[-1]
  assert re.fullmatch(r"manylinux_2_\d+_x86_64", platform) and show["sym_tag"] == platform, show
  assert sorted(show["external_libs"]) == ["libtensorflow_framework.so.2"], show
  assert f"tag:        cp{sys.version_info[0]}{sys.version_info[1]}" in make_output
  with zipfile.ZipFile(path) as archive:
    names = archive.namelist()
  assert not [n for n in names if ".libs/" in n], names

  fields = _smoke(clean_env, "loaded", tmp_path)
  assert fields["WARNINGS"] == fields["LATER_WARNINGS"] == [], fields
  assert fields["FILE"].startswith(str(root / "venv")), fields["FILE"]
  assert not any(fields["COMPILERS"].values()), fields["COMPILERS"]
  info = fields["INFO"]
  assert info["tensorflow_built"] == info["tensorflow_running"] == tf.__version__, info
  assert info["cpu_kernels"] and info["fallback"] is None, info
  assert info["op_library"].startswith(str(root / "venv")), info
  assert info["version"] == "0.1.0", info
  # Built with nvcc, the libraries carry the CUDA kernels' device code.
  assert info["cuda_built"] == bool(re.search(r"_cuda\.[^ ]*\.so", " ".join(names))), names
  if info["cuda_built"]:
    assert info["cufft"] is not None, info
    with zipfile.ZipFile(path) as archive:
      for lib in (n for n in names if n.endswith(".so") and "/_core." not in n):
        sections = _run(["readelf", "-S", "-W", archive.extract(lib, tmp_path / "libs")], 60)
        assert ".nv_fatbin" in sections.stdout, (lib, sections.stdout)
  # The install itself is seconds (no build): a source build takes minutes.
  assert seconds["pip_install_wheel"] < 60, seconds


def test_wheel_under_another_tensorflow_falls_back_with_a_warning(clean_env, tmp_path):
  # The previous TensorFlow minor release, put before the installed one on the path: the
  # op library (built against this one) is not loaded; the ops run the portable path.
  python, env, _, root = clean_env
  major, minor = (int(v) for v in tf.__version__.split(".")[:2])
  other = f"{major}.{minor - 1}"
  target = root / f"tensorflow-{other}"
  if not target.is_dir():
    start = time.monotonic()
    _run(
      [
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-deps",
        "--target",
        str(target),
        f"{_tensorflow_dist()}=={other}.*",
      ],
      timeout=1200,
    )
    print(f"\nwheel test: TensorFlow {other} installed in {time.monotonic() - start:.1f} s")
  fields = _smoke(clean_env, "fallback", tmp_path, pythonpath=str(target))
  info = fields["INFO"]
  assert info["tensorflow_running"].startswith(other + "."), info
  assert info["tensorflow_built"] == tf.__version__ and not info["cpu_kernels"], info
  (warning,) = fields["WARNINGS"]
  assert fields["LATER_WARNINGS"] == [], fields["LATER_WARNINGS"]  # once, at import
  # What was found, what was expected, how to fix it; info() gives the same reason.
  assert "every op runs the portable path" in warning, warning
  assert f"built against TensorFlow {tf.__version__}" in warning, warning
  assert f"TensorFlow {info['tensorflow_running']} is installed" in warning, warning
  assert f"pip install '{_tensorflow_dist()}=={major}.{minor}.*'" in warning, warning
  assert f"wheel built for TensorFlow {other}" in warning and "make build" in warning, warning
  assert info["fallback"] and info["fallback"] in warning, info


def test_sdist_holds_every_tracked_file_the_build_needs(tmp_path):
  _make("sdist", DIST=tmp_path)
  (path,) = tmp_path.glob("*.tar.gz")
  with tarfile.open(path) as archive:
    top = path.name[: -len(".tar.gz")] + "/"
    names = {m.name[len(top) :] for m in archive.getmembers() if m.isfile()}
  needed = ["cc", "tf_largeconv", "Makefile", "setup.py", "pyproject.toml", "MANIFEST.in"]
  needed += ["README.md", "tools/tfconfig.py"]
  tracked = _run(["git", "ls-files", *needed], 60, cwd=subproc.REPO_ROOT).stdout.split()
  assert "cc/tf/conv_ops.cc" in tracked and "tools/tfconfig.py" in tracked, tracked
  assert not set(tracked) - names, sorted(set(tracked) - names)
  # Nothing built here: the build writes the libraries and _build_info.py for its own TF.
  assert not [n for n in names if n.endswith((".so", ".o")) or "_build_info" in n], names
