"""The pool of workspaces kept between calls of the CPU kernels (cc/tf/workspace_pool.h): a
reused workspace, stale values of another problem in it, gives bitwise the results of a
fresh one; the pool holds at most LARGECONV_WORKSPACE_POOL_MIB of idle workspaces."""

import threading

import numpy as np
import pytest
import reference
import tensorflow as tf

import tf_largeconv as lc
from tf_largeconv import _loader

ENV = "LARGECONV_WORKSPACE_POOL_MIB"
MiB = 2**20


def _rand(shape, seed, scale=1.0):
  return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def _forward(x, w):
  return lc.conv2d(x, w, 1, "SAME", algorithm="fft").numpy()


def _workspace(x_shape, w_shape, pass_name="forward"):
  return getattr(lc.plan(x_shape, w_shape, 1, "SAME", algorithm="fft"), pass_name).workspace_bytes


@pytest.fixture
def pool_mib(monkeypatch):
  """Sets the budget (read on every call); each test starts with an empty pool. Filter
  spectra are not kept, so every call transforms its filter into the workspace."""
  monkeypatch.setenv("LARGECONV_SPECTRUM_CACHE_MIB", "0")

  def set_mib(mib):
    monkeypatch.setenv(ENV, str(mib))

  set_mib(0)
  _forward(_rand((1, 8, 8, 1), 0), _rand((5, 5, 1, 1), 1))  # a budget of 0 empties it
  assert _loader.workspace_pool_stats()[:2] == (0, 0)
  return set_mib


def test_a_kept_workspace_is_reused_with_the_same_bits(pool_mib):
  x, w = _rand((2, 40, 44, 3), 2), _rand((21, 21, 3, 4), 3)
  fresh = _forward(x, w)  # budget 0: nothing kept
  assert _loader.workspace_pool_stats()[:2] == (0, 0)
  pool_mib(64)
  reuses = _loader.workspace_pool_stats()[2]
  got = [_forward(x, w) for _ in range(3)]
  idle, idle_bytes, reused = _loader.workspace_pool_stats()
  assert (idle, reused - reuses) == (1, 2)  # kept after the first call, reused by the others
  assert idle_bytes >= _workspace(x.shape, w.shape)
  for y in got:
    np.testing.assert_array_equal(y, fresh)
  conv = reference.Conv(x.shape, w.shape, padding="SAME")
  conv.check("forward", got[-1], x, w, "float32")


def test_every_pass_gives_fresh_bits_in_another_problems_workspace(pool_mib):
  # B's passes run in the workspace A's passes left, full of A's spectra (A scaled up so
  # that stale values would show), and must give what they give in fresh workspaces.
  xa, wa = _rand((2, 48, 48, 4), 4, 1e3), _rand((25, 25, 4, 4), 5, 1e3)
  xb, wb = _rand((2, 40, 36, 4), 6), _rand((21, 21, 4, 4), 7)
  conv = reference.Conv(xb.shape, wb.shape, padding="SAME")
  dyb = _rand(conv.output_shape(), 8)
  dya = _rand(reference.Conv(xa.shape, wa.shape, padding="SAME").output_shape(), 9, 1e3)
  passes = {
    "forward": (lambda x, w, dy: lc.conv2d(x, w, 1, "SAME", algorithm="fft"), "forward"),
    "backprop_input": (
      lambda x, w, dy: lc.conv2d_backprop_input(x.shape, w, dy, 1, "SAME", algorithm="fft"),
      "backprop_input",
    ),
    "backprop_filter": (
      lambda x, w, dy: lc.conv2d_backprop_filter(x, w.shape, dy, 1, "SAME", algorithm="fft"),
      "backprop_filter",
    ),
  }
  for name, (run, _) in passes.items():
    big, small = _workspace(xa.shape, wa.shape, name), _workspace(xb.shape, wb.shape, name)
    assert small <= big <= 2 * small, (name, small, big)  # B can take A's workspace
    pool_mib(0)
    fresh = run(xb, wb, dyb).numpy()
    pool_mib(64)
    run(xa, wa, dya).numpy()  # kept: A's workspace
    reuses = _loader.workspace_pool_stats()[2]
    got = run(xb, wb, dyb).numpy()
    assert _loader.workspace_pool_stats()[2] == reuses + 1, name
    np.testing.assert_array_equal(got, fresh, err_msg=name)
    a, b = {"forward": (xb, wb), "backprop_input": (wb, dyb), "backprop_filter": (xb, dyb)}[name]
    conv.check(name, got, a, b, "float32")


def test_idle_workspaces_stay_within_the_budget(pool_mib):
  x, w = _rand((2, 40, 44, 3), 10), _rand((21, 21, 3, 4), 11)
  xc, wc = _rand((2, 64, 64, 3), 12), _rand((31, 31, 3, 4), 13)
  small, large = _workspace(x.shape, w.shape), _workspace(xc.shape, wc.shape)
  assert large > small
  pool_mib(64)
  _forward(_rand((1, 8, 8, 1), 14), _rand((5, 5, 1, 1), 15))  # 2.5 KB: not kept
  assert _loader.workspace_pool_stats()[:2] == (0, 0)
  pool_mib((small - 1) / MiB)  # too small to keep even one
  _forward(x, w)
  _forward(x, w)
  assert _loader.workspace_pool_stats()[:2] == (0, 0)
  budget = (small + large) - 1  # one of the two at a time
  pool_mib(budget / MiB)
  _forward(x, w)
  assert _loader.workspace_pool_stats()[:2] == (1, small)
  _forward(xc, wc)  # kept; the least recently kept one is dropped
  idle, idle_bytes, _ = _loader.workspace_pool_stats()
  assert (idle, idle_bytes) == (1, large) and idle_bytes <= budget
  pool_mib(0)  # a call with a budget of 0 empties the pool
  _forward(x, w)
  assert _loader.workspace_pool_stats()[:2] == (0, 0)


