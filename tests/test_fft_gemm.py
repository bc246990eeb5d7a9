"""Many channels' spectral products as matrix products (cc/core/cpu/fft_gemm.h): at the
instruction-set levels `_core.FFT_GEMM_LEVELS` names (`_core.FFT_GEMM_FILTER_LEVELS` for
the filter gradient), where a pass's channels per group
reach `_core.FFT_GEMM_CHANNELS` (and the tiles and filter spectra are many enough,
`UsesGemm` in cc/core/cpu/fft.h), each frequency bin's channel mixing runs as one complex
matrix product: [destinations x sources] x [sources x tiles] in the forward and
backprop-input passes, [input channels x tiles] x [tiles x output channels] over a sweep of
`_core.FFT_GEMM_SWEEP` tiles in the filter gradient. Checked against the float64 oracle
(tests/reference.py) in float64 and float32, on one thread and two (the same bits, though
the plans cut runs of tiles and channel blocks differently), under a workspace limit that
cuts the blocks smaller, and with a NaN in the input. The tests run at the level this
process runs (AVX unless LARGECONV_ISA says otherwise, tests/conftest.py), where the
plans say whether the matrix products run; `test_the_matrix_product_levels` runs this
module again at each of their levels this machine has."""

import numpy as np
import pytest
import subproc
from reference import Conv
from reference import planned_fft

from tf_largeconv import _core

LEVEL = _core.cpu_isa()["level"]
PASSES = ("forward", "backprop_input", "backprop_filter")
# Whether each pass runs matrix products at this process's level.
GEMM_HERE = {
  name: LEVEL
  in (_core.FFT_GEMM_FILTER_LEVELS if name == "backprop_filter" else _core.FFT_GEMM_LEVELS)
  for name in PASSES
}
# 16 single-tile images of a 24 x 24 transform: 64 x 64 filter spectra of 312 bins, and
# two sweeps of eight tiles in the filter gradient.
X_SHAPE, W_SHAPE = (16, 18, 18, 64), (11, 11, 64, 64)
STRIDES = [1, 1, 1, 1]
# Cuts the 64 destinations into blocks of about 50 and leaves one tile per item; the filter
# gradient's units hold fewer than 64 x 64 channel pairs.
SMALL_LIMIT = 8 << 20


def _plans(limit, threads, x_shape=X_SHAPE, w_shape=W_SHAPE):
  kw = dict(algorithm="fft", workspace_limit=limit, num_threads=threads)
  return {p["pass"]: p for p in _core.plan(list(x_shape), list(w_shape), STRIDES, "SAME", **kw)}


def _run(x, w, dy, limit, threads):
  kw = dict(algorithm="fft", workspace_limit=limit, num_threads=threads)
  y = _core.conv2d(x, w, STRIDES, "SAME", **kw)
  dx = _core.conv2d_backprop_input(list(x.shape), w, dy, STRIDES, "SAME", **kw)
  dw = _core.conv2d_backprop_filter(x, list(w.shape), dy, STRIDES, "SAME", **kw)
  return y, dx, dw


def test_the_levels_and_the_thresholds():
  assert _core.FFT_GEMM_CHANNELS == 64 and _core.FFT_GEMM_SWEEP == 8
  # Measured faster with FMA (docs/benchmarks.md); level with the hand-blocked kernels at
  # AVX, and the filter gradient's at AVX2.
  assert _core.FFT_GEMM_LEVELS == ("avx2", "avx512")
  assert _core.FFT_GEMM_FILTER_LEVELS == ("avx512",)


def test_the_plans_run_matrix_products_where_the_threshold_says():
  for limit in (-1, SMALL_LIMIT):
    for threads in (1, 2):
      passes = _plans(limit, threads)
      for name in PASSES:
        p = passes[name]
        assert p["algorithm"] == "fft" and p["fft_gemm"] == GEMM_HERE[name], p
        assert p["workspace_bytes"] <= limit or limit == -1, p
      for name in ("forward", "backprop_input"):
        p = passes[name]
        # Runs of tiles by default; single tiles and smaller destination blocks under the
        # small limit.
        assert (p["vec_block"] > 1) == (limit == -1), p
        assert (p["out_block"] < 64) == (limit == SMALL_LIMIT), p
      p = passes["backprop_filter"]
      if GEMM_HERE["backprop_filter"]:  # sweeps of FFT_GEMM_SWEEP tiles, any thread count
        assert p["vec_block"] == _core.FFT_GEMM_SWEEP, p
      if limit == SMALL_LIMIT:
        assert p["in_block"] * p["out_block"] < 64 * 64, p
  # One channel fewer, or a quarter of the images (4 tiles), keeps the hand-blocked kernels.
  few = (*X_SHAPE[:3], 63)
  assert not any(p["fft_gemm"] for p in _plans(-1, 1, few, (11, 11, 63, 64)).values())
  assert not any(p["fft_gemm"] for p in _plans(-1, 1, (4, *X_SHAPE[1:])).values())


