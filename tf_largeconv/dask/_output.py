"""A dask convolution written into zarr or OME-Zarr chunk by chunk, resumably (through
`_record`): the output's layout, its fingerprint, and the OME-Zarr metadata and pyramid
(made by ngff-zarr)."""

from __future__ import annotations

import collections
import hashlib
import os
import time

import numpy as np
from dask.base import tokenize

from tf_largeconv.dask import _record

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
  """Where the convolution's 4-D result goes: the output's axes (letters of the data
  format, e.g. 'HW', 'HWC', 'CHW', 'NHWC'), shape and chunks.

  Raises:
    ValueError: axes that are not letters of the data format with H and W, a left-out axis
      longer than 1, an OME-Zarr output not 'HW' or 'CHW', or irregular chunks.
  """

  def __init__(self, forward, axes: str | None, fmt: str) -> None:
    data_format = forward.attrs["data_format"]
    axes = axes or ("CHW" if fmt == "ome-zarr" else data_format)
    if (
      sorted(set(axes)) != sorted(axes)
      or not set(axes) <= set(data_format)
      or not {"H", "W"} <= set(axes)
    ):
      raise ValueError(
        f"output_axes must be letters of the data format {data_format} including H and W, "
        f"each once (e.g. 'HWC' or 'CHW'), got {axes!r}"
      )
    if fmt == "ome-zarr" and axes not in ("HW", "CHW"):
      raise ValueError(f"output_axes of an OME-Zarr output must be 'CHW' or 'HW', got {axes!r}")
    self.source_axes = tuple(data_format.index(a) for a in axes)
    chunks = forward.out_chunks
    for a, letter in enumerate(data_format):
      if letter not in axes and sum(chunks[a]) != 1:
        raise ValueError(
          f"output_axes {axes!r} leaves out {letter}, whose length is {sum(chunks[a])}, not 1"
        )
    for a in self.source_axes:
      if any(c != chunks[a][0] for c in chunks[a][:-1]) or chunks[a][-1] > chunks[a][0]:
        raise ValueError(
          f"the result's {data_format[a]} chunks {chunks[a]} are not regular, as a zarr "
          f"array's must be: chunk the input's rows and columns in multiples of the stride"
        )
    self.axes = axes
    self.shape = tuple(int(sum(chunks[a])) for a in self.source_axes)
    self.chunks = tuple(int(chunks[a][0]) for a in self.source_axes)

  def pixels(self, index: tuple[int, ...], forward) -> int:
    h, w = (forward.attrs["data_format"].index(a) for a in "HW")
    return int(forward.out_chunks[h][index[h]] * forward.out_chunks[w][index[w]])


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
  )
):
  """What `conv2d_to_zarr` did, in chunks of the output (its level 0 for OME-Zarr).

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


def write(
  forward,
  output: str,
  *,
  output_axes: str | None = None,
  fmt: str = "zarr",
  levels: int | None = None,
  ngff_version: str = "0.5",
  scale: dict | None = None,
  translation: dict | None = None,
  units: dict | None = None,
  compressors="auto",
  mode: str = "new",
  fingerprint: dict | None = None,
  client=None,
  progress=None,
  interval: float = 1.0,
) -> WriteReport:
  """Computes `forward` (a `_graph.Forward`) into `output` chunk by chunk with a record
  (see `tf_largeconv.dask.conv2d_to_zarr`)."""
  if fmt not in FORMATS:
    raise ValueError(f"output format must be one of {FORMATS}, got {fmt!r}")
  if ngff_version not in NGFF_VERSIONS:
    raise ValueError(f"ngff_version must be one of {NGFF_VERSIONS}, got {ngff_version!r}")
  layout = Layout(forward, output_axes, fmt)
  ome = None
  if fmt == "ome-zarr":
    h, w = (layout.shape[layout.axes.index(a)] for a in "HW")
    levels = pyramid_levels(h, w) if levels is None else int(levels)
    if levels < 1:
      raise ValueError(f"levels must be at least 1, got {levels}")
    out_scale, out_translation = output_scale(forward, scale, translation)
    ome = _Ome(layout, forward.dtype, levels, ngff_version, out_scale, out_translation, units)
  fp = {
    "record": 1,
    "input": {"token": tokenize(forward.x), "shape": list(forward.x.shape)},
    "filters": filter_digest(forward.filters),
    "op": dict(forward.attrs),
    "dtype": forward.dtype.name,
    "output": {
      "format": fmt,
      "axes": layout.axes,
      "shape": list(layout.shape),
      "chunks": list(layout.chunks),
      "levels": levels if ome else None,
      "ngff_version": ngff_version if ome else None,
      "scale": None if ome is None else ome.scale,
      "units": None if ome is None else ome.units,
    },
    "caller": fingerprint or {},
  }
  path = os.path.abspath(output)

  def create():
    if ome is not None:
      ome.create(path)
    else:
      import zarr

      zarr.create_array(
        path,
        shape=layout.shape,
        chunks=layout.chunks,
        dtype=forward.dtype,
        compressors=compressors,
      )

  record = _record.open_output(path, fp, mode, create, what=f"the output {output}")
  sink = _record.ZarrSink(
    record, ome.level0() if ome else "", forward.out_chunks, layout.source_axes
  )
  shared, tasks = forward.chunk_tasks()
  wrapped = {idx: (_record.run_chunk, sink, idx) + task for idx, task in tasks.items()}
  report = _record.run(
    forward.graph(shared),
    wrapped,
    sink,
    client=client,
    progress=progress,
    interval=interval,
    pixels=lambda idx: layout.pixels(idx, forward),
  )
  pyramid_seconds = 0.0
  if ome is not None and ome.levels > 1 and not record.has_step("pyramid"):
    start = time.perf_counter()
    ome.pyramid(path)
    record.finish_step("pyramid")
    pyramid_seconds = time.perf_counter() - start
  return WriteReport(*report, pyramid_seconds)
