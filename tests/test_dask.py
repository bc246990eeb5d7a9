"""tf_largeconv.dask: chunked convolutions of dask arrays against the in-memory op and the
float64 oracle (every padding, stride, dilation, layout and chunking), the filter gradient's
tree reduction, the per-task memory bound, real dask.distributed clusters (a LocalCluster,
and a scheduler and worker started as processes), a slide on disk larger than the cluster's
memory, the command line, and bad input. Skipped only where the `dask` extra is absent."""

import json
import os
import pickle
import subprocess
import time

import numpy as np
import pytest

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")
tifffile = pytest.importorskip("tifffile")

import clusters  # noqa: E402
import subproc  # noqa: E402
import tensorflow as tf  # noqa: E402
from reference import Conv  # noqa: E402
from reference import assert_close  # noqa: E402

import tf_largeconv as lc  # noqa: E402
import tf_largeconv.dask as ldask  # noqa: E402
from tf_largeconv._problem import ConvProblem  # noqa: E402

CLUSTER_TIMEOUT = clusters.CLUSTER_TIMEOUT


def _explicit(pairs, data_format):
  (t, b), (l, r) = pairs
  if data_format == "NHWC":
    return [[0, 0], [t, b], [l, r], [0, 0]]
  return [[0, 0], [0, 0], [t, b], [l, r]]


def _nchw(a):
  return np.ascontiguousarray(np.transpose(a, (0, 3, 1, 2)))


def _chunks_nchw(chunks):
  return (chunks[0], chunks[3], chunks[1], chunks[2])


def _oracle_check(got, ref, x, w, dtype_name="float32", what="forward"):
  """Elementwise bound of a directly summed result against the float64 oracle."""
  want = ref.forward(x, w)
  magnitude = ref.forward(np.abs(x), np.abs(w))
  assert_close(got, want, dtype_name, ref.kh * ref.kw * ref.ci, magnitude, what)


# Chunkings of a 2 x 23 x 19 x 3 input, NHWC (batch, rows, columns, channels):
CHUNKINGS = {
  "one_chunk": (2, 23, 19, 3),
  "smaller_than_halo": (1, 2, 3, 3),  # the 5x4 filter's halo spans several chunks
  "misaligned": (2, 5, 7, 3),  # chunk edges not multiples of the strides
  "batch_and_channels": (1, 9, 19, 1),  # chunked batch and channel axes
  "irregular": ((1, 1), (4, 1, 11, 7), (8, 8, 3), (2, 1)),
}
# padding as the oracle takes it ('SAME', 'VALID' or ((t, b), (l, r)))
PADDINGS = {
  "same": "SAME",
  "valid": "VALID",
  "explicit": ((2, 5), (0, 3)),
  "explicit_wide": ((9, 1), (0, 8)),  # windows entirely in the padding
}
# (strides, dilations) run for every padding and chunking
WINDOWS = [((1, 1), (1, 1)), ((2, 3), (1, 1)), ((3, 2), (2, 1)), ((1, 2), (1, 3))]


@pytest.mark.parametrize("data_format", ["NHWC", "NCHW"])
@pytest.mark.parametrize("padding", list(PADDINGS), ids=list(PADDINGS))
@pytest.mark.parametrize("chunking", list(CHUNKINGS), ids=list(CHUNKINGS))
def test_conv2d_equals_in_memory_op(rng, chunking, padding, data_format):
  # algorithm='direct' sums each output in a fixed order whatever the window, so the
  # chunked result must equal the in-memory op's bit for bit (and the oracle's bound).
  x = rng.standard_normal((2, 23, 19, 3)).astype(np.float32)
  w = rng.standard_normal((5, 4, 3, 2)).astype(np.float32)
  chunks = CHUNKINGS[chunking]
  pad = PADDINGS[padding]
  if data_format == "NCHW":
    x, chunks = _nchw(x), _chunks_nchw(chunks)
  pad_arg = pad if isinstance(pad, str) else _explicit(pad, data_format)
  xd = da.from_array(x, chunks=chunks)
  for strides, dilations in WINDOWS:
    y = ldask.conv2d(
      xd,
      w,
      list(strides),
      pad_arg,
      data_format=data_format,
      dilations=list(dilations),
      algorithm="direct",
    )
    assert isinstance(y, da.Array)
    got = y.compute(scheduler="sync")
    want = lc.conv2d(
      x,
      w,
      list(strides),
      pad_arg,
      data_format=data_format,
      dilations=list(dilations),
      algorithm="direct",
    ).numpy()
    what = f"strides {strides} dilations {dilations}"
    assert got.shape == want.shape, what
    np.testing.assert_array_equal(got, want, err_msg=what)
    _oracle_check(
      got, Conv(x.shape, w.shape, strides, pad, dilations, data_format), x, w, what=what
    )


