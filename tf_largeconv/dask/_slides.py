"""Slides on disk as lazy dask arrays: the scanners' formats (SVS, NDPI, MRXS, DICOM-WSI and
the others OpenSlide reads, where the `slides` extra is installed), TIFF (through tifffile's
zarr store), zarr, OME-Zarr (NGFF 0.4 and 0.5, its metadata read by ngff-zarr) and .npy."""

from __future__ import annotations

import collections
import os

import dask.array as da
import numpy as np

TIFF_SUFFIXES = (".tif", ".tiff", ".svs", ".ndpi", ".scn", ".btf", ".qptiff")
# Formats only OpenSlide reads (MIRAX, DICOM-WSI, Hamamatsu VMS/VMU, Ventana BIF, Sakura).
OPENSLIDE_SUFFIXES = (".mrxs", ".dcm", ".vms", ".vmu", ".bif", ".svslide")


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
    try:
      return self._open()[key]
    except (ValueError, IndexError, TypeError):
      raise
    except Exception as e:  # a decoder's or the file system's error, whatever its class
      raise ValueError(f"cannot read {key} of {self.path}: {type(e).__name__}: {e}") from e

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

    try:
      with tifffile.TiffFile(self.path) as tif:
        levels = len(tif.series[self.series].levels)
    except (tifffile.TiffFileError, OSError, ValueError, IndexError) as e:
      raise ValueError(f"cannot read the TIFF slide {self.path}: {e}") from e
    if not 0 <= self.level < levels:
      raise ValueError(
        f"--level {self.level} (level={self.level}): the slide {self.path} has levels 0 to "
        f"{levels - 1}"
      )
    store = tifffile.imread(self.path, aszarr=True, series=self.series, level=self.level)
    return zarr.open(store, mode="r")


def _openslide():
  try:
    import openslide
  except ImportError as e:
    raise ImportError(
      "scanner formats (SVS, NDPI, MRXS, DICOM-WSI) are read through OpenSlide: "
      "pip install 'tf_largeconv[slides]' (openslide-python and openslide-bin)"
    ) from e
  return openslide


def _openslide_format(path):
  """The vendor format OpenSlide finds in `path` ('aperio', 'hamamatsu', 'mirax', 'dicom',
  ...), or None where OpenSlide is not installed, does not know the file, or finds only a
  generic tiled TIFF (which tifffile reads with its dtype and channels kept)."""
  try:
    import openslide
  except ImportError:
    return None
  found = openslide.OpenSlide.detect_format(path)
  return None if found in (None, "generic-tiff") else found


class _SlideWindows:
  """One pyramid level of an OpenSlide slide as an H x W x 3 uint8 array-like: each read is
  one `read_region` of the window asked for, its transparent pixels (outside the scanned
  area) composited over the slide's background colour (white where it names none)."""

  def __init__(self, path, level):
    openslide = _openslide()
    try:
      self._slide = openslide.OpenSlide(path)
    except openslide.OpenSlideError as e:
      raise ValueError(f"cannot read the slide {path} through OpenSlide: {e}") from e
    levels = self._slide.level_count
    if not 0 <= level < levels:
      raise ValueError(
        f"--level {level} (level={level}): the slide {path} has levels 0 to {levels - 1}"
      )
    self.path, self.level = path, level
    width, height = self._slide.level_dimensions[level]
    self.shape, self.dtype = (height, width, 3), np.dtype(np.uint8)
    self._downsample = self._slide.level_downsamples[level]
    colour = self._slide.properties.get("openslide.background-color") or "FFFFFF"
    self._background = np.array([int(colour[i : i + 2], 16) for i in (0, 2, 4)], np.float32)

  def __getitem__(self, key):
    key = key if isinstance(key, tuple) else (key,)
    key = key + (slice(None),) * (3 - len(key))
    rows, cols = (
      k if isinstance(k, slice) else slice(k, k + 1 if k != -1 else None) for k in key[:2]
    )
    (y0, y1, ystep), (x0, x1, xstep) = rows.indices(self.shape[0]), cols.indices(self.shape[1])
    height, width = max(y1 - y0, 0), max(x1 - x0, 0)
    window = np.empty((height, width, 3), np.uint8)
    if height and width:
      window[...] = self._read(y0, x0, height, width)
    keep = tuple(slice(None, None, s) for s in (ystep, xstep))
    # A step or an integer index is applied to the window that was read.
    picked = window[keep][:, :, key[2]]
    return picked[tuple(0 if not isinstance(k, slice) else slice(None) for k in key[:2])]

  def _read(self, y0, x0, height, width):
    openslide = _openslide()
    origin = (int(round(x0 * self._downsample)), int(round(y0 * self._downsample)))
    try:
      rgba = np.asarray(self._slide.read_region(origin, self.level, (width, height)))
    except openslide.OpenSlideError as e:
      raise ValueError(
        f"cannot read rows {y0}:{y0 + height}, columns {x0}:{x0 + width} of level "
        f"{self.level} of the slide {self.path}: {e}"
      ) from e
    alpha = rgba[..., 3:].astype(np.float32) / 255.0
    mixed = rgba[..., :3] * alpha + self._background * (1.0 - alpha)
    return np.rint(mixed).astype(np.uint8)


