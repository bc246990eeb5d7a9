"""The filter-spectrum cache (cc/core/cpu/spectrum_cache.h): spectra kept from one call for the
next are used only for the very filter they came from, give bitwise the results of a call
that transforms the filter, and stay within LARGECONV_SPECTRUM_CACHE_MIB."""

import threading

import numpy as np
import pytest
import reference
import tensorflow as tf

import tf_largeconv as lc
from tf_largeconv import _core

ENV = "LARGECONV_SPECTRUM_CACHE_MIB"
ONES = [1, 1, 1, 1]


def _touch():
  """An FFT call, after which the cache is within the current budget."""
  _core.conv2d(
    np.ones((1, 8, 8, 1), np.float32),
    np.ones((5, 5, 1, 1), np.float32),
    ONES,
    "SAME",
    algorithm="fft",
  )


@pytest.fixture
def cache_mib(monkeypatch):
  """Sets the budget (read by the kernels on every call); each test starts with an empty
  cache and 64 MiB."""

  def set_mib(mib):
    monkeypatch.setenv(ENV, str(mib))

  set_mib(0)
  _touch()
  set_mib(64)
  return set_mib


def _rand(shape, seed):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _check(pass_name, conv, got, a, b, fft):
  conv.check(pass_name, got, a, b, "float32", fft[pass_name], pass_name)


def test_same_filter_reuses_spectra_and_changed_filter_does_not(cache_mib):
  x, w = _rand((2, 40, 44, 3), 0), _rand((21, 21, 3, 2), 1)
  conv = reference.Conv(x.shape, w.shape, padding="SAME")
  fft = reference.planned_fft(_core.plan(x.shape, w.shape, ONES, "SAME", algorithm="fft"))
  cache_mib(0)  # the reference: the filter transformed on every call
  fresh = _core.conv2d(x, w, ONES, "SAME", algorithm="fft")
  assert _core._spectrum_cache() == (0, 0)
  cache_mib(64)
  got = [_core.conv2d(x, w, ONES, "SAME", algorithm="fft") for _ in range(3)]
  entries, held = _core._spectrum_cache()
  assert entries == 1 and held > w.nbytes  # kept on the second call
  for y in got:
    np.testing.assert_array_equal(y, fresh)
  _check("forward", conv, got[-1], x, w, fft)
  # The same buffer, new values: the kept spectra must not be used.
  w[10, 3, 1, 0] += 1.0
  w_new = w.copy()
  y = _core.conv2d(x, w, ONES, "SAME", algorithm="fft")
  _check("forward", conv, y, x, w_new, fft)
  cache_mib(0)
  np.testing.assert_array_equal(y, _core.conv2d(x, w_new, ONES, "SAME", algorithm="fft"))


def test_forward_and_input_gradient_keep_their_own_spectra(cache_mib):
  # Both passes transform the same filter at the same size here; the flipped filter of the
  # input gradient has other spectra.
  x, w = _rand((1, 48, 48, 2), 2), _rand((17, 17, 2, 2), 3)
  conv = reference.Conv(x.shape, w.shape, padding="SAME")
  plan = _core.plan(x.shape, w.shape, ONES, "SAME", algorithm="fft")
  fft = reference.planned_fft(plan)
  assert fft["forward"] == fft["backprop_input"]
  dy = _rand(conv.output_shape(), 4)
  for _ in range(3):
    y = _core.conv2d(x, w, ONES, "SAME", algorithm="fft")
    dx = _core.conv2d_backprop_input(x.shape, w, dy, ONES, "SAME", algorithm="fft")
  _check("forward", conv, y, x, w, fft)
  _check("backprop_input", conv, dx, w, dy, fft)
  assert _core._spectrum_cache()[0] == 2


