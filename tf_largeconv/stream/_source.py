"""The image a stream reads, whatever holds it (numpy array, tensor, dask or zarr array,
memory map), and where its result goes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_largeconv.stream._plan import Range


class Source:
  """An image as (batch, *spatial, channels), read one window at a time.

  `layout` says how the caller's array maps to that: 'batched' (as is), 'single' (one
  image without a batch axis) or 'gray' (one image without batch or channel axes)."""

  def __init__(self, image: Any, rank: int, channels: int | None) -> None:
    if isinstance(image, (list, tuple)):
      image = np.asarray(image)
    shape = getattr(image, "shape", None)
    if shape is None or not hasattr(image, "__getitem__"):
      raise TypeError(
        "image must be an array: numpy, tf.Tensor, dask, zarr or a memory map, got "
        f"{type(image).__name__}"
      )
    shape = tuple(int(n) for n in shape)
    dtype = np.dtype(
      image.dtype.as_numpy_dtype if isinstance(image.dtype, tf.DType) else image.dtype
    )
    if not (np.issubdtype(dtype, np.number) or dtype == np.bool_):
      raise TypeError(f"image must hold numbers, got dtype {dtype}")
    if len(shape) == rank + 2:
      self.layout = "batched"
    elif len(shape) == rank + 1:
      self.layout = "single"
    elif len(shape) == rank and channels == 1:
      self.layout = "gray"
    else:
      raise ValueError(
        f"image must be (batch, {', '.join(['size'] * rank)}, channels) for this model, or one "
        f"image without the batch axis; got shape {shape}"
      )
    self.image = image
    self.shape = {"batched": shape, "single": (1, *shape), "gray": (1, *shape, 1)}[self.layout]
    if channels is not None and self.shape[-1] != channels:
      raise ValueError(
        f"image has {self.shape[-1]} channels (last axis of shape {shape}); the model takes "
        f"{channels}"
      )
    if min(self.shape[1:-1]) <= 0 or self.shape[0] <= 0:
      raise ValueError(f"image has an empty axis: shape {shape}")

  def _index(self, spans: Sequence[Range]) -> tuple[slice, ...]:
    spatial = tuple(slice(a, b) for a, b in spans)
    if self.layout == "batched":
      return (slice(None), *spatial, slice(None))
    if self.layout == "single":
      return (*spatial, slice(None))
    return spatial

  def read(self, spans: Sequence[Range]) -> np.ndarray:
    part = self.image[self._index(spans)]
    if hasattr(part, "compute"):
      part = part.compute()
    x = np.asarray(part)
    if self.layout == "batched":
      return x
    return x[None] if self.layout == "single" else x[None, ..., None]

  def result_shape(self, spatial: Sequence[int], channels: int) -> tuple[int, ...]:
    """The shape the result has for the caller: the input's layout kept."""
    if self.layout == "batched":
      return (self.shape[0], *spatial, channels)
    if self.layout == "single" or channels != 1:
      return (*spatial, channels)
    return tuple(spatial)

  def writer(self, out: Any) -> Any:
    """A function writing a tile (batch, *spatial, channels) into `out`, which has this
    source's layout."""

    def write(spans: Sequence[Range], tile: np.ndarray) -> None:
      spatial = tuple(slice(a, b) for a, b in spans)
      if self.layout == "batched":
        out[(slice(None),) + spatial + (slice(None),)] = tile
      elif len(out.shape) == len(spans) + 1:
        out[spatial + (slice(None),)] = tile[0]
      else:
        out[spatial] = tile[0, ..., 0]

    return write
