"""Child Python processes for the tests.

A child imports the same tf_largeconv as the test process (an installed copy or the
checkout, whichever pytest imported), never the checkout by accident through its working
directory, and a child that fails shows its stderr in the test's failure message.
"""

import os
import subprocess
import sys
import textwrap

import tf_largeconv

# The folder holding the package under test, and this folder (shared test modules).
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(tf_largeconv.__file__)))
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)


def child_env(**extra):
  """The environment for a child: the package under test and tests/ first on its path, and
  the repository root (for `benchmarks`) last."""
  path = [PACKAGE_PARENT, TESTS_DIR, os.environ.get("PYTHONPATH"), REPO_ROOT]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=os.pathsep.join(p for p in path if p))
  env.update({k: str(v) for k, v in extra.items()})
  return env


def _argv(code, args):
  if code.lstrip().startswith("-m ") or os.path.isfile(code):
    head = code.split() if code.lstrip().startswith("-m ") else [code]
  else:
    head = ["-c", textwrap.dedent(code)]
  return [sys.executable] + head + [str(a) for a in args]


def describe(proc, out, err):
  """A failure message with the child's exit code and the tails of its output."""
  return (
    f"child exited with {proc.returncode}\n--- stdout (tail) ---\n{(out or '')[-3000:]}"
    f"\n--- stderr (tail) ---\n{(err or '')[-5000:]}"
  )


def start(code, *args, env=None, cwd=None):
  """Starts a child running `code` (source text, a script path, or '-m module')."""
  return subprocess.Popen(
    _argv(code, args),
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
    env=env or child_env(),
    cwd=cwd or TESTS_DIR,
  )


def wait(proc, timeout, check=True):
  """Waits for a child; kills it after `timeout` seconds. Returns (stdout, stderr).

  Raises:
    AssertionError: the child timed out, or (with check) exited non-zero; the message
      holds its output.
  """
  try:
    out, err = proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    proc.kill()
    out, err = proc.communicate()
    raise AssertionError(
      f"child timed out after {timeout} s\n" + describe(proc, out, err)
    ) from None
  if check and proc.returncode != 0:
    raise AssertionError(describe(proc, out, err))
  return out, err


def run(code, *args, timeout, env=None, cwd=None, check=True):
  """Runs a child to the end; returns a CompletedProcess (see `wait` for failures)."""
  proc = start(code, *args, env=env, cwd=cwd)
  out, err = wait(proc, timeout, check)
  return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