def test_blocks_of_a_pass_share_one_entry(cache_mib):
  # A workspace limit that leaves room for 3 of the 8 output channels' filter spectra at a
  # time: three blocks, whose spectra one entry holds in the blocks' order.
  x, w = _rand((2, 40, 40, 8), 14), _rand((15, 15, 8, 8), 15)
  limit = 400000
  plan = _core.plan(x.shape, w.shape, ONES, "SAME", algorithm="fft", workspace_limit=limit)
  assert plan[0]["out_block"] == 3
  run = lambda w: _core.conv2d(x, w, ONES, "SAME", algorithm="fft", workspace_limit=limit)  # noqa: E731
  cache_mib(0)
  fresh = run(w)
  cache_mib(64)
  got = [run(w) for _ in range(3)]
  assert _core._spectrum_cache()[0] == 1
  for y in got:
    np.testing.assert_array_equal(y, fresh)
  conv = reference.Conv(x.shape, w.shape, padding="SAME")
  _check("forward", conv, got[-1], x, w, reference.planned_fft(plan))
  w[7, 7, 5, 7] += 1.0  # a value of the last block only
  cache_mib(0)
  want = run(w)
  cache_mib(64)
  np.testing.assert_array_equal(run(w), want)


def test_budget_binds(cache_mib):
  x, w = _rand((1, 64, 64, 1), 5), _rand((31, 31, 1, 1), 6)
  for _ in range(2):
    _core.conv2d(x, w, ONES, "SAME", algorithm="fft")
  entries, held = _core._spectrum_cache()
  assert entries == 1
  # A budget just under the entry's size keeps nothing; just over keeps it.
  cache_mib((held - 1) / 2**20)
  for _ in range(3):
    _core.conv2d(x, w, ONES, "SAME", algorithm="fft")
  assert _core._spectrum_cache() == (0, 0)
  cache_mib((held + 1) / 2**20)
  for _ in range(2):
    _core.conv2d(x, w, ONES, "SAME", algorithm="fft")
  assert _core._spectrum_cache() == (1, held)
  cache_mib(0)
  _touch()
  assert _core._spectrum_cache() == (0, 0)  # off frees everything
  cache_mib((held + 1) / 2**20)
  for _ in range(2):
    _core.conv2d(x, w, ONES, "SAME", algorithm="fft")
  # A second filter evicts the first, least recently used, entry.
  w2 = _rand(w.shape, 7)
  for _ in range(2):
    _core.conv2d(x, w2, ONES, "SAME", algorithm="fft")
  assert _core._spectrum_cache() == (1, held)
  w[:] = w2  # so the kept entry is the second filter's: this call must hit it
  y = _core.conv2d(x, w, ONES, "SAME", algorithm="fft")
  cache_mib(0)
  np.testing.assert_array_equal(y, _core.conv2d(x, w2, ONES, "SAME", algorithm="fft"))


def test_first_sight_keeps_nothing(cache_mib):
  # A training loop's filter changes every step: nothing is copied in.
  x = _rand((1, 50, 50, 1), 8)
  w = _rand((25, 25, 1, 1), 9)
  for step in range(4):
    _core.conv2d(x, w + step, ONES, "SAME", algorithm="fft")
  assert _core._spectrum_cache() == (0, 0)


def test_op_variable_assigned_between_calls(cache_mib):
  x = tf.constant(_rand((2, 36, 40, 2), 10))
  v = tf.Variable(_rand((19, 19, 2, 3), 11))
  f = tf.function(lambda x: lc.conv2d(x, v, 1, "SAME", algorithm="fft"))
  for _ in range(3):
    y = f(x)
  np.testing.assert_allclose(y, tf.nn.conv2d(x, v, 1, "SAME"), rtol=1e-4, atol=1e-4)
  v.assign(_rand(v.shape, 12))
  y = f(x)
  np.testing.assert_allclose(y, tf.nn.conv2d(x, v, 1, "SAME"), rtol=1e-4, atol=1e-4)
  v.assign_add(tf.ones_like(v) * 1e-3)  # a change in every value, well below the tolerance
  y, want = f(x).numpy(), tf.nn.conv2d(x, v, 1, "SAME").numpy()
  err = np.abs(y - want).max()
  assert err < 1e-4, err


