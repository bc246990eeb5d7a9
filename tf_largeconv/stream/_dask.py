"""A streamed model as a lazy dask array: one task per output tile, reading exactly its input
window (the machinery of `tf_largeconv.dask`: the input chunks it covers and halo strips cut
from the chunks around it), so it runs on any dask scheduler, dask.distributed included,
and no process ever holds more than a tile's windows.

The model travels once per process as its `.keras` archive (bytes, one key of the graph);
each process loads it and works out the tiling once, then runs its tiles.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from typing import Any

import keras
import numpy as np

from tf_largeconv.stream import _graph
from tf_largeconv.stream import _layers
from tf_largeconv.stream import _plan
from tf_largeconv.stream import _run

_lock = threading.Lock()
_loaded: dict[tuple[Any, ...], tuple[Any, _plan.Tiling]] = {}


def model_bytes(model: keras.Model) -> bytes:
  """The model's `.keras` archive."""
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "model.keras")
    model.save(path)
    with open(path, "rb") as f:
      return f.read()


class StreamSpec:
  """What every task of one streamed run shares: the model's archive, the image's batched
  shape, the tile and the layer streamed to, and the layer classes declared pointwise."""

  def __init__(
    self, archive: bytes, shape: tuple[int, ...], tile: int, up_to: str | None, pointwise: list
  ) -> None:
    self.archive, self.shape, self.tile, self.up_to = archive, shape, tile, up_to
    self.pointwise = pointwise
    self.key = (hashlib.sha256(archive).hexdigest(), shape, tile, up_to)

  def tiling(self) -> tuple[Any, _plan.Tiling]:
    """(graph, tiling), made once per process."""
    with _lock:
      if self.key not in _loaded:
        for cls in self.pointwise:
          _layers.register_pointwise(cls)
        with tempfile.TemporaryDirectory() as d:
          path = os.path.join(d, "model.keras")
          with open(path, "wb") as f:
            f.write(self.archive)
          model = keras.saving.load_model(path, compile=False)
        graph = _graph.build(model, self.up_to)
        geometry = _plan.Geometry(graph, self.shape[1:-1])
        _loaded[self.key] = (graph, _plan.Tiling(geometry, geometry.tile_out(self.tile)))
      return _loaded[self.key]


def tile_task(spec: StreamSpec, index: tuple[int, ...], window: Any, chunks: list) -> np.ndarray:
  """The output tile `index`, from the input chunks (or strips) its window overlaps."""
  from tf_largeconv.dask import _tasks

  _tasks.setup_process()
  graph, tiling = spec.tiling()

  def read(spans: Any) -> np.ndarray:
    return window.assemble(chunks, np.dtype(graph.input_dtype.as_numpy_dtype))

  sinks, _ = _run.run_tile(tiling, index, read, graph.input_dtype)
  return np.array(sinks[graph.output].numpy())


def to_dask(
  model: keras.Model,
  x: Any,
  graph: Any,
  tiling: _plan.Tiling,
  tile: int,
  up_to: str | None,
  name: str,
) -> Any:
  """The lazy result of streaming `model` over the batched dask array `x`, tiled as
  `tiling`: chunks are the tiles (batch and channels whole)."""
  import dask.array as da
  from dask.base import tokenize
  from dask.highlevelgraph import HighLevelGraph

  from tf_largeconv.dask import _graph as dask_graph

  rank = tiling.geometry.rank
  batch, channels = x.shape[0], x.shape[-1]
  x = x.rechunk({0: -1, rank + 1: -1})
  windows: list[list[tuple[int, int]]] = [[(0, batch)]]
  for axis, bounds in enumerate(tiling.bounds):
    windows.append([tiling.ranges(axis, t)[0] for t in range(len(bounds))])
  windows.append([(0, channels)])
  archive = model_bytes(model)
  extra = [c for c in _layers.POINTWISE if c not in _layers.BUILTIN_POINTWISE]
  token = tokenize(hashlib.sha256(archive).hexdigest(), x.name, tile, up_to)
  name = f"{name}-{token}"
  blocks = dask_graph.Blocks(x, windows, name)
  layer: dict[Any, Any] = dict(blocks.strips)
  spec_key = f"{name}-model"
  layer[spec_key] = StreamSpec(archive, tuple(x.shape), tile, up_to, extra)
  for idx, window, keys in blocks.blocks:
    layer[(name,) + idx] = (tile_task, spec_key, idx[1:-1], window, keys)
  out_channels = graph.channels[graph.output]
  chunks = (
    (batch,),
    *(tuple(b - a for a, b in bounds) for bounds in tiling.bounds),
    (out_channels,),
  )
  hlg = HighLevelGraph.from_collections(name, layer, dependencies=[x])
  meta = np.empty((0,) * (rank + 2), graph.out_dtype)
  return da.Array(hlg, name, chunks=chunks, meta=meta)


def check_dask_output(graph: Any) -> None:
  if not graph.spatial.get(graph.output, False):
    raise ValueError(
      "tf_largeconv.stream.to_dask streams models whose output is an image; this one ends "
      "in a global pooling: use stream.predict, which reduces it across tiles"
    )
  gated = [s.name for s in graph.steps if s.globals]
  if gated:
    raise ValueError(
      f"tf_largeconv.stream.to_dask streams models in one pass; layer '{gated[0]}' reads a "
      "value pooled over the whole image (squeeze-excitation), which takes several passes: "
      "use stream.predict"
    )
