"""The planner sweep's grid (benchmarks/cpu/sweep.py) covers what its goals are stated
over: every filter size, channel pair and mode, every batch and image size, and no input or
output over the sweep's memory bound. Its verdicts count TF's out-of-memory as a win."""

import itertools

import pytest

from benchmarks.cpu import sweep


def _fits(n, side, ci, co):
  return n * side * side * max(ci, co) * 4 <= sweep.MAX_INPUT_BYTES


def test_the_default_grid_has_one_point_per_cell_and_every_size():
  points = sweep.grid()
  cells = [p[:3] + p[5:] for p in points]
  want = [(k, ci, co, mode) for mode in sweep.MODES
          for k, (ci, co) in itertools.product(sweep.KS, sweep.CHANNELS)]
  assert sorted(cells) == sorted(want)  # every cell once, however many channels it has
  assert {(n, side) for _, _, _, n, side, _ in points} == set(sweep.SIZES)
  for k, ci, co, n, side, _ in points:
    assert _fits(n, side, ci, co), (k, ci, co, n, side)
  # A channel pair meets several sizes across the filter sizes, not one size throughout.
  for ci, co in sweep.CHANNELS:
    sizes = {(n, side) for k, a, b, n, side, mode in points
             if (a, b) == (ci, co) and mode == "forward"}
    assert len(sizes) > 1, (ci, co)


def test_the_full_grid_takes_every_combination_that_fits():
  points = sweep.grid(full=True)
  want = [(k, ci, co, n, side, mode) for mode in sweep.MODES
          for k, (ci, co), (n, side) in itertools.product(sweep.FULL_KS, sweep.FULL_CHANNELS,
                                                          sweep.SIZES)
          if _fits(n, side, ci, co)]
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
