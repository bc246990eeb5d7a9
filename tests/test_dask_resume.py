"""Slide jobs that survive (tf_largeconv.dask): a worker SIGKILLed mid-run on a real
LocalCluster, the command line SIGKILLed mid-run and resumed, resumes refused against other
inputs, a full disk, OME-Zarr in and out (read back with ngff-zarr's reader), and bad input
with clear messages. Every output is checked against the in-memory op with
algorithm='direct' (which sums each output in a fixed order, so a chunked run equals it bit
for bit). Skipped only where the `dask` extra is absent."""

import errno
import os
import signal
import threading
import time

import numpy as np
import pytest

dask = pytest.importorskip("dask")
da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")

import clusters  # noqa: E402
import subproc  # noqa: E402

import tf_largeconv as lc  # noqa: E402
import tf_largeconv.dask as ldask  # noqa: E402
from tf_largeconv.dask import _record  # noqa: E402

CLUSTER_TIMEOUT = clusters.CLUSTER_TIMEOUT


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


def _wait_for(predicate, timeout, what):
  deadline = time.monotonic() + timeout
  while not predicate():
    assert time.monotonic() < deadline, f"timed out waiting for {what}"
    time.sleep(0.01)


def _direct(x, w, strides=1, padding="SAME"):
  """The in-memory op's result, NHWC."""
  return lc.conv2d(x, w, strides, padding, algorithm="direct").numpy()


# --- a worker killed mid-run -------------------------------------------------------------


# Seconds each chunk task of the worker test sleeps before its convolution, so that the
# worker is killed while it computes a chunk, never between two.
SLOW = 0.3
# distributed's time to notice a dead worker and give its tasks to the others (1-3 s here).
RECOVERY = 5


def _slow_chunks(seconds):
  """Run on each worker: chunk tasks (`_tasks.forward`, the real one) start `seconds`
  late. The graph names the function, so the workers' tasks find this wrapper."""
  from tf_largeconv.dask import _tasks

  forward = getattr(_tasks.forward, "__wrapped__", _tasks.forward)

  def slow(*args):
    time.sleep(seconds)
    return forward(*args)

  slow.__wrapped__ = forward
  _tasks.forward = slow


def test_worker_killed_mid_run_loses_nothing(tmp_path):
  # 16 chunks of 256 x 256 with an 81x81 filter on 2 worker processes of 1 thread, each
  # chunk task SLOW s longer; once four chunks are recorded, the worker process computing
  # a chunk is SIGKILLed.
  rng = np.random.default_rng(5)
  x = rng.random((1, 1024, 1024, 1), dtype=np.float32)
  w = rng.standard_normal((81, 81, 1, 1)).astype(np.float32)
  xd = da.from_array(x, chunks=(1, 256, 256, 1))
  want = _direct(x, w)[0, :, :, 0]
  args = dict(strides=1, padding="SAME", algorithm="direct", output_axes="HW")
  start = time.monotonic()
  with (
    clusters.local_cluster("1GiB") as cluster,
    distributed.Client(cluster, timeout=CLUSTER_TIMEOUT) as client,
  ):
    pids = set(client.run(os.getpid).values())
    # TensorFlow imported and the op planned on both workers, then an undisturbed run
    warm = ldask.conv2d(da.from_array(x[:, :300, :300], chunks=(1, 150, 150, 1)), w, 1, "SAME")
    client.compute(warm, sync=True)
    client.run(_slow_chunks, SLOW)
    calm = ldask.conv2d_to_zarr(xd, w, output=str(tmp_path / "calm.zarr"), client=client, **args)
    out = str(tmp_path / "out.zarr")
    result = {}

    def run():
      result["report"] = ldask.conv2d_to_zarr(xd, w, output=out, client=client, **args)

    thread = threading.Thread(target=run)
    thread.start()
    record = _record.Record(out)
    victim = {}
    _wait_for(
      lambda: (
        record.exists()
        and len(record.done()) >= 4
        and victim.update((n, p[0]) for n, p in record.in_flight().items() if p[0] in pids)
        or victim
      ),
      60,
      "four chunks, and a worker computing one",
    )
    chunk, pid = next(iter(victim.items()))
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    done_at_kill = record.done()
    in_flight = record.in_flight()
    thread.join(timeout=CLUSTER_TIMEOUT)
    after_kill = time.monotonic() - killed
    assert not thread.is_alive()
    report = result["report"]
  assert time.monotonic() - start < 2 * CLUSTER_TIMEOUT
  assert len(done_at_kill) < report.total == 16, "the kill came after the run"
  assert chunk in in_flight, "the killed worker had finished its chunk"
  print(
    f"undisturbed {calm.seconds:.2f} s; killed at {len(done_at_kill)}/16 done, "
    f"{len(in_flight)} in flight: {report.seconds:.2f} s, {report.retried} retried, "
    f"{report.computed} computed, {after_kill:.2f} s after the kill"
  )
  # nothing lost: every chunk recorded, computed by this run, and the output equals the
  # undisturbed run's and the in-memory op's bit for bit
  assert len(record.done()) == 16 and report.computed == 16 and report.skipped == 0
  got = zarr.open_array(out, mode="r")[:]
  np.testing.assert_array_equal(got, zarr.open_array(str(tmp_path / "calm.zarr"), mode="r")[:])
  np.testing.assert_array_equal(got, want)
  # the killed worker's chunk was started again elsewhere, and no other chunk was
  assert report.retried == 1
  # the rest of the run took at most twice what it had left (one worker carried on), plus
  # distributed's recovery
  assert report.seconds <= 2 * calm.seconds + RECOVERY, (report.seconds, calm.seconds)