@pytest.mark.parametrize("algorithm", ["auto", "fft"])
def test_conv2d_large_filter_fft_matches_oracle(rng, algorithm):
  # A 31x31 filter over 16x16 chunks (halo 30 > chunk), grouped, strided, NCHW: the
  # windows run the FFT, whose rounding differs from the whole array's only within the
  # FFT's error (a relative 1e-5 of the largest possible magnitude is 100x that).
  x = rng.standard_normal((1, 4, 70, 61)).astype(np.float32)
  w = rng.standard_normal((31, 31, 2, 6)).astype(np.float32)
  xd = da.from_array(x, chunks=(1, 3, 16, 16))
  y = ldask.conv2d(xd, w, [2, 1], "SAME", data_format="NCHW", algorithm=algorithm)
  got = y.compute()
  want = lc.conv2d(x, w, [2, 1], "SAME", data_format="NCHW", algorithm=algorithm).numpy()
  ref = Conv(x.shape, w.shape, (2, 1), "SAME", (1, 1), "NCHW")
  exact = ref.forward(x, w)
  bound = 1e-5 * ref.forward(np.abs(x), np.abs(w)).max()
  assert got.shape == want.shape == exact.shape
  assert np.abs(got - exact).max() <= bound
  assert np.abs(got - want).max() <= bound


# (input NHWC, chunks, (kh, kw), multiplier, strides, padding, dilations, data_format)
DEPTHWISE = [
  ((1, 20, 17, 3), (1, 4, 5, 1), (7, 7), 1, (1, 1), "SAME", (1, 1), "NHWC"),
  ((2, 19, 21, 2), (1, 3, 2, 2), (5, 4), 2, (2, 3), "VALID", (1, 1), "NHWC"),
  ((1, 18, 18, 4), (1, 6, 6, 2), (3, 3), 3, (2, 2), "SAME", (2, 2), "NCHW"),
  ((1, 16, 15, 2), (1, 7, 4, 1), (4, 5), 1, (1, 2), ((1, 6), (3, 0)), (2, 1), "NCHW"),
]


@pytest.mark.parametrize("case", DEPTHWISE, ids=[f"case{i}" for i in range(len(DEPTHWISE))])
def test_depthwise_equals_in_memory_op(rng, case):
  x_shape, chunks, (kh, kw), mult, strides, pad, dilations, fmt = case
  x = rng.standard_normal(x_shape).astype(np.float32)
  f = rng.standard_normal((kh, kw, x_shape[3], mult)).astype(np.float32)
  if fmt == "NCHW":
    x, chunks = _nchw(x), _chunks_nchw(chunks)
  pad_arg = pad if isinstance(pad, str) else _explicit(pad, fmt)
  y = ldask.depthwise_conv2d(
    da.from_array(x, chunks=chunks),
    f,
    list(strides),
    pad_arg,
    data_format=fmt,
    dilations=list(dilations),
    algorithm="direct",
  )
  got = y.compute(scheduler="sync")
  want = lc.depthwise_conv2d(
    x, f, list(strides), pad_arg, data_format=fmt, dilations=list(dilations), algorithm="direct"
  ).numpy()
  np.testing.assert_array_equal(got, want)
  grouped = f.reshape(kh, kw, 1, -1)
  _oracle_check(got, Conv(x.shape, grouped.shape, strides, pad, dilations, fmt), x, grouped)


# (input NHWC, input chunks, out_backprop chunks or None (an in-memory array), filter,
#  strides, padding, dilations, data_format, dtype)
BACKPROP = [
  (
    (2, 23, 19, 3),
    (1, 4, 5, 2),
    (1, 3, 2, 1),
    (5, 4, 3, 2),
    (1, 1),
    "SAME",
    (1, 1),
    "NHWC",
    "float32",
  ),
  (
    (2, 23, 19, 3),
    (2, 23, 19, 3),
    (1, 2, 3, 2),
    (5, 4, 3, 2),
    (2, 3),
    "VALID",
    (2, 1),
    "NHWC",
    "float32",
  ),
  (
    (1, 21, 20, 4),
    (1, 8, 3, 4),
    None,
    (3, 5, 2, 6),
    (3, 2),
    ((2, 5), (0, 3)),
    (1, 2),
    "NCHW",
    "float64",
  ),
  (
    (3, 17, 16, 2),
    (2, 5, 16, 1),
    (1, 4, 4, 3),
    (9, 9, 2, 3),
    (1, 1),
    "SAME",
    (1, 1),
    "NHWC",
    "float16",
  ),
]


