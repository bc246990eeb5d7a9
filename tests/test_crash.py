"""The crash harness, at a size CI can afford (`make fuzz` runs it far longer)."""

import os

import subproc


def test_no_process_dies_on_random_calls():
  # The harness and its workers import the package under test (subproc). Workers get less
  # time than the harness, so a hung one is reported (and killed) by the harness itself.
  out = subproc.run(
    os.path.join(subproc.TESTS_DIR, "crash_harness.py"),
    "--workers",
    2,
    "--calls",
    150,
    "--seed",
    1,
    "--timeout",
    400,
    timeout=900,
    check=False,
  )
  report = subproc.describe(out, out.stdout, out.stderr)
  assert out.returncode == 0 and "deaths: 0" in out.stdout, report
  assert out.stdout.count("worker done") == 2, report
  assert f"workers import {subproc.PACKAGE_PARENT}" in out.stdout, report