# --- the command line killed and resumed -------------------------------------------------


def _slide_and_filter(tmp_path, rng, size=1024, k=81):
  slide = rng.random((size, size), dtype=np.float32)
  f = rng.standard_normal((k, k)).astype(np.float32)
  np.save(tmp_path / "slide.npy", slide)
  np.save(tmp_path / "f.npy", f)
  want = _direct(slide[None, :, :, None], f[:, :, None, None])[0, :, :, 0]
  return slide, f, want


def test_cli_killed_then_resumed_equals_undisturbed(rng, tmp_path):
  # 16 chunks of 256 x 256, an 81x81 filter, algorithm direct; the CLI is SIGKILLed once
  # four chunks are recorded, then resumed.
  _, _, want = _slide_and_filter(tmp_path, rng)
  out = tmp_path / "out.zarr"
  argv = [tmp_path / "slide.npy", out, "--filter", tmp_path / "f.npy", "--chunk", 256]
  argv += ["--algorithm", "direct"]
  proc = subproc.start("-m tf_largeconv.dask", *argv, cwd=tmp_path)
  record = _record.Record(str(out))
  try:
    _wait_for(
      lambda: proc.poll() is not None or (record.exists() and len(record.done()) >= 4),
      120,
      "four chunks",
    )
    os.kill(proc.pid, signal.SIGKILL)
  finally:
    stdout, stderr = subproc.wait(proc, 30, check=False)
  assert proc.returncode == -signal.SIGKILL, subproc.describe(proc, stdout, stderr)
  done = record.done()
  in_flight = {n for n in record.attempts() if n not in done}
  assert 4 <= len(done) < 16, "the kill came after the run"
  # the threaded scheduler runs one task per core: that many chunks at most were in flight
  assert len(in_flight) <= (os.cpu_count() or 1)
  out_resumed = subproc.run("-m tf_largeconv.dask", *argv, "--resume", timeout=300, cwd=tmp_path)
  summary = out_resumed.stdout.strip().splitlines()[-1]
  print(f"killed at {len(done)}/16 done, {len(in_flight)} in flight; {summary}")
  assert f"{16 - len(done)} computed, {len(done)} already done" in summary, summary
  assert f"{len(in_flight)} computed again" in summary, summary
  assert "100%" in out_resumed.stdout
  assert len(record.done()) == 16
  np.testing.assert_array_equal(zarr.open_array(str(out), mode="r")[:], want)