class OpenSlideLevel(FileArray):
  """One pyramid level of a slide OpenSlide reads (SVS, NDPI, MRXS, DICOM-WSI, ...), read
  window by window as H x W x 3 uint8 (RGB)."""

  def __init__(self, path, level=0):
    self.level = level
    super().__init__(path)

  def _load(self):
    return _SlideWindows(self.path, self.level)


OmeImage = collections.namedtuple("OmeImage", ["array_path", "dims", "scale", "units", "levels"])
OmeImage.__doc__ = """One level of an OME-Zarr image: the path of its zarr array, its axes
(names: 't', 'c', 'z', 'y', 'x'), per axis its scale (physical size of a pixel) and unit
(None where the metadata gives none), and how many levels the image has."""


def is_ome_zarr(path: str) -> bool:
  """Whether `path` is a zarr group with OME-NGFF multiscales metadata (0.4 or 0.5)."""
  import zarr

  if not os.path.isdir(path):
    return False
  try:
    node = zarr.open(path, mode="r")
  except (OSError, ValueError, KeyError, TypeError):
    return False
  attrs = dict(node.attrs) if isinstance(node, zarr.Group) else {}
  ome = attrs.get("ome")
  return "multiscales" in attrs or (isinstance(ome, dict) and "multiscales" in ome)


def _ngff_zarr():
  try:
    import ngff_zarr
  except ImportError as e:
    raise ImportError(
      "OME-Zarr slides need ngff-zarr, part of the dask extra: pip install 'tf_largeconv[dask]'"
    ) from e
  return ngff_zarr


def ome_image(path: str, level: int = 0) -> OmeImage:
  """The OME-Zarr image at `path`, level `level` (0: full resolution), from its metadata.

  Raises:
    ValueError: no such level, or not an image with 'y' and 'x' axes.
  """
  multiscales = _ngff_zarr().from_ome_zarr(path)
  levels = len(multiscales.images)
  if not 0 <= level < levels:
    raise ValueError(
      f"--level {level} (level={level}): the OME-Zarr image {path} has levels 0 to {levels - 1}"
    )
  image = multiscales.images[level]
  dims = tuple(str(d) for d in image.dims)
  if "y" not in dims or "x" not in dims:
    raise ValueError(f"the OME-Zarr image {path} has axes {dims}: a slide needs 'y' and 'x'")
  array_path = os.path.join(path, multiscales.metadata.datasets[level].path)
  units = {str(k): v for k, v in (image.axes_units or {}).items()}
  return OmeImage(
    array_path, dims, {str(k): float(v) for k, v in image.scale.items()}, units, levels
  )