def test_threads_with_different_filters(cache_mib):
  x = _rand((1, 48, 48, 1), 13)
  filters = [_rand((23, 23, 1, 2), 20 + i) for i in range(4)]
  want = [_core.conv2d(x, w, ONES, "SAME", algorithm="fft") for w in filters]
  errors = []

  def work(i):
    try:
      for r in range(6):
        w = filters[(i + r) % 4]
        y = _core.conv2d(x, w, ONES, "SAME", algorithm="fft", num_threads=1)
        if not np.array_equal(y, want[(i + r) % 4]):
          errors.append((i, r))
    except Exception as e:
      errors.append(e)

  threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  assert not any(t.is_alive() for t in threads)
  assert not errors, errors


def test_plan_prices_the_fft_with_kept_spectra():
  # One input and one output channel: a forward pass of b images of one 80x80 tile takes
  # one filter transform and 2b tile transforms, all the same size, so the reported work of
  # b = 2 and b = 4 (5 and 9 transforms, the spectral products doubled) gives the price of
  # one transform: twice the first, less the second. Kept spectra save exactly that one.
  plans = {
    b: _core.plan([b, 64, 64, 1], [31, 31, 1, 1], ONES, "SAME", algorithm="fft", num_threads=2)
    for b in (2, 4)
  }
  work = {b: p[0]["fft_work"] for b, p in plans.items()}
  assert [plans[b][0]["fft"] for b in (2, 4)] == [(80, 80)] * 2
  assert [work[b]["transforms"] for b in (2, 4)] == [5, 9]
  one_transform = 2 * work[2]["seconds"] - work[4]["seconds"]
  assert one_transform > 0
  for b, passes in plans.items():
    forward, backprop_input, backprop_filter = passes
    # The plan's costs are reference-thread seconds: the single-thread work scaled alike.
    scale = forward["cost_fft"] / work[b]["seconds"]
    saved = forward["cost_fft"] - forward["cost_fft_kept"]
    np.testing.assert_allclose(saved, one_transform * scale, rtol=1e-9, err_msg=str(b))
    assert forward["kept_spectra_bytes"] == 80 * 41 * 8 + 31 * 31 * 4
    assert 0 < backprop_input["cost_fft_kept"] < backprop_input["cost_fft"]
    assert backprop_input["kept_spectra_bytes"] > 0
    # The filter pass keeps no spectra.
    assert backprop_filter["cost_fft_kept"] < 0 and backprop_filter["kept_spectra_bytes"] == 0
  # What lc.plan reports and prints.
  plan = lc.plan([4, 64, 64, 1], [31, 31, 1, 1], 1, "SAME", algorithm="fft", num_threads=2)
  assert plan.forward.kept_spectra_seconds == plans[4][0]["cost_fft_kept"]
  assert plan.forward.kept_spectra_bytes == plans[4][0]["kept_spectra_bytes"]
  assert plan.backprop_filter.kept_spectra_seconds is None
  header, forward_row = str(plan).splitlines()[1:3]
  priced = [a for a in _core.ALGORITHMS if a != "auto"]  # every algorithm, then kept spectra
  assert header.endswith(" / ".join([*priced, "fft kept"]))
  assert forward_row.endswith(f" / {plan.forward.kept_spectra_seconds * 1e3:.4g}")
  # Every channel pair's spectrum, in the element type's complex values.
  p = _core.plan([1, 64, 64, 3], [31, 31, 3, 2], ONES, "SAME", algorithm="auto", dtype="float64")[0]
  fh, fw = p["fft"]
  assert p["kept_spectra_bytes"] == 3 * 2 * fh * (fw // 2 + 1) * 16 + 31 * 31 * 3 * 2 * 8
