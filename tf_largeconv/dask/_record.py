"""Resumable chunk-by-chunk output: a record, kept inside the output, of which chunks are
complete, and the task wrapper that keeps it.

Both slide commands (a convolution and a Keras model over a slide) write through it, by way
of the one writer in `_output`, in four steps:

  record = open_output(path, fingerprint, mode, create)
      # mode 'new': `path` must not exist; 'overwrite': it is removed first; 'resume': its
      # record must hold the same fingerprint (else FingerprintMismatch). `create()` makes
      # the output's stores (zarr arrays, OME-Zarr metadata) when the output is new.
  sink = ZarrSink(record, array_path, source_chunks, axes)
  tasks = {index: (run_chunk, sink, index, compute, *args) for each chunk index}
      # one task per output chunk: `compute(*args)` (dask resolves keys in args) gives the
      # chunk's values; run_chunk skips a chunk already recorded, records the attempt,
      # computes, writes, and records the chunk as complete last
  report = run(graph, tasks, sink, client=None, progress=print)

The fingerprint is a JSON-able dict of whatever defines the output (the input's identity,
the filter's digest, the arguments, the output's shape and chunks); the caller picks the
fields. It is stored with the output when the output is created and compared field by field
on resume, so a resume against a changed input, filter or argument is refused.

On disk, under `path/.largeconv-record/`: `fingerprint.json`; `done/<chunk>` for each chunk
written completely (made by an atomic rename after the chunk's write returned, so a chunk
half written, or one whose process died, is never counted);
`attempts/<chunk>@<run>@<pid>-<id>` for each time a run started computing a chunk, in
process <pid> (what says how many chunks were computed more than once, and which were in
flight); `steps/<name>` for steps after the chunks (e.g. an image pyramid). A chunk is
named by its index in the output's chunk grid, e.g. `3.0.12`. The record lives on the disk
the output lives on, so dask.distributed workers keep it from any machine that sees the
output path. It records process deaths and lost workers; it does not order the disk's own
writes (no fsync), so a machine that loses power may keep a record of a chunk whose data
the disk never got.
"""

from __future__ import annotations

import collections
import errno
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

import numpy as np

RECORD_DIR = ".largeconv-record"
MODES = ("new", "overwrite", "resume")


class OutputExists(FileExistsError):
  """The output path exists and the mode is 'new'."""


class FingerprintMismatch(ValueError):
  """A resume against an output made by a run with another fingerprint."""


class NoRecord(ValueError):
  """A resume against an output that has no record (not written by a resumable run, or
  killed before its record was made)."""


def chunk_name(index: Iterable[int]) -> str:
  return ".".join(str(int(i)) for i in index)


def _write_atomically(path: str, text: str) -> None:
  """Writes `text` to `path` by a rename: readers see the whole file or none."""
  tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{uuid.uuid4().hex}")
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)


def _listing(folder: str) -> list[str]:
  """The entries of `folder` that are not temporary (dot) files."""
  try:
    return [n for n in os.listdir(folder) if not n.startswith(".")]
  except FileNotFoundError:
    return []


def differences(stored: Mapping[str, Any], current: Mapping[str, Any], prefix: str = "") -> list:
  """(field, stored value, current value) for each field that differs, nested dicts
  compared field by field ('input.shape')."""
  found = []
  for key in sorted(set(stored) | set(current)):
    a, b = stored.get(key), current.get(key)
    name = f"{prefix}{key}"
    if isinstance(a, dict) and isinstance(b, dict):
      found += differences(a, b, name + ".")
    elif a != b:
      found.append((name, a, b))
  return found