def _ome_slide(path, chunk, level):
  """An OME-Zarr level as a dask array y x [c] (channels last): its axes other than y, x
  and c must have length 1."""
  import zarr

  info = ome_image(path, level)
  source = zarr.open_array(info.array_path, mode="r")
  x = da.from_zarr(source)
  index = tuple(0 if d not in ("y", "x", "c") else slice(None) for d in info.dims)
  extra = {d: n for d, n in zip(info.dims, source.shape) if d not in ("y", "x", "c") and n != 1}
  if extra:
    raise ValueError(
      f"the OME-Zarr image {path} has {extra} along axes other than y, x and c; a slide is "
      f"one plane (take one with dask and pass the array to tf_largeconv.dask.conv2d)"
    )
  kept = [d for d in info.dims if d in ("y", "x", "c")]
  order = ["y", "x"] + (["c"] if "c" in kept else [])
  x = x[index].transpose([kept.index(d) for d in order])
  chunks = (chunk, chunk) + ((-1,) if "c" in kept else ())
  return x.rechunk(chunks)


def _zarr_array(path):
  import zarr

  node = zarr.open(path, mode="r")
  if isinstance(node, zarr.Array):
    return node
  arrays = dict(node.arrays())
  if "0" in arrays:  # a group with a pyramid's level 0 at "0", as many writers store it
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
    path: a scanner's slide that OpenSlide reads (SVS, NDPI, MRXS, DICOM-WSI, SCN, ...;
      with the `slides` extra: pyramid `level`, 0 the full resolution, as H x W x 3 RGB
      uint8, transparent areas over the slide's background colour), a TIFF file (.tif,
      .tiff, and .svs/.ndpi without OpenSlide: pyramid `level`), an OME-Zarr image
      (NGFF 0.4 or 0.5: pyramid `level`, its axes from its metadata), a zarr array (a
      directory; for a group, its array '0'), or a numpy .npy file (read through a memory
      map). Scanners' slides, TIFF and .npy files are opened by each process that reads
      them (see `FileArray`), so the array also works on a dask.distributed cluster whose
      workers see the same path.
    chunk: rows and columns per chunk.
    level: the pyramid level (scanners' slides, TIFF, OME-Zarr).
    channels_first: a 3-D slide is C x H x W (default: H x W x C). Not for OME-Zarr, whose
      metadata names its axes: its slide is H x W, or H x W x C where it has a channel axis.

  Returns:
    A dask array of the file's shape and dtype: 2-D (H, W) or 3-D.

  Raises:
    FileNotFoundError: no such file.
    ValueError: a format it cannot read, a file that is not whole, a pyramid level the
      slide does not have, a zarr group without an obvious array, an OME-Zarr image with
      more than one plane; each names the file.
    ImportError: an OpenSlide-only format (.mrxs, .dcm, ...) without the `slides` extra.
  """
  if not os.path.exists(path):
    raise FileNotFoundError(f"no such slide: {path}")
  if is_ome_zarr(path):
    if channels_first:
      raise ValueError(
        f"{path} is OME-Zarr, whose metadata names its axes: leave out --channels-first "
        f"(channels_first)"
      )
    return _ome_slide(path, chunk, level)
  lower = path.lower().rstrip("/")
  source: FileArray  # or a zarr array
  if lower.endswith(".npy"):
    source = NpyFile(path)
  elif lower.endswith(OPENSLIDE_SUFFIXES) or _openslide_format(path):
    if channels_first:
      raise ValueError(f"{path} is a scanner's slide, read as H x W x 3: leave out channels_first")
    source = OpenSlideLevel(path, level=level)
  elif lower.endswith(TIFF_SUFFIXES):
    source = TiffLevel(path, level=level)
  elif os.path.isdir(path):
    source = _zarr_array(path)
  else:
    raise ValueError(
      f"cannot read {path}: expected a slide OpenSlide reads "
      f"({', '.join(OPENSLIDE_SUFFIXES)}, .svs, .ndpi, ...), a TIFF file "
      f"({', '.join(TIFF_SUFFIXES)}), a zarr directory or a .npy file"
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