@pytest.mark.parametrize("case", BACKPROP, ids=[f"case{i}" for i in range(len(BACKPROP))])
def test_backprop_filter_tree_reduction_matches_oracle(rng, case):
  x_shape, x_chunks, dy_chunks, w_shape, strides, pad, dilations, fmt, dtype_name = case
  dtype = np.dtype(dtype_name)
  ref = Conv(
    x_shape if fmt == "NHWC" else (x_shape[0], x_shape[3]) + x_shape[1:3],
    w_shape,
    strides,
    pad,
    dilations,
    fmt,
  )
  x = rng.standard_normal(x_shape).astype(dtype)
  if fmt == "NCHW":
    x, x_chunks = _nchw(x), _chunks_nchw(x_chunks)
  dy = rng.standard_normal(ref.output_shape()).astype(dtype)
  pad_arg = pad if isinstance(pad, str) else _explicit(pad, fmt)
  if dy_chunks is not None:
    dy_chunks = dy_chunks if fmt == "NHWC" else _chunks_nchw(dy_chunks)
    dy_arg = da.from_array(dy, chunks=dy_chunks)
  else:
    dy_arg = dy
  got = ldask.conv2d_backprop_filter(
    da.from_array(x, chunks=x_chunks),
    w_shape,
    dy_arg,
    list(strides),
    pad_arg,
    data_format=fmt,
    dilations=list(dilations),
    algorithm="direct",
  )
  assert isinstance(got, np.ndarray) and got.dtype == dtype and got.shape == w_shape
  want = ref.backprop_filter(x.astype(np.float64), dy.astype(np.float64))
  magnitude = ref.backprop_filter(np.abs(x.astype(np.float64)), np.abs(dy.astype(np.float64)))
  assert_close(got, want, dtype_name, ref.n * ref.oh * ref.ow, magnitude, "backprop_filter")
  in_memory = lc.conv2d_backprop_filter(
    x,
    w_shape,
    dy,
    list(strides),
    pad_arg,
    data_format=fmt,
    dilations=list(dilations),
    algorithm="direct",
  ).numpy()
  assert_close(in_memory, want, dtype_name, ref.n * ref.oh * ref.ow, magnitude, "in-memory")


def test_backprop_filter_is_a_tree_reduction():
  # 2 x 12 x 10 out_backprop chunks = 240 shares: 30 sums of 8, then 4, then 1.
  x = da.zeros((2, 24, 20, 1), chunks=(1, 2, 2, 1), dtype=np.float32)
  dy = da.zeros((2, 24, 20, 1), chunks=(1, 2, 2, 1), dtype=np.float32)
  problem = ConvProblem.conv2d(1, "SAME")
  grad = ldask._graph.backprop_filter(x, [3, 3, 1, 1], dy, problem, "g")
  layer = grad.dask.layers[grad.name]
  sums = {}
  for key in layer:
    if isinstance(key, tuple) and "-sum" in key[0]:
      sums[key[0].rsplit("-", 1)[1]] = sums.get(key[0].rsplit("-", 1)[1], 0) + 1
  assert sums == {"sum0": 30, "sum1": 4, "sum2": 1}
  assert ldask._graph.SPLIT_EVERY == 8


@pytest.mark.parametrize("dtype_name", ["float16", "bfloat16", "float64"])
def test_other_dtypes_equal_in_memory_op(rng, dtype_name):
  dtype = tf.as_dtype(dtype_name).as_numpy_dtype
  x = rng.standard_normal((1, 14, 13, 2)).astype(dtype)
  w = rng.standard_normal((4, 3, 2, 3)).astype(dtype)
  y = ldask.conv2d(da.from_array(x, chunks=(1, 3, 5, 1)), w, 2, "SAME", algorithm="direct")
  got = y.compute()
  assert got.dtype == np.dtype(dtype)
  want = lc.conv2d(x, w, 2, "SAME", algorithm="direct").numpy()
  np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


def test_empty_batch():
  x = da.zeros((0, 9, 8, 2), chunks=(1, 4, 4, 2), dtype=np.float32)
  y = ldask.conv2d(x, np.ones((3, 3, 2, 4), np.float32), 1, "SAME")
  assert y.shape == (0, 9, 8, 4)
  assert y.compute().shape == (0, 9, 8, 4)


def test_output_chunks_follow_the_input_chunks_over_the_stride():
  x = da.zeros((2, 100, 90, 3), chunks=(1, 20, 30, 2), dtype=np.float32)
  y = ldask.conv2d(x, np.ones((5, 5, 3, 4), np.float32), [2, 3], "SAME")
  assert y.chunks == ((1, 1), (10,) * 5, (10,) * 3, (4,))
  y = ldask.conv2d(x, np.ones((11, 11, 3, 4), np.float32), 1, "VALID")
  assert y.chunks == ((1, 1), (20, 20, 20, 20, 10), (30, 30, 20), (4,))
  # edges not multiples of the stride: 0, 25, 50, 75, 100 over 2, rounded up
  x25 = da.zeros((1, 100, 90, 3), chunks=(1, 25, 90, 3), dtype=np.float32)
  y = ldask.conv2d(x25, np.ones((5, 5, 3, 4), np.float32), 2, "SAME")
  assert y.chunks[1] == (13, 12, 13, 12)
  # rows beyond the input's last edge (explicit padding after) get chunks of the first's size
  y = ldask.conv2d(x, np.ones((3, 3, 3, 4), np.float32), 1, [[0, 0], [0, 45], [0, 0], [0, 0]])
  assert y.chunks[1] == (20,) * 7 + (3,)


# --- memory ------------------------------------------------------------------------------