def test_concurrent_calls_take_their_own_workspaces(pool_mib):
  problems = [(_rand((2, 40, 44, 3), 20 + i), _rand((21, 21, 3, 4), 30 + i)) for i in range(4)]
  fresh = [_forward(x, w) for x, w in problems]
  pool_mib(256)
  results = [[] for _ in problems]

  def work(i):
    for _ in range(3):
      results[i].append(_forward(*problems[i]))

  threads = [threading.Thread(target=work, args=(i,)) for i in range(len(problems))]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=300)
  assert not any(t.is_alive() for t in threads)
  for i, runs in enumerate(results):
    assert len(runs) == 3
    for y in runs:
      np.testing.assert_array_equal(y, fresh[i])
  assert 1 <= _loader.workspace_pool_stats()[0] <= len(problems)


def test_conv3d_passes_give_fresh_bits_in_another_problems_workspace(pool_mib):
  # As above for the 3-D kernels: B's forward pass and gradients after A's, A scaled up.
  xa, wa = _rand((1, 13, 13, 13, 2), 40, 1e3), _rand((9, 9, 9, 2, 3), 41, 1e3)
  xb, wb = _rand((1, 12, 13, 12, 2), 42), _rand((7, 7, 7, 2, 3), 43)
  ones = [1, 1, 1, 1, 1]
  for name in ("forward", "backprop_input", "backprop_filter"):
    sizes = [
      getattr(lc.plan_conv3d(x.shape, w.shape, ones, "SAME", algorithm="fft"), name).workspace_bytes
      for x, w in ((xa, wa), (xb, wb))
    ]
    assert sizes[1] <= sizes[0] <= 2 * sizes[1], (name, sizes)

  def step(x, w):
    x, w = tf.constant(x), tf.constant(w)
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = lc.conv3d(x, w, ones, "SAME", algorithm="fft")
      loss = tf.reduce_sum(y * y)
    return [t.numpy() for t in [y] + tape.gradient(loss, [x, w])]

  pool_mib(0)
  fresh = step(xb, wb)
  pool_mib(64)
  step(xa, wa)  # kept: A's workspaces
  reuses = _loader.workspace_pool_stats()[2]
  got = step(xb, wb)
  assert _loader.workspace_pool_stats()[2] == reuses + 3  # each pass reused one
  for g, f in zip(got, fresh):
    np.testing.assert_array_equal(g, f)
  x, w = tf.constant(xb), tf.constant(wb)
  with tf.GradientTape() as tape:
    tape.watch([x, w])
    y = tf.nn.conv3d(x, w, ones, "SAME")
    loss = tf.reduce_sum(y * y)
  want = [y.numpy()] + [t.numpy() for t in tape.gradient(loss, [x, w])]
  for g, v in zip(got, want):
    np.testing.assert_allclose(g, v, rtol=2e-4, atol=2e-4 * np.abs(v).max())


def test_a_call_that_keeps_no_memory_leaves_the_pool_and_the_spectra_alone(pool_mib, monkeypatch):
  """keep_memory=False: each pass's workspace is TF's temporary (the pool neither gives
  nor takes one) and no filter spectra are kept, however often the filter is seen; the
  results are bitwise those of calls that keep both, which the same calls then do."""
  x, w = tf.constant(_rand((2, 40, 44, 3), 50)), tf.constant(_rand((21, 21, 3, 4), 51))
  monkeypatch.setenv("LARGECONV_SPECTRUM_CACHE_MIB", "64")
  pool_mib(64)
  assert _loader.spectrum_cache_stats() == (0, 0)  # emptied by the fixture's call

  def step(keep):
    with tf.GradientTape() as tape:
      tape.watch([x, w])
      y = lc.conv2d(x, w, 1, "SAME", algorithm="fft", keep_memory=keep)
      loss = tf.reduce_sum(y * y)
    return [t.numpy() for t in [y, *tape.gradient(loss, [x, w])]]

  reuses = _loader.workspace_pool_stats()[2]
  lean = [step(False) for _ in range(3)]
  assert _loader.workspace_pool_stats() == (0, 0, reuses)
  assert _loader.spectrum_cache_stats() == (0, 0)
  kept = [step(True) for _ in range(3)]
  idle, idle_bytes, reused = _loader.workspace_pool_stats()
  assert idle >= 1 and idle_bytes >= _workspace(x.shape, w.shape) and reused > reuses
  assert _loader.spectrum_cache_stats()[0] == 2  # the forward's and the input gradient's
  for got in lean[1:] + kept:
    for g, want in zip(got, lean[0], strict=True):
      np.testing.assert_array_equal(g, want)
  conv = reference.Conv(x.shape, w.shape, padding="SAME")
  conv.check("forward", lean[-1][0], x.numpy(), w.numpy(), "float32")
  with pytest.raises(ValueError, match="keep_memory must be True or False"):
    lc.conv2d(x, w, 1, "SAME", keep_memory="no")
