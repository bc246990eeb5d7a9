"""The one writer of the slide commands: a lazy result computed into zarr or OME-Zarr chunk
by chunk, resumably (through `_record`). Here: the output's layout, its fingerprint, the
OME-Zarr metadata and pyramid (made by ngff-zarr), and the `Result` both a convolution
(`conv_result`) and a streamed model (`array_result`) become.
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
from dask.base import tokenize

from tf_largeconv.dask import _record
from tf_largeconv.dask._record import WriteReport

FORMATS = ("zarr", "ome-zarr")
NGFF_VERSIONS = ("0.4", "0.5")
# The pyramid's coarsest level by default: halved until its longer side is at most this.
COARSEST = 1024


def filter_digest(filters: np.ndarray) -> str:
  """sha256 of a filter's dtype, shape and values."""
  h = hashlib.sha256(f"{filters.dtype.str}{filters.shape}".encode())
  h.update(np.ascontiguousarray(filters).tobytes())
  return h.hexdigest()


def file_signature(path: str) -> dict:
  """What identifies a file or directory's contents without reading them: per file under
  it, its size and modification time, digested (a record of ours inside is left out)."""
  path = os.path.abspath(path)
  h = hashlib.sha256()
  count = 0
  for root, dirs, files in os.walk(path):
    dirs[:] = sorted(d for d in dirs if d != _record.RECORD_DIR)
    for name in sorted(files):
      st = os.stat(os.path.join(root, name))
      h.update(
        f"{os.path.relpath(os.path.join(root, name), path)}:{st.st_size}:{st.st_mtime_ns};".encode()
      )
      count += 1
  if not count and os.path.isfile(path):
    st = os.stat(path)
    h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    count = 1
  return {"path": path, "files": count, "stat_sha256": h.hexdigest()}


