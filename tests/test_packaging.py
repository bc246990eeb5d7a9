"""The package installs with pip against the installed TensorFlow and runs from there;
the demo runs end to end."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_pip_install_no_build_isolation(tmp_path):
  target = tmp_path / "site"
  subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                  "--target", str(target), ROOT], check=True, capture_output=True,
                 timeout=900)
  code = ("import numpy as np, tf_largeconv as lc\n"
          "print(lc.__file__)\n"
          "print(float(lc.conv2d(np.ones((1, 4, 4, 1), np.float32),"
          " np.ones((3, 3, 1, 1), np.float32), 1, 'VALID')[0, 0, 0, 0]))\n")
  env = dict(os.environ, PYTHONPATH=str(target), TF_CPP_MIN_LOG_LEVEL="2")
  out = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env,
                       capture_output=True, text=True, timeout=300, check=True)
  path, value = out.stdout.split()
  assert path.startswith(str(target))
  assert float(value) == 9.0


def test_demo_runs():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  out = subprocess.run([sys.executable, "-m", "tf_largeconv.demo", "--frames", "1"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                       check=True)
  assert "tf_largeconv" in out.stdout and "tf.nn.conv2d" in out.stdout
  diff_line = [l for l in out.stdout.splitlines() if l.startswith("max |difference|")][0]
  diff = float(diff_line.split("=")[1].split()[0])
  scale = float(diff_line.split("magnitude")[1].split(")")[0])
  assert diff <= 1e-4 * scale


def test_example_trains():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
  out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_large_kernel.py"),
                        "--steps", "3", "--size", "40", "--channels", "8"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600, check=True)
  assert "backprop_filter" in out.stdout and "loss per epoch" in out.stdout