def test_task_memory_formula():
  # An independent count of the largest task: 1 x 40 x 40 x 3 input in 16 x 16 chunks,
  # 7x5 filter dilated 2 (extent 13 x 9), stride 1, SAME: the largest output chunk is
  # 16 x 16 x 4 and reads a (16 + 12) x (16 + 8) x 3 window. The interior one's window lies
  # inside the image: its inputs are its own chunk and halo strips, as large as the window.
  x = da.zeros((1, 40, 40, 3), chunks=(1, 16, 16, 3), dtype=np.float32)
  m = ldask.task_memory(
    x, np.ones((7, 5, 3, 4), np.float32), 1, "SAME", dilations=2, workspace_limit=3 << 20
  )
  assert m.window_bytes == 28 * 24 * 3 * 4
  assert m.output_bytes == 16 * 16 * 4 * 4
  assert m.workspace_bytes == 3 << 20
  assert m.input_bytes == m.window_bytes
  assert m.total == m.window_bytes + m.output_bytes + m.workspace_bytes
  default = ldask.task_memory(x, np.ones((7, 5, 3, 4), np.float32), 1, "SAME")
  assert default.workspace_bytes == 64 << 20


# In a fresh process: one interior task of a 1 x 6000 x 6000 x 1 float32 input (held in
# memory, so its chunks cost nothing more) with a 101x101 filter, after a warm-up task of
# the same shapes; prints the process high-water mark's growth over that task and the
# TaskMemory terms.
MEASURE_TASK = """
import json, sys
import numpy as np, dask, dask.array as da
import tf_largeconv.dask as ldask
from benchmarks import measure
from tf_largeconv.dask import _tasks
x = da.from_array(np.random.default_rng(0).random((1, 6000, 6000, 1), dtype=np.float32),
                  chunks=(1, 2000, 2000, 1))
w = np.random.default_rng(1).random((101, 101, 1, 1), dtype=np.float32)
kwargs = dict(strides=1, padding="SAME", workspace_limit=8 << 20)
y = ldask.conv2d(x, w, **kwargs)
m = ldask.task_memory(x, w, **kwargs)
y.blocks[0, 0, 1, 0].compute(scheduler="sync")       # warm-up: TF and the plan
# The task's output reduced to one element in the same task, so that what is measured is
# the task and not the copy compute() returns.
one = y.blocks[0, 1, 1, 0].map_blocks(lambda b: b[:1, :1, :1, :1].copy(), chunks=(1,) * 4)
_tasks._thread_buffers.__dict__.clear()              # this thread's first window
base = measure.reset_peak_rss()
one.compute(scheduler="sync")
print(json.dumps(dict(growth=measure.peak_rss() - base, window=m.window_bytes,
                      output=m.output_bytes, workspace=m.workspace_bytes)))
"""


def test_task_peak_memory_within_formula():
  out = subproc.run(MEASURE_TASK, timeout=300)
  r = json.loads(out.stdout.strip().splitlines()[-1])
  bound = r["window"] + r["output"] + r["workspace"]
  # The task allocates its window and output chunk (both touched in full) and at most the
  # workspace; 4 MiB covers TF's bookkeeping. A second copy of the window (e.g. handing it
  # to TF by tf.convert_to_tensor) is 16.8 MiB more and fails.
  assert r["growth"] <= bound + (4 << 20), r
  assert r["growth"] >= r["window"] + r["output"] - (1 << 20), r


def test_window_buffer_is_reused_only_when_free(rng):
  from tf_largeconv.dask import _tasks

  chunk = rng.random((1, 6, 7, 2), dtype=np.float32)
  window = _tasks.Window(
    (1, 8, 7, 2),
    [((slice(None),) * 4, (slice(None), slice(1, 7), slice(None), slice(None)))],
    [slice(0, 1), slice(1, 7), slice(0, 7), slice(0, 2)],
  )
  a = window.assemble([chunk], np.float32)
  want = np.pad(chunk, ((0, 0), (1, 1), (0, 0), (0, 0)))
  np.testing.assert_array_equal(a, want)
  address = a.ctypes.data
  assert address % 64 == 0
  assert np.shares_memory(a, _tasks._thread_buffers.raw)  # the thread's buffer
  del a
  b = window.assemble([chunk * 2], np.float32)  # nothing refers to the first: reused
  assert b.ctypes.data == address and np.shares_memory(b, _tasks._thread_buffers.raw)
  np.testing.assert_array_equal(b, 2 * want)
  held = _tasks.as_tensor(b)  # a tensor sharing the buffer is alive
  del b
  c = window.assemble([chunk * 3], np.float32)
  assert c.ctypes.data != address
  np.testing.assert_array_equal(held.numpy(), 2 * want)  # not overwritten
  np.testing.assert_array_equal(c, 3 * want)


def test_output_chunks_share_the_ops_memory(rng):
  from tf_largeconv.dask import _tasks

  t = tf.constant(rng.random((1, 5, 4, 3), dtype=np.float32))
  a = _tasks.as_array(t)
  assert a.ctypes.data == np.from_dlpack(t).ctypes.data and not a.flags.writeable
  np.testing.assert_array_equal(a, t.numpy())
  b = tf.constant(rng.random((1, 5, 4, 3)), dtype=tf.bfloat16)  # no DLPack in numpy
  np.testing.assert_array_equal(_tasks.as_array(b), b.numpy())
  # What compute() returns is writeable all the same (dask assembles the chunks).
  x = da.from_array(rng.random((1, 9, 8, 2), dtype=np.float32), chunks=(1, 9, 8, 2))
  y = ldask.conv2d(x, rng.random((3, 3, 2, 2), dtype=np.float32), 1, "SAME")
  assert y.compute(scheduler="sync").flags.writeable