class Record:
  """The completion record of one output (see the module docstring). Picklable: it holds
  paths and this run's id only, so tasks on any worker can keep it.

  Attributes:
    path: the output's path (absolute).
    run_id: this run's id (attempt files carry it).
  """

  def __init__(self, path: str, run_id: str | None = None) -> None:
    self.path = os.path.abspath(path)
    self.run_id = run_id or uuid.uuid4().hex[:12]

  def _dir(self, *parts: str) -> str:
    return os.path.join(self.path, RECORD_DIR, *parts)

  def exists(self) -> bool:
    return os.path.isfile(self._dir("fingerprint.json"))

  def fingerprint(self) -> dict:
    with open(self._dir("fingerprint.json"), encoding="utf-8") as f:
      return json.load(f)

  def create(self, fingerprint: Mapping[str, Any]) -> None:
    for sub in ("done", "attempts", "steps"):
      os.makedirs(self._dir(sub), exist_ok=True)
    _write_atomically(self._dir("fingerprint.json"), json.dumps(fingerprint, indent=1))

  def done(self) -> set[str]:
    """The chunks recorded as complete."""
    return set(_listing(self._dir("done")))

  def is_done(self, name: str) -> bool:
    return os.path.exists(self._dir("done", name))

  def begin(self, name: str) -> None:
    """Records that this run starts computing chunk `name`, in this process."""
    token = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
    open(self._dir("attempts", f"{name}@{self.run_id}@{token}"), "w").close()

  def finish(self, name: str) -> None:
    """Records chunk `name` as complete: call only after its data is written."""
    _write_atomically(self._dir("done", name), self.run_id)

  def _attempts(self) -> list[tuple[str, str, int]]:
    """(chunk, run id, process id) of every attempt, in no order."""
    found = []
    for entry in _listing(self._dir("attempts")):
      name, run, token = entry.split("@")
      found.append((name, run, int(token.split("-")[0])))
    return found

  def attempts(self) -> dict[str, list[str]]:
    """Per chunk, the run ids of every attempt at it, in no order."""
    found = collections.defaultdict(list)
    for name, run, _ in self._attempts():
      found[name].append(run)
    return dict(found)

  def in_flight(self) -> dict[str, list[int]]:
    """Per chunk started and not recorded complete, the ids of the processes that started
    it (on whichever machine ran them)."""
    done = self.done()
    found = collections.defaultdict(list)
    for name, _, pid in self._attempts():
      if name not in done:
        found[name].append(pid)
    return dict(found)

  def has_step(self, step: str) -> bool:
    return os.path.exists(self._dir("steps", step))

  def finish_step(self, step: str) -> None:
    _write_atomically(self._dir("steps", step), self.run_id)


def open_output(
  path: str,
  fingerprint: Mapping[str, Any],
  mode: str,
  create: Callable[[], None],
  what: str = "the output",
) -> Record:
  """Prepares `path` for a run and returns its Record (see the module docstring).

  Args:
    path: the output (a directory: a zarr array or group).
    fingerprint: JSON-able description of what defines the output.
    mode: 'new', 'overwrite' or 'resume' (a resume of an output that does not exist starts
      it, as 'new' would).
    create: makes the output's stores at `path` (called for a new output only).
    what: how messages name the output (e.g. 'OUTPUT out.zarr').

  Raises:
    OutputExists, NoRecord, FingerprintMismatch: see the classes; each message says what
      to do instead.
  """
  if mode not in MODES:
    raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
  fingerprint = json.loads(json.dumps(fingerprint))  # as it reads back from the file
  record = Record(path)
  if os.path.lexists(path):
    if mode == "new":
      raise OutputExists(
        f"{what} exists; pass --overwrite (overwrite=True) to replace it, or --resume "
        f"(resume=True) to finish an interrupted run into it"
      )
    if mode == "resume":
      if not record.exists():
        raise NoRecord(
          f"{what} has no record of its chunks ({RECORD_DIR}/fingerprint.json), so it "
          f"cannot be resumed: it was not written by a resumable run, or that run stopped "
          f"before its first chunk. Pass --overwrite (overwrite=True) to start again"
        )
      diff = differences(record.fingerprint(), fingerprint)
      if diff:
        listed = "; ".join(f"{k}: {a!r} then, {b!r} now" for k, a, b in diff)
        raise FingerprintMismatch(
          f"{what} was written by a run with other inputs or arguments ({listed}). A "
          f"resume only finishes the same run; pass --overwrite (overwrite=True) to start "
          f"again with these"
        )
      return record
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path)
    else:
      os.remove(path)
  create()
  record.create(fingerprint)
  return record