def test_resume_refused_against_other_inputs(rng, tmp_path, capsys):
  slide = rng.random((96, 80, 3), dtype=np.float32)
  np.save(tmp_path / "slide.npy", slide)
  np.save(tmp_path / "f.npy", rng.standard_normal((5, 5)).astype(np.float32))
  np.save(tmp_path / "g.npy", rng.standard_normal((5, 5)).astype(np.float32))
  out = tmp_path / "out.zarr"
  base = [tmp_path / "slide.npy", out, "--chunk", 32]
  code, text, err = _cli(capsys, *base, "--filter", tmp_path / "f.npy")
  assert code == 0, err
  assert "wrote" in text and "9 computed, 0 already done" in text, text
  # an existing output without --overwrite or --resume: a usage error (2); a refused
  # resume has its own exit status (3)
  code, _, err = _cli(capsys, *base, "--filter", tmp_path / "f.npy")
  assert code == 2 and "exists" in err and "--overwrite" in err and "--resume" in err, err
  # a resume of the finished run computes nothing
  code, text, err = _cli(capsys, *base, "--filter", tmp_path / "f.npy", "--resume")
  assert code == 0 and "0 computed, 9 already done" in text, text + err
  # another filter, another stride, another input: refused, naming what differs
  for extra, field in (
    (["--filter", tmp_path / "g.npy"], "filters"),
    (["--filter", tmp_path / "f.npy", "--padding", "valid"], "op.padding"),
  ):
    code, _, err = _cli(capsys, *base, *extra, "--resume")
    assert code == 3 and field in err and "--overwrite" in err, (field, err)
    assert "Traceback" not in err
  time.sleep(0.01)
  np.save(tmp_path / "slide.npy", slide + 1)
  code, _, err = _cli(capsys, *base, "--filter", tmp_path / "f.npy", "--resume")
  assert code == 3 and "caller.input_file.stat_sha256" in err, err
  # an output that has no record
  zarr.create_array(str(tmp_path / "plain.zarr"), shape=(4, 4), dtype="f4")
  code, _, err = _cli(
    capsys,
    tmp_path / "slide.npy",
    tmp_path / "plain.zarr",
    "--filter",
    tmp_path / "f.npy",
    "--resume",
  )
  assert code == 3 and "no record" in err, err
  # --overwrite starts again
  code, text, err = _cli(capsys, *base, "--filter", tmp_path / "g.npy", "--overwrite")
  assert code == 0 and "9 computed" in text, err


def test_disk_full_records_nothing_false_and_resume_finishes(rng, tmp_path, capsys, monkeypatch):
  # The chunk writer fails with ENOSPC on its fifth write: the command fails with a clear
  # message and exit status 1, the chunks written before are recorded and the failed one
  # is not, and a resume computes only the rest.
  slide = rng.random((128, 96), dtype=np.float32)
  f = rng.standard_normal((9, 9)).astype(np.float32)
  np.save(tmp_path / "slide.npy", slide)
  np.save(tmp_path / "f.npy", f)
  out = tmp_path / "out.zarr"
  argv = [tmp_path / "slide.npy", out, "--filter", tmp_path / "f.npy", "--chunk", 32]
  argv += ["--algorithm", "direct"]
  write = _record.ZarrSink.write
  calls = []
  lock = threading.Lock()

  def full(self, index, block):
    with lock:
      calls.append(self.name(index))
      fail = len(calls) == 5
    if fail:
      raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    write(self, index, block)

  monkeypatch.setattr(_record.ZarrSink, "write", full)
  with dask.config.set(num_workers=1):  # one task at a time: no write after the failure
    code, _, err = _cli(capsys, *argv)
  assert code == 1, err
  assert "the disk is full" in err and "--resume" in err and "Traceback" not in err, err
  failed = calls[4]
  record = _record.Record(str(out))
  assert failed in err
  assert failed not in record.done()
  assert record.done() == set(calls[:4])
  assert "4 of 12 chunks" in err, err
  monkeypatch.setattr(_record.ZarrSink, "write", write)
  before = len(record.done())
  code, text, err = _cli(capsys, *argv, "--resume")
  assert code == 0, err
  assert f"{12 - before} computed, {before} already done" in text, text
  want = _direct(slide[None, :, :, None], f[:, :, None, None])[0, :, :, 0]
  np.testing.assert_array_equal(zarr.open_array(str(out), mode="r")[:], want)
  assert len(record.done()) == 12


def test_a_retried_task_skips_a_recorded_chunk(tmp_path):
  # A worker that died after recording its chunk has the task run again: it writes nothing.
  record = _record.open_output(str(tmp_path / "o.zarr"), {"a": 1}, "new", lambda: None)
  zarr.create_array(str(tmp_path / "o.zarr" / "a"), shape=(4, 4), chunks=(2, 2), dtype="f4")
  sink = _record.ZarrSink(record, "a", ((1,), (2, 2), (2, 2)), (1, 2))

  def boom():
    raise AssertionError("a recorded chunk was computed again")

  assert _record.run_chunk(sink, (0, 1, 0), lambda: np.ones((1, 2, 2), np.float32)) == 1
  assert record.done() == {"1.0"}
  assert _record.run_chunk(sink, (0, 1, 0), boom) == 0
  got = zarr.open_array(str(tmp_path / "o.zarr" / "a"), mode="r")[:]
  np.testing.assert_array_equal(got, np.pad(np.ones((2, 2)), ((2, 0), (0, 2))))


# --- OME-Zarr ----------------------------------------------------------------------------


