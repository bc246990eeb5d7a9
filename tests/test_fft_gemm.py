"""Many channels' spectral products as matrix products (cc/core/cpu/fft_gemm.h): where a
pass's source and destination channels per group reach `_core.FFT_GEMM_CHANNELS` (and
the tiles and filter spectra are many enough, `UsesGemm` in cc/core/cpu/fft.h), the
forward and backprop-input passes multiply each frequency bin's [destinations x sources] x
[sources x tiles] by Eigen's matrix product. Checked against the float64 oracle
(tests/reference.py) in float64 and float32, on one thread and two (the same bits,
though the plans cut runs of tiles and destination blocks differently), under a
workspace limit that cuts the destinations into blocks and the runs into single tiles,
and with a NaN in the input."""

import numpy as np
import pytest
from reference import Conv
from reference import planned_fft

from tf_largeconv import _core

GEMM_PASSES = ("forward", "backprop_input")
# 16 single-tile images of a 24 x 24 transform: 64 x 64 filter spectra of 312 bins.
X_SHAPE, W_SHAPE = (16, 18, 18, 64), (11, 11, 64, 64)
STRIDES = [1, 1, 1, 1]
# Cuts the 64 destinations into blocks of about 50 and leaves one tile per item.
SMALL_LIMIT = 8 << 20


def _plans(limit, threads, x_shape=X_SHAPE, w_shape=W_SHAPE):
  kw = dict(algorithm="fft", workspace_limit=limit, num_threads=threads)
  return {p["pass"]: p for p in _core.plan(list(x_shape), list(w_shape), STRIDES, "SAME", **kw)}


def _run(x, w, dy, limit, threads):
  kw = dict(algorithm="fft", workspace_limit=limit, num_threads=threads)
  y = _core.conv2d(x, w, STRIDES, "SAME", **kw)
  dx = _core.conv2d_backprop_input(list(x.shape), w, dy, STRIDES, "SAME", **kw)
  return y, dx


def test_the_plans_run_matrix_products_where_the_threshold_says():
  assert _core.FFT_GEMM_CHANNELS == 64
  for limit in (-1, SMALL_LIMIT):
    for threads in (1, 2):
      passes = _plans(limit, threads)
      for name in GEMM_PASSES:
        p = passes[name]
        assert p["algorithm"] == "fft" and p["fft_gemm"], p
        # Runs of tiles by default; single tiles and smaller destination blocks under the
        # small limit.
        assert (p["vec_block"] > 1) == (limit == -1), p
        assert (p["out_block"] < 64) == (limit == SMALL_LIMIT), p
      assert not passes["backprop_filter"]["fft_gemm"]
  # One channel fewer, or a quarter of the images (4 tiles), keeps the hand-blocked kernels.
  few = (*X_SHAPE[:3], 63)
  assert not any(p["fft_gemm"] for p in _plans(-1, 1, few, (11, 11, 63, 64)).values())
  assert not any(p["fft_gemm"] for p in _plans(-1, 1, (4, *X_SHAPE[1:])).values())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gemm_passes_match_the_oracle_on_any_thread_count(rng, dtype):
  ref = Conv(X_SHAPE, W_SHAPE, (1, 1), "SAME")
  x = rng.standard_normal(X_SHAPE).astype(dtype)
  w = rng.standard_normal(W_SHAPE).astype(dtype)
  dy = rng.standard_normal(ref.output_shape()).astype(dtype)
  for limit in (-1, SMALL_LIMIT):
    y1, dx1 = _run(x, w, dy, limit, 1)
    y2, dx2 = _run(x, w, dy, limit, 2)
    assert y1.tobytes() == y2.tobytes(), limit
    assert dx1.tobytes() == dx2.tobytes(), limit
    fft = planned_fft(_plans(limit, 1).values())
    ref.check_passes(dtype, fft, x, w, dy, y=y1, dx=dx1, what=f"{dtype} limit {limit} ")


def test_a_nan_in_the_input_reaches_the_outputs_it_touches(rng):
  """A non-finite input runs the direct kernels (fft.h, AllFinite): the NaN reaches every
  output whose window holds it, and the others are the direct sums of the input without
  it, bit for bit."""
  x = rng.standard_normal(X_SHAPE).astype("float32")
  w = rng.standard_normal(W_SHAPE).astype("float32")
  x[5, 3, 12, 7] = np.nan
  y = _core.conv2d(x, w, STRIDES, "SAME", algorithm="fft", num_threads=2)
  nan = np.zeros(y.shape, bool)
  nan[5, 0 : 3 + 6, 12 - 5 : 12 + 6, :] = True  # 11 x 11 SAME: 5 rows and columns a side
  assert (np.isnan(y) == nan).all()
  clean = x.copy()
  clean[5, 3, 12, 7] = 0
  want = _core.conv2d(clean, w, STRIDES, "SAME", algorithm="direct", num_threads=2)
  assert y[~nan].tobytes() == want[~nan].tobytes()
