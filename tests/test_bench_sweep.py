"""The planner sweep's grid (benchmarks/cpu/sweep.py) covers what its goals are stated
over: every filter size, channel pair and mode, every batch and image size, and no input or
output over the sweep's memory bound. Its verdicts count TF's out-of-memory as a win. A
child stuck in one call is stopped, and the next resumes without that call."""

import itertools
import time

import pytest

from benchmarks.cpu import sweep


def _fits(n, side, ci, co):
  return n * side * side * max(ci, co) * 4 <= sweep.MAX_INPUT_BYTES


def test_the_default_grid_has_one_point_per_cell_and_every_size():
  points = sweep.grid()
  cells = [p[:3] + p[5:] for p in points]
  want = [
    (k, ci, co, mode)
    for mode in sweep.MODES
    for k, (ci, co) in itertools.product(sweep.KS, sweep.CHANNELS)
  ]
  assert sorted(cells) == sorted(want)  # every cell once, however many channels it has
  assert {(n, side) for _, _, _, n, side, _ in points} == set(sweep.SIZES)
  for k, ci, co, n, side, _ in points:
    assert _fits(n, side, ci, co), (k, ci, co, n, side)
  # A channel pair meets several sizes across the filter sizes, not one size throughout.
  for ci, co in sweep.CHANNELS:
    sizes = {
      (n, side) for k, a, b, n, side, mode in points if (a, b) == (ci, co) and mode == "forward"
    }
    assert len(sizes) > 1, (ci, co)


def test_the_full_grid_takes_every_combination_that_fits():
  points = sweep.grid(full=True)
  want = [
    (k, ci, co, n, side, mode)
    for mode in sweep.MODES
    for k, (ci, co), (n, side) in itertools.product(sweep.FULL_KS, sweep.FULL_CHANNELS, sweep.SIZES)
    if _fits(n, side, ci, co)
  ]
  assert sorted(points) == sorted(want)
  assert len(points) < len(sweep.FULL_KS) * len(sweep.FULL_CHANNELS) * len(sweep.SIZES) * 2


def test_verdicts():
  row = {"seconds": {"auto": 1.2, "fft": 1.0, "tf": 2.4, "direct": 3.0}, "failed": {}}
  assert sweep._verdict(row) == pytest.approx((1.2, 0.5))
  row = {"seconds": {"auto": 1.2, "fft": 1.5}, "failed": {"tf": "out of memory"}}
  assert sweep._verdict(row) == pytest.approx((0.8, 0.0))
  row = {"seconds": {"auto": 1.2, "fft": 1.5}, "failed": {}}
  best, vs_tf = sweep._verdict(row)
  assert best == pytest.approx(0.8) and vs_tf is None


def test_the_few_channel_grid_takes_large_photographs_with_few_channels():
  # One- and few-channel images off the square sizes, where small filters are priced close
  # to TF's kernel: every cell in every mode, on one size by default and all with --full,
  # and the sweep runs them beside the square grid.
  for full in (False, True):
    points = sweep.few_channel_grid(full)
    sizes = sweep.FEW_CHANNEL_SIZES if full else sweep.FEW_CHANNEL_SIZES[:1]
    want = [
      (k, ci, co, n, hw, mode)
      for mode in sweep.MODES
      for k, (ci, co), (n, hw) in itertools.product(sweep.FEW_CHANNEL_KS, sweep.FEW_CHANNELS, sizes)
    ]
    assert sorted(points) == sorted(want)
    for k, ci, co, n, (h, w), _ in points:
      assert n * h * w * max(ci, co) * 4 <= sweep.MAX_INPUT_BYTES, (k, ci, co, n, h, w)
    assert sweep.points(full) == sweep.grid(full) + points
    assert sweep.points(full, few_channel=True) == points
  assert (5, 1, 3, 2, (321, 481), "forward") in sweep.few_channel_grid()
  assert (1, 1) in sweep.FEW_CHANNELS and max(map(max, sweep.FEW_CHANNELS)) <= 8
  squares = {(n, (side, side)) for n, side in sweep.SIZES}
  assert not squares & set(sweep.FEW_CHANNEL_SIZES)


def test_rows_name_their_images():
  row = {
    "point": [5, 1, 3, 2, [321, 481], "forward"],
    "threads": 2,
    "picks": ["tf"],
    "seconds": {"auto": 2e-3, "tf": 1e-3},
    "failed": {},
  }
  line = sweep._format(row)
  assert " 321x481 forward" in line and line.endswith("2.00")
  row["point"][4] = 64
  assert "      64 forward" in sweep._format(row)


# A stand-in for the sweep's child: unless it was started with ([7], "tf") stopped, it says it
# is in a call of "tf" at point [7] that began long ago, and waits to be stopped; with it,
# it writes a row for the point, as a child resuming there would.
FAKE_CHILD = """
import json, sys, time
rows_file, stopped = sys.argv[2], json.loads(sys.argv[4])
if [[7], "tf"] not in stopped:
  with open(rows_file + ".calling", "w") as f:
    json.dump({"point": [7], "algorithm": "tf", "since": time.time() - 3600}, f)
  time.sleep(120)
with open(rows_file, "a") as f:
  f.write(json.dumps({"point": [7], "threads": 2, "stopped": stopped}) + "\\n")
"""


def test_a_child_stuck_in_a_call_is_stopped_and_a_new_one_resumes(tmp_path, capsys):
  rows = str(tmp_path / "rows.jsonl")
  start = time.time()
  error = sweep._run_children(["-c", FAKE_CHILD, "--rows-file", rows], rows, limit=5)
  assert error is None
  assert time.time() - start < 60  # the first child was stopped, not waited for
  assert sweep._rows_of(rows, 2) == [{"point": [7], "threads": 2, "stopped": [[[7], "tf"]]}]
  assert "stopped tf at [7]" in capsys.readouterr().out


def test_a_failing_child_is_reported(tmp_path):
  rows = str(tmp_path / "rows.jsonl")
  error = sweep._run_children(["-c", "import sys; sys.exit(3)"], rows, limit=5)
  assert error == "the child failed (exit 3)"


def test_a_child_that_never_says_its_call_still_times_out(tmp_path):
  rows = str(tmp_path / "rows.jsonl")
  start = time.time()
  error = sweep._run_children(["-c", "import time; time.sleep(120)"], rows, limit=5, timeout=3)
  assert error == "timed out after 3 s" and time.time() - start < 60


def test_rows_cut_short_are_skipped_and_a_stopped_auto_is_a_miss(tmp_path):
  rows = tmp_path / "rows.jsonl"
  rows.write_text('{"point": [7], "threads": 2}\n{"point": [15], "thr', encoding="ascii")
  assert sweep._rows_of(str(rows), 2) == [{"point": [7], "threads": 2}]
  stopped = {"seconds": {"fft": 1.0, "tf": 2.0}, "failed": {"auto": "stopped"}}
  assert sweep._verdict(stopped) == (float("inf"), float("inf"))
  alone = {"seconds": {"auto": 1.0}, "failed": {"fft": "stopped"}}
  assert sweep._verdict(alone) == (1.0, None) and sweep._winner(alone) == "auto"