def test_ome_zarr_in_and_out(rng, tmp_path, capsys):
  nz = pytest.importorskip("ngff_zarr")
  pytest.importorskip("jsonschema")  # ngff-zarr's validation of the metadata
  # an NGFF 0.4 input (zarr v2), axes t c z y x with one time point and plane, 3 channels,
  # pixels 0.25 x 0.5 micrometer, two levels
  planes = rng.random((1, 3, 1, 150, 124), dtype=np.float32)
  image = nz.to_ngff_image(
    planes,
    dims=("t", "c", "z", "y", "x"),
    scale={"t": 1.0, "z": 1.0, "y": 0.25, "x": 0.5},
    axes_units={"y": "micrometer", "x": "micrometer"},
  )
  source = str(tmp_path / "in.ome.zarr")
  nz.to_ome_zarr(
    source,
    nz.to_multiscales(
      image,
      scale_factors=[{"z": 1, "y": 2, "x": 2}],
      chunks=64,
      method=nz.Methods.ITKWASM_BIN_SHRINK,
    ),
    version="0.4",
  )
  level1 = nz.from_ome_zarr(source).images[1].data.compute()[0, :, 0]  # c y x
  slide = ldask.open_slide(source, chunk=32, level=1)
  assert slide.shape == (75, 62, 3)  # y x c: the channel axis from the metadata
  np.testing.assert_array_equal(slide.compute(), np.moveaxis(level1, 0, -1))
  w = rng.standard_normal((7, 7, 3, 2)).astype(np.float32)
  np.save(tmp_path / "w.npy", w)
  out = tmp_path / "out.ome.zarr"
  code, text, err = _cli(
    capsys,
    source,
    out,
    "--filter",
    tmp_path / "w.npy",
    "--level",
    1,
    "--strides",
    2,
    "--chunk",
    16,
    "--levels",
    3,
    "--algorithm",
    "direct",
  )
  assert code == 0, err
  assert "pyramid" in text, text
  want = _direct(np.moveaxis(level1, 0, -1)[None], w, 2)[0]  # 38 x 31 x 2
  back = nz.from_ome_zarr(str(out), validate=True)
  assert len(back.images) == 3
  for k, im in enumerate(back.images):
    assert tuple(im.dims) == ("c", "y", "x")
    # the input level's pixel (0.5 x 1.0 um) times the stride, doubled per level
    assert im.scale["y"] == 0.5 * 2 * 2**k and im.scale["x"] == 1.0 * 2 * 2**k, im.scale
    assert im.axes_units["y"] == "micrometer" and im.axes_units["x"] == "micrometer"
  assert [ax.type for ax in back.metadata.axes] == ["channel", "space", "space"]
  level0 = back.images[0].data.compute()
  np.testing.assert_array_equal(level0, np.moveaxis(want, -1, 0))
  # level 1: means of 2x2 blocks of level 0
  half = back.images[1].data.compute()
  c, h, wd = half.shape
  means = level0[:, : 2 * h, : 2 * wd].reshape(c, h, 2, wd, 2).mean(axis=(2, 4))
  np.testing.assert_allclose(half, means, rtol=0, atol=2e-6 * np.abs(level0).max())
  # NGFF 0.5 (zarr v3) in, through the API: the output's level 0 read back as a slide
  again = ldask.open_slide(str(out), chunk=8)
  np.testing.assert_array_equal(again.compute(), want)


# --- bad input ---------------------------------------------------------------------------


def test_cli_bad_input_clear_messages(rng, tmp_path, capsys):
  np.save(tmp_path / "slide.npy", rng.random((64, 64), dtype=np.float32))
  np.save(tmp_path / "c.npy", np.ones((64, 64), np.complex64))
  np.save(tmp_path / "f.npy", np.ones((5, 5), np.float32))
  np.save(tmp_path / "big.npy", np.ones((99, 99), np.float32))
  out = tmp_path / "o.zarr"
  cases = [
    ([tmp_path / "missing.npy", out, "--filter", tmp_path / "f.npy"], ["missing.npy"]),
    ([tmp_path / "c.npy", out, "--filter", tmp_path / "f.npy"], ["INPUT", "complex64", "integer"]),
    (
      [tmp_path / "slide.npy", out, "--filter", tmp_path / "big.npy", "--padding", "valid"],
      ["filters height 99 is larger than the padded input"],
    ),
    (
      [tmp_path / "slide.npy", out, "--filter", tmp_path / "big.npy", "--max-task-memory", 1],
      ["--tile", "smaller --tile", "--task-memory"],
    ),
    (
      [tmp_path / "slide.npy", out, "--filter", tmp_path / "f.npy", "--resume", "--overwrite"],
      ["not allowed with"],
    ),
  ]
  for argv, phrases in cases:
    code, _, err = _cli(capsys, *argv)
    assert code == 2, (argv, err)
    for phrase in phrases:
      assert phrase in err, (phrase, err)
    assert "Traceback" not in err
    assert not out.exists()
