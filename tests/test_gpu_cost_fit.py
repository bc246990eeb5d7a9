"""The GPU cost model's FFT terms and the fit of its rates (benchmarks/gpu/fft_steps.py --fit),
on the host emulation's planner: no GPU needed."""

import json

import pytest

from benchmarks.gpu import fft_steps
from tf_largeconv import _core

pytest.importorskip("scipy")

# (input NCHW, filter HWIO, padding, workspace limit): steps of different shapes and rounds.
GEOMETRIES = [
  ((4, 1, 161, 241), (67, 67, 1, 3), "VALID", -1),
  ((4, 1, 161, 241), (67, 67, 1, 3), "VALID", 1 << 20),
  ((8, 16, 64, 64), (31, 31, 16, 16), "SAME", -1),
  ((8, 32, 28, 28), (31, 31, 1, 32), "SAME", -1),
  ((8, 32, 28, 28), (31, 31, 1, 32), "SAME", 2 << 20),
  ((2, 8, 1, 4096), (1, 511, 8, 8), "SAME", -1),
]


def _rows():
  rows = []
  for x, w, padding, limit in GEOMETRIES:
    plans = _core.cuda_plan(
      list(x),
      list(w),
      [1, 1, 1, 1],
      padding,
      data_format="NCHW",
      algorithm="fft",
      workspace_limit=limit,
    )
    assert all(p["algorithm"] == "fft" for p in plans)
    rows.append(
      {
        "case": f"{x}*{w}",
        "limit": limit,
        "terms": [p["fft_terms"] for p in plans],
        "model ms": 1e3 * sum(p["cost_fft"] for p in plans),
      }
    )
  return rows


def _fit(tmp_path, rows):
  path = tmp_path / "steps.json"
  path.write_text(json.dumps({"device": "host", "rows": rows}))
  return fft_steps.fit([str(path)])


def test_terms_are_what_the_cost_is_made_of(tmp_path):
  # Steps measured exactly as modelled: the fit finds rates that give every step's modelled
  # cost back, which holds only if cost_fft is the terms at fixed rates.
  rows = [dict(r, **{"event ms": r["model ms"]}) for r in _rows()]
  rates, fitted = _fit(tmp_path, rows)
  for _, _, _, measured, _, model in fitted:
    assert model == pytest.approx(measured, rel=1e-6)
  assert rates["kTransformBytesPerSec"] > 0 and rates["kLaunchSec"] > 0


def test_fit_recovers_known_rates(tmp_path):
  transform, product, launch = 2.0e12, 5.0e12, 4.0e-6
  rows = _rows()
  for r in rows:
    r["event ms"] = 1e3 * sum(t / transform + p / product + n * launch for t, p, n in r["terms"])
  rates, fitted = _fit(tmp_path, rows)
  assert rates["kTransformBytesPerSec"] == pytest.approx(transform, rel=1e-6)
  assert rates["kProductBytesPerSec"] == pytest.approx(product, rel=1e-6)
  assert rates["kLaunchSec"] == pytest.approx(launch, rel=1e-6)
  assert len(fitted) == len(GEOMETRIES)


def test_terms_scale_with_the_work():
  # Twice the batch: twice the bytes of the per-item terms (the filter spectra's share
  # aside), and more launches only where rounds are added.
  one = _core.cuda_plan(
    [8, 16, 64, 64], [31, 31, 16, 16], [1, 1, 1, 1], "SAME", data_format="NCHW", algorithm="fft"
  )[0]
  two = _core.cuda_plan(
    [16, 16, 64, 64], [31, 31, 16, 16], [1, 1, 1, 1], "SAME", data_format="NCHW", algorithm="fft"
  )[0]
  assert one["fft"] == two["fft"]
  t1, p1, _ = one["fft_terms"]
  t2, p2, _ = two["fft_terms"]
  assert p2 == pytest.approx(2 * p1, rel=1e-12)
  assert t1 < t2 < 2 * t1