class ZarrSink:
  """Writes chunks of a source array into a zarr array, keeping a Record.

  The source is chunked with `source_chunks` (per axis, the chunk sizes); the target's
  axes are `axes` (for each target axis, the source axis it is), and every source axis not
  in `axes` has length 1. A source chunk is one chunk of the target, whose chunks must be
  the source's (regular) chunk sizes along `axes`.

  Args:
    record: the output's Record.
    array_path: the zarr array to write (absolute path, or path under record.path).
    source_chunks: the source's chunks, as a dask array's `chunks`.
    axes: the target's axes as source axes.
  """

  def __init__(
    self,
    record: Record,
    array_path: str,
    source_chunks: tuple[tuple[int, ...], ...],
    axes: tuple[int, ...],
  ) -> None:
    self.record = record
    self.array_path = os.path.join(record.path, array_path)
    self.axes = tuple(axes)
    self.dropped = tuple(a for a in range(len(source_chunks)) if a not in self.axes)
    for a in self.dropped:
      if sum(source_chunks[a]) != 1:
        raise ValueError(f"source axis {a} has length {sum(source_chunks[a])}, not 1")
    self.edges = [np.cumsum((0,) + tuple(c)).tolist() for c in source_chunks]
    self._array: Any = None

  def names(self) -> dict[tuple[int, ...], str]:
    """Per source chunk index, the target chunk's name."""
    grid = [range(len(e) - 1) for e in self.edges]
    return {idx: self.name(idx) for idx in np.ndindex(*(len(g) for g in grid))}

  def name(self, index: tuple[int, ...]) -> str:
    return chunk_name(index[a] for a in self.axes)

  def __getstate__(self) -> dict:
    return dict(self.__dict__, _array=None)

  def __setstate__(self, state: dict) -> None:
    self.__dict__.update(state)

  def region(self, index: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(self.edges[a][index[a]], self.edges[a][index[a] + 1]) for a in self.axes)

  def target(self) -> Any:
    if self._array is None:
      import zarr

      # Every chunk is written without zarr's check against the fill value (its default),
      # which reads the chunk again and costs more than the write itself.
      self._array = zarr.open_array(self.array_path, mode="r+", config={"write_empty_chunks": True})
    return self._array

  def write(self, index: tuple[int, ...], block: np.ndarray) -> None:
    """Writes the source chunk `index` into its place in the target."""
    region = self.region(index)
    values = np.transpose(block, self.axes + self.dropped).reshape(
      tuple(r.stop - r.start for r in region)
    )
    self.target()[region] = values


def run_chunk(sink: ZarrSink, index: tuple[int, ...], compute: Callable, *args: Any) -> int:
  """One output chunk's task: skips it if recorded complete (a retry of a task whose worker
  died after finishing it), else records the attempt, computes `compute(*args)`, writes it
  and records it complete. Returns the number of chunks computed (0 or 1)."""
  name = sink.name(index)
  if sink.record.is_done(name):
    return 0
  sink.record.begin(name)
  block = compute(*args)
  try:
    sink.write(index, block)
  except OSError as e:
    raise OSError(e.errno, f"writing chunk {name} of {sink.array_path}: {e.strerror or e}") from e
  sink.record.finish(name)
  return 1


def _total(results: Iterable[int]) -> int:
  """The run's last task: depends on every chunk task (its value is not used)."""
  return sum(results)


class WriteReport(
  collections.namedtuple(
    "WriteReport",
    [
      "total",
      "computed",
      "skipped",
      "recomputed",
      "retried",
      "seconds",
      "pixels",
      "pyramid_seconds",
    ],
    defaults=(0.0,),
  )
):
  """What a resumable write did, in chunks of the output (its level 0 for OME-Zarr).

  Attributes:
    total: chunks in the output.
    computed: chunks this run computed.
    skipped: chunks an earlier run had recorded complete (not computed again).
    recomputed: chunks this run computed that an earlier run had started and not finished
      (in flight when it stopped): the chunks computed twice across the runs.
    retried: chunks this run started more than once (a worker lost while on them).
    seconds: wall time of the chunks.
    pixels: output pixels (rows x columns) this run computed.
    pyramid_seconds: wall time of the OME-Zarr pyramid's levels (0 if this run made none).
  """

  __slots__ = ()