# --- dask.distributed --------------------------------------------------------------------


def _threads(client):
  return client.run(tf.config.threading.get_intra_op_parallelism_threads)


def test_local_cluster_two_worker_processes(rng):
  x = rng.standard_normal((2, 60, 50, 3)).astype(np.float32)
  w = rng.standard_normal((9, 7, 3, 4)).astype(np.float32)
  f = rng.standard_normal((5, 5, 3, 2)).astype(np.float32)
  dy = rng.standard_normal((2, 30, 17, 4)).astype(np.float32)
  xd = da.from_array(x, chunks=(1, 16, 16, 3))
  start = time.monotonic()
  with (
    clusters.local_cluster("1GiB") as cluster,
    distributed.Client(cluster, timeout=CLUSTER_TIMEOUT) as client,
  ):
    y = ldask.conv2d(xd, w, [2, 3], "SAME", algorithm="direct")
    dw = ldask.depthwise_conv2d(xd, f, 1, "VALID", algorithm="direct")
    got_y, got_dw = client.compute([y, dw], sync=True)
    grad = ldask.conv2d_backprop_filter(
      xd, w.shape, da.from_array(dy, chunks=(1, 8, 8, 4)), [2, 3], "SAME", algorithm="direct"
    )
    # every task ran on the workers, each with TF's intra-op pool set to its one thread
    assert _threads(client) == {a: 1 for a in client.scheduler_info()["workers"]}
    assert len(client.scheduler_info()["workers"]) == 2
  assert time.monotonic() - start < CLUSTER_TIMEOUT
  np.testing.assert_array_equal(got_y, lc.conv2d(x, w, [2, 3], "SAME", algorithm="direct").numpy())
  np.testing.assert_array_equal(
    got_dw, lc.depthwise_conv2d(x, f, [1, 1, 1, 1], "VALID", algorithm="direct").numpy()
  )
  ref = Conv(x.shape, w.shape, (2, 3), "SAME")
  assert_close(
    grad,
    ref.backprop_filter(x, dy),
    "float32",
    ref.n * ref.oh * ref.ow,
    ref.backprop_filter(np.abs(x), np.abs(dy)),
    "backprop_filter",
  )


@pytest.fixture
def scheduler_and_worker(tmp_path):
  """A `dask scheduler` and a `dask worker` (2 threads, 1 GiB) as processes on 127.0.0.1;
  yields the scheduler's address; both are stopped at the end (killed after 20 s)."""
  scheduler_file = tmp_path / "scheduler.json"
  env = subproc.child_env()
  procs = []
  try:
    procs.append(
      subproc.start(
        f"-m distributed.cli.dask_scheduler --host 127.0.0.1 --port 0 --no-dashboard "
        f"--scheduler-file {scheduler_file}",
        env=env,
        cwd=tmp_path,
      )
    )
    deadline = time.monotonic() + CLUSTER_TIMEOUT
    while not scheduler_file.exists():
      assert procs[0].poll() is None, subproc.describe(procs[0], *procs[0].communicate())
      assert time.monotonic() < deadline, "the scheduler did not start"
      time.sleep(0.2)
    time.sleep(0.2)  # the file is written in one go, but let it close
    address = json.loads(scheduler_file.read_text())["address"]
    assert address.startswith("tcp://127.0.0.1:")
    procs.append(
      subproc.start(
        f"-m distributed.cli.dask_worker {address} --nthreads 2 --nworkers 1 "
        f"--memory-limit 1GiB --host 127.0.0.1 --no-dashboard",
        env=env,
        cwd=tmp_path,
      )
    )
    yield address
  finally:
    for p in reversed(procs):  # the worker first; SIGTERM lets its nanny stop its process
      p.terminate()
      try:
        p.communicate(timeout=20)
      except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()


def _small_tiff(path, rng, shape=(130, 150, 3)):
  slide = rng.integers(0, 256, shape, dtype=np.uint8)
  tifffile.imwrite(path, slide, tile=(32, 32))
  return slide


def test_scheduler_and_worker_processes(rng, tmp_path, scheduler_and_worker):
  x = rng.standard_normal((1, 45, 52, 2)).astype(np.float32)
  w = rng.standard_normal((11, 11, 2, 3)).astype(np.float32)
  with distributed.Client(scheduler_and_worker, timeout=CLUSTER_TIMEOUT) as client:
    client.wait_for_workers(1, timeout=CLUSTER_TIMEOUT)
    y = ldask.conv2d(
      da.from_array(x, chunks=(1, 8, 20, 1)),
      w,
      1,
      [[0, 0], [3, 7], [5, 0], [0, 0]],
      dilations=2,
      algorithm="direct",
    )
    got = client.compute(y, sync=True)
    assert list(_threads(client).values()) == [2]
  want = lc.conv2d(
    x, w, 1, [[0, 0], [3, 7], [5, 0], [0, 0]], dilations=2, algorithm="direct"
  ).numpy()
  np.testing.assert_array_equal(got, want)
  # The command line on the same cluster (distributed's progress bar path).
  slide = _small_tiff(tmp_path / "slide.tif", rng)
  f = rng.standard_normal((9, 9)).astype(np.float32)
  np.save(tmp_path / "f.npy", f)
  subproc.run(
    "-m tf_largeconv.dask",
    tmp_path / "slide.tif",
    tmp_path / "out.zarr",
    "--filter",
    tmp_path / "f.npy",
    "--chunk",
    40,
    "--scheduler",
    scheduler_and_worker,
    timeout=CLUSTER_TIMEOUT,
    cwd=tmp_path,
  )
  out = zarr.open(str(tmp_path / "out.zarr"), mode="r")[:]
  want = lc.depthwise_conv2d(
    slide[None].astype(np.float32), np.repeat(f[:, :, None, None], 3, axis=2), 1, "SAME"
  ).numpy()[0]
  np.testing.assert_allclose(out, want, rtol=0, atol=1e-5 * np.abs(want).max())