def pyramid_levels(height: int, width: int) -> int:
  """Default OME-Zarr levels: halve until the longer side is at most COARSEST."""
  levels, longest = 1, max(height, width)
  while longest > COARSEST:
    longest = -(-longest // 2)
    levels += 1
  return levels


class Layout:
  """Where a 4-D (or 3-D) result goes: the output's axes (letters of the result's own,
  e.g. 'HW', 'HWC', 'CHW', 'NHWC'), shape and chunks.

  Args:
    source_format: the result's axes as letters, with H and W (e.g. 'NHWC', 'HWC').
    chunks: the result's chunks, as a dask array's.
    axes: the output's axes; default the result's for zarr, 'CHW' for OME-Zarr.
    fmt: 'zarr' or 'ome-zarr'.

  Raises:
    ValueError: axes that are not letters of the source format with H and W, a left-out
      axis longer than 1, an OME-Zarr output not 'HW' or 'CHW', or irregular chunks.
  """

  def __init__(self, source_format: str, chunks, axes: str | None, fmt: str) -> None:
    axes = axes or ("CHW" if fmt == "ome-zarr" else source_format)
    if (
      sorted(set(axes)) != sorted(axes)
      or not set(axes) <= set(source_format)
      or not {"H", "W"} <= set(axes)
    ):
      raise ValueError(
        f"output_axes must be letters of the data format {source_format} including H and W, "
        f"each once (e.g. 'HWC' or 'CHW'), got {axes!r}"
      )
    if fmt == "ome-zarr" and axes not in ("HW", "CHW"):
      raise ValueError(f"output_axes of an OME-Zarr output must be 'CHW' or 'HW', got {axes!r}")
    self.source_axes = tuple(source_format.index(a) for a in axes)
    for a, letter in enumerate(source_format):
      if letter not in axes and sum(chunks[a]) != 1:
        raise ValueError(
          f"output_axes {axes!r} leaves out {letter}, whose length is {sum(chunks[a])}, not 1"
        )
    for a in self.source_axes:
      if any(c != chunks[a][0] for c in chunks[a][:-1]) or chunks[a][-1] > chunks[a][0]:
        raise ValueError(
          f"the result's {source_format[a]} chunks {chunks[a]} are not regular, as a zarr "
          f"array's must be: chunk the input's rows and columns in multiples of the stride"
        )
    self.axes = axes
    self.shape = tuple(int(sum(chunks[a])) for a in self.source_axes)
    self.chunks = tuple(int(chunks[a][0]) for a in self.source_axes)
    self._hw = [(chunks[source_format.index(a)], source_format.index(a)) for a in "HW"]

  def pixels(self, index: tuple[int, ...]) -> int:
    """Rows x columns of the result's chunk `index`."""
    (h, ih), (w, iw) = self._hw
    return int(h[index[ih]] * w[index[iw]])


def output_scale(forward, scale: dict | None, translation: dict | None) -> tuple[dict, dict]:
  """The output pixels' physical size and origin (y, x) from the input's: output pixel o
  is the centre of its window, input pixels [o * stride - pad, ... + extent)."""
  out_scale, out_translation = {}, {}
  for axis, a in zip(("y", "x"), forward.problem.axes()):
    s = float((scale or {}).get(axis, 1.0))
    t = float((translation or {}).get(axis, 0.0))
    out_scale[axis] = s * a.stride
    out_translation[axis] = t + s * ((a.extent - 1) / 2 - a.pad_before)
  return out_scale, out_translation


class _Ome:
  """The OME-Zarr side of an output: its multiscales (ngff-zarr) for metadata and pyramid."""

  def __init__(self, layout, dtype, levels, version, scale, translation, units) -> None:
    import dask.array as da

    from tf_largeconv.dask._slides import _ngff_zarr

    self.nz = _ngff_zarr()
    self.da = da
    self.layout, self.dtype, self.levels, self.version = layout, dtype, levels, version
    self.dims = tuple(
      "c" if a == "C" else a.lower().replace("h", "y").replace("w", "x") for a in layout.axes
    )
    self.scale, self.translation = scale, translation
    self.units = {k: v for k, v in (units or {}).items() if v and k in ("y", "x")}

  def multiscales(self, data):
    image = self.nz.to_ngff_image(
      data,
      dims=self.dims,
      scale=self.scale,
      translation=self.translation,
      axes_units=self.units or None,
    )
    return self.nz.to_multiscales(
      image,
      scale_factors=[2**k for k in range(1, self.levels)],
      chunks=dict(zip(self.dims, self.layout.chunks)),
      method=self.nz.Methods.ITKWASM_BIN_SHRINK,
    )

  def placeholder(self):
    return self.multiscales(
      self.da.zeros(self.layout.shape, chunks=self.layout.chunks, dtype=self.dtype)
    )

  def create(self, path: str) -> None:
    self.nz.to_ome_zarr(path, self.placeholder(), version=self.version, metadata_only=True)

  def level0(self) -> str:
    return self.placeholder().metadata.datasets[0].path

  def pyramid(self, path: str) -> None:
    level0 = self.da.from_zarr(os.path.join(path, self.level0()))
    self.nz.to_ome_zarr(
      path, self.multiscales(level0), version=self.version, start_level=1, overwrite=False
    )


class Result:
  """A lazy result for `write_result`, from whatever computes it.

  Attributes:
    source_format: its axes as letters, with H and W (e.g. 'NHWC', 'HWC').
    chunks: its chunks, as a dask array's.
    dtype: its numpy dtype.
    graph: the dask graph (HighLevelGraph or dict) its tasks' arguments refer to.
    tasks: per chunk index, `(compute, *args)`: `compute(*args)` gives that chunk.
    identity: JSON-able fields that define its values (the input's identity, the filter or
      the model, the arguments); part of the output's fingerprint.
    scale, translation: its pixels' physical size and origin along 'y' and 'x'.
  """

  def __init__(
    self,
    source_format: str,
    chunks,
    dtype,
    graph,
    tasks: dict,
    identity: dict,
    scale: dict | None = None,
    translation: dict | None = None,
  ) -> None:
    self.source_format, self.chunks, self.dtype = source_format, chunks, np.dtype(dtype)
    self.graph, self.tasks, self.identity = graph, tasks, identity
    self.scale = {"y": 1.0, "x": 1.0} if scale is None else dict(scale)
    self.translation = {"y": 0.0, "x": 0.0} if translation is None else dict(translation)


def conv_result(forward, scale: dict | None = None, translation: dict | None = None) -> Result:
  """The Result of a convolution (a `_graph.Forward`); `scale` and `translation` are its
  input's (see `output_scale`)."""
  shared, tasks = forward.chunk_tasks()
  out_scale, out_translation = output_scale(forward, scale, translation)
  identity = {
    "input": {"token": tokenize(forward.x), "shape": list(forward.x.shape)},
    "filters": filter_digest(forward.filters),
    "op": dict(forward.attrs),
  }
  return Result(
    forward.attrs["data_format"],
    forward.out_chunks,
    forward.dtype,
    forward.graph(shared),
    tasks,
    identity,
    out_scale,
    out_translation,
  )


def _chunk(block: np.ndarray) -> np.ndarray:
  return block


def array_result(
  array, source_format: str, identity: dict, scale: dict | None = None, translation=None
) -> Result:
  """The Result of a lazy dask array (e.g. a streamed model's), one task per chunk."""
  tasks = {idx: (_chunk, (array.name,) + idx) for idx in np.ndindex(*array.numblocks)}
  return Result(
    source_format,
    array.chunks,
    array.dtype,
    array.__dask_graph__(),
    tasks,
    identity,
    scale,
    translation,
  )


def _ome(layout: Layout, result: Result, levels, version: str, units) -> _Ome:
  h, w = (layout.shape[layout.axes.index(a)] for a in "HW")
  levels = pyramid_levels(h, w) if levels is None else int(levels)
  if levels < 1:
    raise ValueError(f"levels must be at least 1, got {levels}")
  return _Ome(layout, result.dtype, levels, version, result.scale, result.translation, units)


def _fingerprint(result: Result, layout: Layout, fmt, ome, version, caller) -> dict:
  return {
    "record": 1,
    **result.identity,
    "dtype": result.dtype.name,
    "output": {
      "format": fmt,
      "axes": layout.axes,
      "shape": list(layout.shape),
      "chunks": list(layout.chunks),
      "levels": ome.levels if ome else None,
      "ngff_version": version if ome else None,
      "scale": None if ome is None else ome.scale,
      "units": None if ome is None else ome.units,
    },
    "caller": caller or {},
  }


def write_result(
  result: Result,
  output: str,
  *,
  output_axes: str | None = None,
  fmt: str = "zarr",
  levels: int | None = None,
  ngff_version: str = "0.5",
  units: dict | None = None,
  compressors="auto",
  mode: str = "new",
  fingerprint: dict | None = None,
  client=None,
  progress=None,
  interval: float = 1.0,
) -> WriteReport:
  """Computes `result` into `output` (zarr, or OME-Zarr with a pyramid) chunk by chunk with
  a record, so that an interrupted run resumes (see `tf_largeconv.dask.conv2d_to_zarr` for
  the arguments; `fingerprint`: more fields that define the output)."""
  if fmt not in FORMATS:
    raise ValueError(f"output format must be one of {FORMATS}, got {fmt!r}")
  if ngff_version not in NGFF_VERSIONS:
    raise ValueError(f"ngff_version must be one of {NGFF_VERSIONS}, got {ngff_version!r}")
  layout = Layout(result.source_format, result.chunks, output_axes, fmt)
  ome = _ome(layout, result, levels, ngff_version, units) if fmt == "ome-zarr" else None
  fp = _fingerprint(result, layout, fmt, ome, ngff_version, fingerprint)
  path = os.path.abspath(output)

  def create():
    if ome is not None:
      ome.create(path)
    else:
      import zarr

      zarr.create_array(
        path, shape=layout.shape, chunks=layout.chunks, dtype=result.dtype, compressors=compressors
      )

  record = _record.open_output(path, fp, mode, create, what=f"the output {output}")
  sink = _record.ZarrSink(record, ome.level0() if ome else "", result.chunks, layout.source_axes)
  wrapped = {idx: (_record.run_chunk, sink, idx) + task for idx, task in result.tasks.items()}
  report = _record.run(
    result.graph,
    wrapped,
    sink,
    client=client,
    progress=progress,
    interval=interval,
    pixels=layout.pixels,
  )
  if ome is not None and ome.levels > 1 and not record.has_step("pyramid"):
    start = time.perf_counter()
    ome.pyramid(path)
    record.finish_step("pyramid")
    report = report._replace(pyramid_seconds=time.perf_counter() - start)
  return report


def write(
  forward,
  output: str,
  *,
  scale: dict | None = None,
  translation: dict | None = None,
  **options,
) -> WriteReport:
  """Computes `forward` (a `_graph.Forward`) into `output` (see `write_result` for
  `options`; `scale`, `translation`: the input's pixel size and origin)."""
  return write_result(conv_result(forward, scale, translation), output, **options)
