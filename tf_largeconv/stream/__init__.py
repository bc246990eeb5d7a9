"""tf_largeconv.stream: whole Keras networks over images larger than memory, tile by tile,
with results equal to the untiled network's.

`predict(model, image)` cuts the model's output into tiles. For each tile it works out,
layer by layer back to the input, the exact range of every layer's output the tile needs
(its receptive field: each convolution or pooling widens it by its kernel extent, each
stride and upsampling rescales it), reads just that window of the image, and runs every
layer over its range only. Where a window reaches past an edge of the image, each layer sees
exactly the padding it would see on the whole image, so every output pixel is computed from
the same values as in `model(image)`; only the summation order inside a kernel can differ
(float rounding).

What streams (channels-last models, 1-D, 2-D or 3-D): convolutions of any kernel, stride,
dilation and padding (Keras's and tf_largeconv's, depthwise, separable, grouped, causal,
transposed, FoldedBlock), max and average pooling, upsampling (nearest, bilinear), zero
padding and cropping, batch normalization at inference, layer normalization over channels,
element-wise activations and operations, dropout and noise layers (identity at inference),
Dense on the channel axis, any other layer whose traced call is element by element or over
the channel axis only (`_trace`), merges of branches (Add, Concatenate, ... : U-Net skips across
resolutions included) and nested models. Global average or max pooling may end the image
part: it is reduced across tiles, then the layers after it (the head) run once.

A layer whose output pixel depends on the whole image (Flatten, Reshape, attention,
resizing to a fixed size, a pooled value broadcast back over the image) is refused with an
error naming it: stream the model up to the layer before it (`up_to=`).

Memory: a tile holds the windows of the layers alive at once; `plan()` shows the estimate
and the tile chosen for a memory limit. A deep network may run in stages (`stages=`): cut
where few values are alive, each stage tiled with only its own halo, the values at each cut
handed on through temporary files on disk, so that less work is recomputed in overlaps.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tf_largeconv.stream import _convert
from tf_largeconv.stream import _graph
from tf_largeconv.stream import _layers
from tf_largeconv.stream import _plan
from tf_largeconv.stream import _stages
from tf_largeconv.stream._layers import register_pointwise
from tf_largeconv.stream._plan import DEFAULT_MEMORY_LIMIT
from tf_largeconv.stream._report import StreamPlan
from tf_largeconv.stream._source import Source
from tf_largeconv.stream._train import StreamingModel


def _check_stages(stages: Any) -> Any:
  """`stages` as the planner takes it: None, a bool or a tuple of layer names."""
  if stages is None or isinstance(stages, bool):
    return stages
  if isinstance(stages, (list, tuple)) and stages and all(isinstance(n, str) for n in stages):
    return tuple(stages)
  raise ValueError(
    f"stages must be None (automatic), True, False or a list of layer names, got {stages!r}"
  )


# The graph and plan of the last PLANS_PER_MODEL settings (up_to, image shape, tile, limit,
# stages) each Keras 3 model was streamed with, so that a model streamed over many images
# of one size plans once (planning ResNet50 in stages takes about 0.6 s). The graph reads
# the layers' weights each time it runs; only the model's structure is fixed in it.
_PLANS: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], tuple[Any, StreamPlan]]] = (
  weakref.WeakKeyDictionary()
)
PLANS_PER_MODEL = 4
_PLANS_LOCK = threading.Lock()


def _prepare(
  model: Any,
  image: Any,
  tile: int | None,
  memory_limit: int | None,
  up_to: str | None,
  stages: Any = False,
) -> tuple[Any, Any, Source, StreamPlan]:
  """(the Keras 3 model streamed, its graph, the image, the plan)."""
  _plan.check_tile(tile, memory_limit)
  stages = _check_stages(stages)
  twin = _convert.keras3(model)
  graph = _graph.build(twin, up_to)
  source = Source(image, graph.rank, graph.channels[0])
  if twin is not model:  # a tf_keras model's twin holds a copy of its weights: built anew
    return twin, graph, source, _stages.plan(graph, source.shape, tile, memory_limit, stages)
  limit = _plan.DEFAULT_MEMORY_LIMIT if memory_limit is None else memory_limit
  key = (up_to, source.shape, tile, limit, stages, len(_layers.POINTWISE))
  with _PLANS_LOCK:  # predict may run in several threads at once (dask's threaded scheduler)
    known = _PLANS.setdefault(model, {})
    if key not in known:
      known[key] = graph, _stages.plan(graph, source.shape, tile, memory_limit, stages)
      while len(known) > PLANS_PER_MODEL:
        known.pop(next(iter(known)))
    else:
      known[key] = known.pop(key)  # the most recent last
    graph, stream_plan = known[key]
  return model, graph, source, stream_plan


def plan(
  model: Any,
  image: Any,
  *,
  tile: int | None = None,
  memory_limit: int | None = None,
  up_to: str | None = None,
  stages: bool | Sequence[str] | None = None,
) -> StreamPlan:
  """The memory plan `predict` would follow, without computing anything: the tile size, the
  number of tiles, each layer's halo, the share of work recomputed in the overlaps, the
  stages and their temporary files, and the memory the run takes (`peak_bytes`,
  `worst_bytes`). `print()` it for a table.

  `to_dask` and `StreamingModel` always run one stage: their plan is this one with
  `stages=False`.

  Args:
    model, image, tile, memory_limit, up_to, stages: as for `predict` (image may also be
      just a shape tuple: (batch, *spatial, channels)).
  """
  if isinstance(image, tuple) and all(isinstance(n, (int, np.integer)) for n in image):
    image = np.broadcast_to(np.zeros((), np.float32), image)
  return _prepare(model, image, tile, memory_limit, up_to, stages)[3]


def predict(
  model: Any,
  image: Any,
  *,
  tile: int | None = None,
  memory_limit: int | None = None,
  up_to: str | None = None,
  out: Any = None,
  progress: Callable[[int, int], None] | None = None,
  stages: bool | Sequence[str] | None = None,
) -> Any:
  """`model(image, training=False)`, computed tile by tile.

  Args:
    model: a Keras 3 model, functional or Sequential, built on an input of shape
      (batch, *spatial, channels), channels last; or a tf_keras (Keras 2) model of the
      same layers, streamed as its Keras 3 twin (rebuilt from its HDF5 form, which needs
      h5py, with a copy of its weights).
    image: a batch of images (batch, *spatial, channels) as a numpy array or a tensor, or
      one image without the batch axis (*spatial, channels), e.g. a slide from
      `tf_largeconv.dask.open_slide`, a dask or zarr array or a memory map (read one
      window at a time). A grayscale image (*spatial) is taken for a one-channel model.
    tile: the side, in input pixels, of the part of the image each step computes (its
      halo not counted); rounded down to a multiple of the network's total stride where
      that is smaller. A tile larger than the image: one step. None: the largest tile
      whose memory at its worst (`plan(...).worst_bytes`) fits `memory_limit`.
    memory_limit: bytes a step may hold (default 1 GiB); used when `tile` is None.
    up_to: the name of a layer: stream the model up to that layer's output.
    out: where to write the result (an array of the result's shape: numpy, zarr, memory
      map), tile by tile; by default a new numpy array.
    progress: called as progress(tiles done, tiles in all) after each tile.
    stages: whether to run the network in stages through disk, each tiled with only its
      own halo (cut where few values are alive, before any global pooling; those values go
      to temporary `.npy` files in the system's temporary folder (`TMPDIR`), removed
      afterwards, also on error; `plan(...).disk_bytes` says how many bytes). None
      (default): where that cuts the work by 5% or more, the tile being chosen from
      `memory_limit`; True: at the cuts that cost least, even with `tile`; False: never;
      a list of layer names: cut after each of those layers.

  Returns:
    The result as a numpy array (or `out`), shaped as the model's output for `image`
    (without the batch axis when image has none). After a global pooling the result is
    the head's output.

  Raises:
    TypeError: model is not a Keras model; image is not a numeric array.
    ValueError: a layer that cannot be streamed (the message names it and where to split
      the model); an image whose shape does not fit the model; malformed tile,
      memory_limit, up_to, out or stages (a layer not followed by a cut); a memory_limit
      too small for one output pixel.
  """
  _, graph, source, stream_plan = _prepare(model, image, tile, memory_limit, up_to, stages)
  geometry = stream_plan.tiling.geometry
  spatial = graph.spatial.get(graph.output, False)
  write = None
  if spatial:
    shape = source.result_shape(geometry.out_sizes, graph.channels[graph.output] or 1)
    if out is None:
      out = np.empty(shape, graph.out_dtype)
    elif tuple(getattr(out, "shape", ())) != shape:
      raise ValueError(
        f"out must have the result's shape {shape}, got {getattr(out, 'shape', None)}"
      )
    write = source.writer(out)
  elif out is not None:
    raise ValueError("out: the model ends in a global pooling; its result is returned, not written")
  values = _stages.run(stream_plan, source.read, graph.input_dtype, write, progress)
  if spatial:
    return out
  result = values[graph.output]
  result = np.asarray(result.numpy() if isinstance(result, tf.Tensor) else result)
  return result if source.layout == "batched" else result[0]


def to_dask(
  model: Any,
  image: Any,
  *,
  tile: int | None = None,
  memory_limit: int | None = None,
  up_to: str | None = None,
  name: str | None = None,
) -> Any:
  """`predict` as a lazy dask array: one task per output tile, on any dask scheduler
  (dask.distributed included). Each task reads exactly its input window: the input chunks
  inside it and halo strips cut from the chunks around it, as `tf_largeconv.dask` does.

  Needs the `dask` extra. The model goes to each worker process once, as its `.keras`
  archive (custom layers must be importable there, as for `keras.saving.load_model`).

  Args:
    model, tile, memory_limit, up_to: as for `predict` (memory_limit bounds each task's
      tile; the task also holds its input pieces).
    image: a dask array, batched or one image (e.g. `tf_largeconv.dask.open_slide`).
    name: prefix of the dask keys; default 'largeconv-stream'.

  Returns:
    A dask array shaped as `predict`'s result, chunked by tile (batch and channels whole),
    whose `compute()` equals `predict(model, image, tile=...)` bit for bit; store it with
    `to_zarr`.

  Raises:
    TypeError: image is not a dask array; as for `predict`.
    ValueError: a model that ends in a global pooling (use `predict`); as for `predict`.
  """
  import dask.array as da

  from tf_largeconv.stream import _dask

  if not isinstance(image, da.Array):
    raise TypeError(f"image must be a dask array, got {type(image).__name__}")
  model, graph, source, stream_plan = _prepare(model, image, tile, memory_limit, up_to)
  _dask.check_dask_output(graph)
  x = image
  if source.layout == "single":
    x = x[None]
  elif source.layout == "gray":
    x = x[None, ..., None]
  result = _dask.to_dask(
    model, x, graph, stream_plan.tiling, stream_plan.tile, up_to, name or "largeconv-stream"
  )
  if source.layout == "batched":
    return result
  return result[0] if source.layout == "single" or result.shape[-1] != 1 else result[0, ..., 0]


__all__ = [
  "predict",
  "plan",
  "to_dask",
  "StreamPlan",
  "StreamingModel",
  "register_pointwise",
  "DEFAULT_MEMORY_LIMIT",
]