# A slide of 172032 x 4096 float32 (2.63 GiB on disk) against a LocalCluster of 2 workers
# with a memory_limit of 1.25 GiB each (2.5 GiB in all). TensorFlow and the op take about
# 0.55 GiB of each worker, and the workers peak near 0.7-0.8 GiB:
# below the 0.875 GiB (70%) from which distributed spills. Tall and narrow so that the test
# stays short.
SLIDE_SHAPE, SLIDE_CHUNKS, WORKER_LIMIT = (168 * 1024, 4096), (1024, 4096), 10 * 2**27


def _slide_chunk(block_info=None):
  info = block_info[None]
  return np.random.default_rng(info["chunk-location"]).random(info["chunk-shape"], dtype=np.float32)


def _worker_report(dask_worker):
  """What distributed itself records on a worker: its memory_limit, its peak process
  memory (the system monitor's samples), how often it spilled to disk, its process id."""
  return dict(
    limit=dask_worker.memory_manager.memory_limit,
    peak=max(dask_worker.monitor.quantities["memory"]),
    spilled=dask_worker.data.cumulative_metrics.get(("disk-write", "count"), 0),
    pid=os.getpid(),
  )


def test_slide_larger_than_cluster_memory(tmp_path):
  rows, cols = SLIDE_SHAPE
  slide_path, out_path = str(tmp_path / "slide.zarr"), str(tmp_path / "out.zarr")
  grid = tuple((c,) * (n // c) for n, c in zip(SLIDE_SHAPE, SLIDE_CHUNKS))
  source = da.map_blocks(_slide_chunk, chunks=grid, dtype=np.float32)
  with dask.config.set(scheduler="threads", num_workers=2):
    source.to_zarr(slide_path, compressors=None)
  on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(slide_path) for f in fs)
  assert on_disk > 2 * WORKER_LIMIT
  w = np.random.default_rng(1).standard_normal((15, 15, 1, 1)).astype(np.float32)
  start = time.monotonic()
  # distributed's default memory policy (spill from 70% of the limit, pause at 80%); the
  # system monitor samples every 50 ms instead of 500 ms.
  with (
    dask.config.set({"distributed.admin.system-monitor.interval": "50ms"}),
    clusters.local_cluster(WORKER_LIMIT) as cluster,
    distributed.Client(cluster, timeout=CLUSTER_TIMEOUT) as client,
  ):
    before = client.run(_worker_report)
    x = da.from_zarr(slide_path)[None, :, :, None]
    y = ldask.conv2d(x, w, 2, "SAME", workspace_limit=16 << 20)
    y[0, :, :, 0].to_zarr(out_path, compressors=None)
    after = client.run(_worker_report)
  elapsed = time.monotonic() - start
  assert sorted(after) == sorted(before) and len(after) == 2
  for address, r in after.items():
    assert r["pid"] == before[address]["pid"], "a worker was restarted"
    assert r["limit"] == WORKER_LIMIT
    assert r["peak"] < r["limit"], (address, r)
    assert r["spilled"] == 0, (address, r)
  print(
    f"slide {on_disk / 2**30:.2f} GiB; {elapsed:.1f} s; worker peaks "
    f"{[round(r['peak'] / 2**20) for r in after.values()]} MiB"
  )
  # The output, checked in three bands (the top edge with its padding, the middle across
  # a chunk edge, the bottom edge) against tf.nn.conv2d on the zero-padded input rows.
  out = zarr.open(out_path, mode="r")
  ref = Conv((1, rows, cols, 1), w.shape, (2, 2), "SAME")
  assert out.shape == (ref.oh, ref.ow)
  source = zarr.open(slide_path, mode="r")
  for r0, r1 in ((0, 300), (ref.oh // 2 - 150, ref.oh // 2 + 150), (ref.oh - 300, ref.oh)):
    a, b = 2 * r0 - ref.pt, 2 * (r1 - 1) - ref.pt + 15
    band = np.zeros((b - a, cols + ref.pl + ref.pr), np.float32)
    band[max(-a, 0) : min(b, rows) - a, ref.pl : ref.pl + cols] = source[max(a, 0) : min(b, rows)]
    want = tf.nn.conv2d(band[None, :, :, None], w, 2, "VALID").numpy()[0, :, :, 0]
    magnitude = tf.nn.conv2d(np.abs(band)[None, :, :, None], np.abs(w), 2, "VALID").numpy()[
      0, :, :, 0
    ]
    got = out[r0:r1]
    assert got.shape == want.shape
    assert (np.abs(got - want) <= 1e-5 * magnitude).all(), (r0, r1)


# --- command line ------------------------------------------------------------------------


def _cli(capsys, *argv):
  """Runs `python -m tf_largeconv.dask`'s main() (the alias of `tf-largeconv conv`) in this
  process: (exit code, stdout, stderr)."""
  from tf_largeconv.dask import __main__ as cli

  try:
    code = cli.main([str(a) for a in argv])
  except SystemExit as e:
    code = e.code
  out = capsys.readouterr()
  return code, out.out, out.err


def test_cli_help_explains_shapes(capsys):
  code, text, _ = _cli(capsys, "--help")
  assert code == 0
  for phrase in (
    "H x W",
    "H x W x C",
    "h x w x C x OUT",
    "--padding",
    "--strides",
    "--scheduler",
    "--chunk",
    "NHWC",
    "zarr",
    "TIFF",
    ".npy",
  ):
    assert phrase in text, phrase


def test_cli_tiff_end_to_end(rng, tmp_path):
  slide = _small_tiff(tmp_path / "slide.tif", rng, (170, 140, 3))
  w = rng.standard_normal((15, 15, 3, 2)).astype(np.float32)
  np.save(tmp_path / "w.npy", w)
  out = subproc.run(
    "-m tf_largeconv conv",
    tmp_path / "slide.tif",
    tmp_path / "out.zarr",
    "--filter",
    tmp_path / "w.npy",
    "--padding",
    "valid",
    "--strides",
    2,
    "--tile",
    45,
    timeout=300,
    cwd=tmp_path,
  )
  assert "memory per task" in out.stdout and "100%" in out.stdout, out.stdout
  assert "irregular chunk sizes" not in out.stderr, out.stderr  # to_zarr had to rechunk
  z = zarr.open(str(tmp_path / "out.zarr"), mode="r")
  want = lc.conv2d(slide[None].astype(np.float32), w, 2, "VALID").numpy()[0]
  assert z.shape == want.shape == (78, 63, 2)
  assert z.chunks == (23, 23, 2)  # --tile 45 rounded up to 46, over the stride 2
  np.testing.assert_allclose(z[:], want, rtol=0, atol=1e-5 * np.abs(want).max())
  # a grayscale .npy slide with a 2-D filter gives a 2-D output (through the alias
  # `python -m tf_largeconv.dask`, whose --chunk is --tile)
  gray = rng.standard_normal((64, 50)).astype(np.float32)
  np.save(tmp_path / "gray.npy", gray)
  np.save(tmp_path / "f.npy", w[:, :, 0, 0])
  subproc.run(
    "-m tf_largeconv.dask",
    tmp_path / "gray.npy",
    tmp_path / "gray.zarr",
    "--filter",
    tmp_path / "f.npy",
    "--chunk",
    16,
    timeout=300,
    cwd=tmp_path,
  )
  got = zarr.open(str(tmp_path / "gray.zarr"), mode="r")[:]
  want = lc.conv2d(gray[None, :, :, None], w[:, :, :1, :1], 1, "SAME").numpy()[0, :, :, 0]
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_cli_bad_input(rng, tmp_path, capsys):
  _small_tiff(tmp_path / "slide.tif", rng)
  np.save(tmp_path / "w.npy", np.ones((3, 3, 2, 1), np.float32))  # the slide has 3 channels
  np.save(tmp_path / "f.npy", np.ones((5, 5), np.float32))
  slide, out = tmp_path / "slide.tif", tmp_path / "o.zarr"
  code, _, err = _cli(capsys, slide, out, "--filter", tmp_path / "w.npy")
  assert code == 2 and "filters" in err and "depth 3" in err, err
  code, _, err = _cli(capsys, tmp_path / "missing.tif", out, "--filter", tmp_path / "f.npy")
  assert code == 2 and "missing.tif" in err, err
  code, _, err = _cli(capsys, slide, out, "--filter", tmp_path / "missing.npy")
  assert code == 2 and "missing.npy" in err, err
  code, _, err = _cli(capsys, slide, out, "--filter", tmp_path / "f.npy", "--strides", 0)
  assert code == 2 and "--strides" in err, err
  # nothing listens on this port: a clear error within the --timeout, no output written
  start = time.monotonic()
  code, _, err = _cli(
    capsys,
    slide,
    out,
    "--filter",
    tmp_path / "f.npy",
    "--scheduler",
    "tcp://127.0.0.1:9",
    "--timeout",
    2,
  )
  assert time.monotonic() - start < 30
  message = str(code) + err
  assert "could not reach a dask scheduler" in message, message
  assert "tcp://127.0.0.1:9" in message, message
  assert not out.exists()


# --- inputs from disk --------------------------------------------------------------------


def test_open_slide_zarr_tiff_and_memmap(rng, tmp_path):
  slide = rng.standard_normal((90, 70, 2)).astype(np.float32)
  zarr.create_array(str(tmp_path / "s.zarr"), data=slide, chunks=(32, 32, 2))
  np.save(tmp_path / "s.npy", slide)
  layout = dict(tile=(32, 32), photometric="minisblack", planarconfig="contig")
  with tifffile.TiffWriter(tmp_path / "s.tif") as tif:  # a pyramid: level 0 and level 1
    tif.write(slide, subifds=1, **layout)
    tif.write(slide[::2, ::2], subfiletype=1, **layout)
  w = rng.standard_normal((7, 7, 2, 3)).astype(np.float32)
  want = lc.conv2d(slide[None], w, 1, "SAME", algorithm="direct").numpy()
  for name in ("s.zarr", "s.npy", "s.tif"):
    x = ldask.open_slide(str(tmp_path / name), chunk=20)
    assert x.shape == slide.shape and x.chunks[0][0] == 20, name
    got = ldask.conv2d(x[None], w, 1, "SAME", algorithm="direct").compute()
    np.testing.assert_array_equal(got, want, err_msg=name)
  level1 = ldask.open_slide(str(tmp_path / "s.tif"), level=1)
  np.testing.assert_array_equal(level1.compute(), slide[::2, ::2])
  # the files are opened where they are read: a graph for a cluster carries paths, not data
  # (a numpy memmap in the graph would be pickled with all its 50 KB)
  for name in ("s.npy", "s.tif"):
    graph = dict(ldask.open_slide(str(tmp_path / name), chunk=20).__dask_graph__())
    assert len(pickle.dumps(graph)) < slide.nbytes // 4, name


# --- bad input ---------------------------------------------------------------------------


def _untouchable(shape, chunks):
  """A dask array whose chunks fail if computed: errors must come before any task runs."""

  def boom(block_info=None):
    raise AssertionError("a task ran before the arguments were checked")

  return da.map_blocks(boom, chunks=chunks, dtype=np.float32, meta=np.empty((0,) * 4, np.float32))


def test_bad_input_raises_before_any_task():
  x = _untouchable((1, 20, 20, 3), ((1,), (10, 10), (10, 10), (3,)))
  good = np.ones((3, 3, 3, 2), np.float32)
  with pytest.raises(ValueError, match="input must be a 4-D dask array"):
    ldask.conv2d(np.ones((1, 20, 20, 3), np.float32), good, 1, "SAME")
  with pytest.raises(ValueError, match="input must be a 4-D dask array"):
    ldask.conv2d(tf.ones((1, 20, 20, 3)), good, 1, "SAME")
  with pytest.raises(ValueError, match="input must be a 4-D"):
    ldask.conv2d(da.zeros((20, 20, 3), chunks=5), good, 1, "SAME")
  with pytest.raises(ValueError, match="filters"):  # 3 input channels, filter wants 2
    ldask.conv2d(x, np.ones((3, 3, 2, 2), np.float32), 1, "SAME")
  with pytest.raises(ValueError, match="filters height 25 is larger than the padded input"):
    ldask.conv2d(x, np.ones((25, 3, 3, 2), np.float32), 1, "VALID")
  with pytest.raises(ValueError, match="filters must be 4-D"):
    ldask.conv2d(x, np.ones((3, 3), np.float32), 1, "SAME")
  with pytest.raises(ValueError, match="filter in_channels"):
    ldask.depthwise_conv2d(x, np.ones((3, 3, 2, 1), np.float32), 1, "SAME")
  with pytest.raises(ValueError, match="strides"):
    ldask.conv2d(x, good, [1, 2, 3], "SAME")
  with pytest.raises(ValueError, match="padding"):
    ldask.conv2d(x, good, 1, "FULL")
  with pytest.raises(ValueError, match="workspace_limit .* too small"):
    ldask.conv2d(x, good, 1, "SAME", algorithm="fft", workspace_limit=16)
  with pytest.raises(TypeError, match="input must have dtype"):
    ldask.conv2d(da.zeros((1, 8, 8, 3), dtype=np.int32), good, 1, "SAME")
  with pytest.raises(TypeError, match="filters must have the same dtype"):
    ldask.conv2d(x, tf.ones((3, 3, 3, 2), tf.float64), 1, "SAME")
  with pytest.raises(ValueError, match="unknown chunk sizes"):
    ldask.conv2d(x[x[:, 0, 0, 0] > 0], good, 1, "SAME")
  with pytest.raises(ValueError, match="out_backprop must have the convolution's output"):
    ldask.conv2d_backprop_filter(x, [3, 3, 3, 2], np.ones((1, 20, 19, 2), np.float32), 1, "SAME")
  with pytest.raises(ValueError, match="filter_sizes"):
    ldask.conv2d_backprop_filter(x, [3, 3, 3], np.ones((1, 20, 20, 2), np.float32), 1, "SAME")
  # and nothing was computed: the same arguments with a good filter build a graph fine
  assert ldask.conv2d(x, good, 1, "SAME").shape == (1, 20, 20, 2)


def test_import_tf_largeconv_does_not_import_dask():
  code = (
    "import sys, tf_largeconv\n"
    "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
    "('dask', 'distributed', 'zarr', 'tifffile'))\n"
    "print(bad)\n"
    "import tf_largeconv.dask\n"
    "print('dask' in sys.modules)\n"
  )
  out = subproc.run(code, timeout=120)
  assert out.stdout.split() == ["[]", "True"], out.stdout