class _Progress(threading.Thread):
  """Calls `report(done, total, seconds)` every `interval` s while a run goes on, counting
  the record's complete chunks (what is on disk, whichever process wrote it)."""

  def __init__(self, record: Record, total: int, report: Callable, interval: float) -> None:
    super().__init__(daemon=True)
    self.record, self.total, self.report, self.interval = record, total, report, interval
    self.stop = threading.Event()

  def run(self) -> None:
    start = time.perf_counter()
    while not self.stop.wait(self.interval):
      self.report(len(self.record.done()), self.total, time.perf_counter() - start)


def run(
  graph: Mapping,
  tasks: Mapping[tuple[int, ...], tuple],
  sink: ZarrSink,
  client: Any = None,
  progress: Callable[[int, int, float], None] | None = None,
  interval: float = 1.0,
  pixels: Callable[[tuple[int, ...]], int] | None = None,
) -> WriteReport:
  """Runs the chunk tasks not yet recorded complete, and says what was done.

  Args:
    graph: the dask graph (a HighLevelGraph or dict) the tasks' arguments refer to.
    tasks: per source chunk index, its task: (run_chunk, sink, index, compute, *args).
    sink: the ZarrSink the tasks write through.
    client: a dask.distributed Client to run on; None: dask's threaded scheduler.
    progress: called as progress(done, total, seconds) about every `interval` seconds.
    pixels: the output pixels of a chunk index (for WriteReport.pixels); default its size.
  """
  import dask
  from dask.highlevelgraph import HighLevelGraph

  record = sink.record
  names = sink.names()
  done = record.done()
  before = {n for n, runs in record.attempts().items() if any(r != record.run_id for r in runs)}
  pending = [idx for idx in tasks if names[idx] not in done]
  key = f"largeconv-record-{record.run_id}"
  layer: dict = {(key, i): tasks[idx] for i, idx in enumerate(pending)}
  layer[key] = (_total, [(key, i) for i in range(len(pending))])
  full: Any
  if isinstance(graph, HighLevelGraph):
    full = HighLevelGraph.merge(graph, HighLevelGraph.from_collections(key, layer))
  else:
    full = dict(graph)
    full.update(layer)
  watcher = None
  if progress is not None:
    watcher = _Progress(record, len(tasks), progress, interval)
    watcher.start()
  start = time.perf_counter()
  try:
    if client is None:
      dask.threaded.get(dask.optimization.cull(dict(full), [key])[0], key)
    else:
      client.get(full, key)
  finally:
    if watcher is not None:
      watcher.stop.set()
      watcher.join()
  seconds = time.perf_counter() - start
  # This run computed a chunk if it started it (a chunk recorded before is skipped before
  # its attempt is recorded) and the chunk is now recorded complete. A task's own return
  # value cannot say so: one computed on a worker that died afterwards is lost, and its
  # retry finds the chunk recorded.
  mine = {n: runs.count(record.run_id) for n, runs in record.attempts().items()}
  finished = record.done()
  computed = [idx for idx in pending if mine.get(names[idx]) and names[idx] in finished]
  size = pixels or (lambda idx: int(np.prod([r.stop - r.start for r in sink.region(idx)])))
  if progress is not None:
    progress(len(finished), len(tasks), seconds)
  return WriteReport(
    total=len(tasks),
    computed=len(computed),
    skipped=len(tasks) - len(pending),
    recomputed=sum(1 for idx in computed if names[idx] in before),
    retried=sum(1 for idx in pending if mine.get(names[idx], 0) > 1),
    seconds=seconds,
    pixels=sum(size(idx) for idx in computed),
  )


def is_disk_full(error: BaseException) -> bool:
  return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
