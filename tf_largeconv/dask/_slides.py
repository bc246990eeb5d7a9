"""Slides on disk as lazy dask arrays: TIFF (through tifffile's zarr store), zarr and .npy."""

from __future__ import annotations

import os

import dask.array as da
import numpy as np

TIFF_SUFFIXES = (".tif", ".tiff", ".svs", ".ndpi", ".scn", ".btf", ".qptiff")


class FileArray:
  """An array in a file as a picklable, sliceable array-like for `dask.array.from_array`.

  Only the path and the array's shape and dtype are pickled: each process that reads opens
  the file itself on first use, so a dask.distributed graph stays small (a numpy memmap
  would be pickled with all its data, and tifffile's zarr store holds an open file that does
  not pickle at all) and workers read the file from a shared disk.
  """

  def __init__(self, path):
    self.path = os.path.abspath(path)
    self._array = None
    a = self._open()
    self.shape, self.dtype, self.ndim = tuple(a.shape), np.dtype(a.dtype), len(a.shape)

  def _load(self):
    raise NotImplementedError

  def _open(self):
    if self._array is None:
      self._array = self._load()
    return self._array

  def __getitem__(self, key):
    return self._open()[key]

  def __getstate__(self):
    return dict(self.__dict__, _array=None)

  def __setstate__(self, state):
    self.__dict__.update(state)

  def __dask_tokenize__(self):
    st = os.stat(self.path)
    return (
      type(self).__name__,
      sorted(dict(self.__dict__, _array=None).items()),
      st.st_size,
      st.st_mtime_ns,
    )


class NpyFile(FileArray):
  """A numpy .npy file, read through a memory map."""

  def _load(self):
    return np.load(self.path, mmap_mode="r")


class TiffLevel(FileArray):
  """One pyramid level of a TIFF file, through tifffile's zarr store."""

  def __init__(self, path, level=0, series=0):
    self.level = level
    self.series = series
    super().__init__(path)

  def _load(self):
    import tifffile
    import zarr

    store = tifffile.imread(self.path, aszarr=True, series=self.series, level=self.level)
    return zarr.open(store, mode="r")


def _zarr_array(path):
  import zarr

  node = zarr.open(path, mode="r")
  if isinstance(node, zarr.Array):
    return node
  arrays = dict(node.arrays())
  if "0" in arrays:  # OME-Zarr: level 0 of the multiscale pyramid
    return arrays["0"]
  if len(arrays) == 1:
    return next(iter(arrays.values()))
  raise ValueError(
    f"{path} is a zarr group with arrays {sorted(arrays)}: give the path of "
    f"one array (e.g. {path}/{sorted(arrays)[0] if arrays else 'NAME'})"
  )


def open_slide(
  path: str, chunk: int = 2048, level: int = 0, channels_first: bool = False
) -> da.Array:
  """Opens a slide on disk as a lazy dask array, chunked `chunk` x `chunk` in its image
  axes (all of a channel axis in one chunk). Nothing is read until it is computed.

  Args:
    path: a TIFF file (.tif, .tiff, .svs, .ndpi, ...: pyramid `level`, 0 the full
      resolution), a zarr array (a directory; for a group, its array '0', as OME-Zarr
      stores level 0), or a numpy .npy file (read through a memory map). TIFF and .npy
      files are opened by each process that reads them (see `FileArray`), so the array
      also works on a dask.distributed cluster whose workers see the same path.
    chunk: rows and columns per chunk.
    level: the TIFF pyramid level.
    channels_first: a 3-D slide is C x H x W (default: H x W x C).

  Returns:
    A dask array of the file's shape and dtype: 2-D (H, W) or 3-D.

  Raises:
    FileNotFoundError: no such file.
    ValueError: a format it cannot read, or a zarr group without an obvious array.
  """
  if not os.path.exists(path):
    raise FileNotFoundError(f"no such slide: {path}")
  lower = path.lower().rstrip("/")
  source: FileArray  # or a zarr array
  if lower.endswith(".npy"):
    source = NpyFile(path)
  elif lower.endswith(TIFF_SUFFIXES):
    source = TiffLevel(path, level=level)
  elif os.path.isdir(path):
    source = _zarr_array(path)
  else:
    raise ValueError(
      f"cannot read {path}: expected a TIFF file ({', '.join(TIFF_SUFFIXES)}), "
      f"a zarr directory or a .npy file"
    )
  if len(source.shape) not in (2, 3):
    raise ValueError(
      f"{path} holds an array of shape {tuple(source.shape)}; a slide is 2-D "
      f"(H x W) or 3-D (H x W x C, or C x H x W)"
    )
  chunks: tuple[int, ...] = (chunk, chunk)
  if len(source.shape) == 3:
    chunks = (-1,) + chunks if channels_first else chunks + (-1,)
  if isinstance(source, FileArray):
    return da.from_array(source, chunks=chunks, asarray=True)
  return da.from_zarr(source, chunks=chunks)