def test_a_limit_below_the_sweep_keeps_the_tile_by_tile_sums(rng):
  """Where a sweep of FFT_GEMM_SWEEP tiles does not fit the limit even for one channel pair,
  the filter gradient sums tile by tile on any thread count, within the limit, and still
  matches the oracle."""
  limit = 48 << 10  # a sweep of eight tiles of one channel pair takes over 100 KiB
  shapes = (X_SHAPE, W_SHAPE)
  for threads in (1, 2):
    p = _plans(limit, threads, *shapes)["backprop_filter"]
    assert p["algorithm"] == "fft" and not p["fft_gemm"], p
    assert p["vec_block"] < _core.FFT_GEMM_SWEEP and p["workspace_bytes"] <= limit, p
  x = rng.standard_normal(shapes[0])
  dy = rng.standard_normal(shapes[0])
  ref = Conv(shapes[0], shapes[1], (1, 1), "SAME")
  kw = dict(algorithm="fft", workspace_limit=limit)
  dws = [
    _core.conv2d_backprop_filter(x, list(shapes[1]), dy, STRIDES, "SAME", num_threads=t, **kw)
    for t in (1, 2)
  ]
  assert dws[0].tobytes() == dws[1].tobytes()
  fft = planned_fft(_plans(limit, 1, *shapes).values())
  ref.check_passes("float64", fft, x, None, dy, dw=dws[0], what="small limit ")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_gemm_passes_match_the_oracle_on_any_thread_count(rng, dtype):
  ref = Conv(X_SHAPE, W_SHAPE, (1, 1), "SAME")
  x = rng.standard_normal(X_SHAPE).astype(dtype)
  w = rng.standard_normal(W_SHAPE).astype(dtype)
  dy = rng.standard_normal(ref.output_shape()).astype(dtype)
  for limit in (-1, SMALL_LIMIT):
    one, two = _run(x, w, dy, limit, 1), _run(x, w, dy, limit, 2)
    for name, a, b in zip(PASSES, one, two):
      assert a.tobytes() == b.tobytes(), (name, limit)
    fft = planned_fft(_plans(limit, 1).values())
    y, dx, dw = one
    ref.check_passes(dtype, fft, x, w, dy, y=y, dx=dx, dw=dw, what=f"{dtype} limit {limit} ")


def test_a_nan_in_the_input_reaches_the_outputs_it_touches(rng):
  """A non-finite input runs the direct kernels (fft.h, AllFinite): the NaN reaches every
  output (and filter gradient) whose window holds it, and the others are the direct sums
  of the input without it, bit for bit."""
  x = rng.standard_normal(X_SHAPE).astype("float32")
  w = rng.standard_normal(W_SHAPE).astype("float32")
  dy = rng.standard_normal(X_SHAPE).astype("float32")
  x[5, 3, 12, 7] = np.nan
  y = _core.conv2d(x, w, STRIDES, "SAME", algorithm="fft", num_threads=2)
  dw = _core.conv2d_backprop_filter(
    x, list(W_SHAPE), dy, STRIDES, "SAME", algorithm="fft", num_threads=2
  )
  nan = np.zeros(y.shape, bool)
  nan[5, 0 : 3 + 6, 12 - 5 : 12 + 6, :] = True  # 11 x 11 SAME: 5 rows and columns a side
  assert (np.isnan(y) == nan).all()
  # Tap (kh, kw) of input channel 7 meets x[5, 3, 12] from output row 3 + 5 - kh (and
  # column 12 + 5 - kw), which exists for kh <= 8 (and every kw).
  nan_dw = np.zeros(dw.shape, bool)
  nan_dw[0:9, :, 7, :] = True
  assert (np.isnan(dw) == nan_dw).all()
  clean = x.copy()
  clean[5, 3, 12, 7] = 0
  want = _core.conv2d(clean, w, STRIDES, "SAME", algorithm="direct", num_threads=2)
  assert y[~nan].tobytes() == want[~nan].tobytes()
  want_dw = _core.conv2d_backprop_filter(
    clean, list(W_SHAPE), dy, STRIDES, "SAME", algorithm="direct", num_threads=2
  )
  assert dw[~nan_dw].tobytes() == want_dw[~nan_dw].tobytes()


OTHER_GEMM_LEVELS = [
  level
  for level in sorted({*_core.FFT_GEMM_LEVELS, *_core.FFT_GEMM_FILTER_LEVELS})
  if level in _core.cpu_isa()["available"] and level != LEVEL
]


@pytest.mark.skipif(any(GEMM_HERE.values()), reason="runs at a matrix-product level already")
@pytest.mark.parametrize("level", OTHER_GEMM_LEVELS)
def test_the_matrix_product_levels(level):
  """This module at each matrix-product level this machine runs, in a child of its own (a
  level is chosen once per process)."""
  env = subproc.child_env(LARGECONV_ISA=level)
  args = ["-q", "-x", "-p", "no:cacheprovider", __file__, "-k", "not matrix_product_levels"]
  out = subproc.run("-m pytest", *args, timeout=1800, env=env).stdout
  assert " passed" in out and "failed" not in out and "skipped" not in out, out[-2000:]
