"""A `keras.utils.PyDataset`'s batches handed to a StreamingModel's steps as the dataset
returns them (zarr and dask arrays, memory maps, `tf_largeconv.dask.open_slide` results),
so that `fit`, `evaluate` and `predict` read them window by window.

Keras's TensorFlow trainer puts a PyDataset through `tf.data.Dataset.from_generator`,
which reads every batch whole into a tensor. A StreamingModel's steps run eagerly, in
Python, so they can take the batches as they are: while one of its `fit`, `evaluate` or
`predict` runs on a PyDataset, the trainer's epoch iterator is one that iterates the
dataset's batches directly (with the `get_next` Keras's step functions call). Under a
tf.distribute strategy of several replicas, each batch is the global batch: every array in
it is split along its first axis among the replicas as tf.data's distributed datasets split
a batch (the first `size % replicas` replicas one image more), each share a lazy view of its
rows (`Rows`), and handed to the step as the strategy's per-replica values
(`experimental_distribute_values_from_function`). Every worker of a multi-worker strategy
iterates the whole dataset and reads only its replicas' rows.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf


class Rows:
  """Rows `start:stop` of the first axis of a lazy array (a zarr array, or any array whose
  slicing reads), read only where indexed: `view[index]` reads `array` at the same index
  moved into those rows."""

  def __init__(self, array: Any, start: int, stop: int) -> None:
    self.array, self.start, self.stop = array, start, stop
    self.shape = (stop - start, *tuple(array.shape)[1:])
    self.dtype = array.dtype
    self.ndim = len(self.shape)

  def __len__(self) -> int:
    return self.shape[0]

  def __getitem__(self, index: Any) -> Any:
    index = index if isinstance(index, tuple) else (index,)
    first = index[0] if index else slice(None)
    if not isinstance(first, slice) or first.step not in (None, 1):
      raise TypeError(f"rows of a batch take slices of step 1 along the batch axis, got {first!r}")
    a, b, _ = first.indices(self.shape[0])
    return self.array[(slice(self.start + a, self.start + max(a, b)),) + index[1:]]

  def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
    whole = np.asarray(self[:])
    return whole if dtype is None else whole.astype(dtype)


def _rows(value: Any, start: int, stop: int) -> Any:
  """Rows `start:stop` of `value` along its first axis, read no sooner than slicing it
  reads: numpy arrays (memory maps too), tensors and dask arrays are sliced (lazily where
  they are lazy); any other array is viewed (`Rows`). None stays None."""
  if value is None:
    return None
  if isinstance(value, (np.ndarray, tf.Tensor)) or hasattr(value, "compute"):
    return value[start:stop]
  if hasattr(value, "shape") and hasattr(value, "__getitem__"):
    return Rows(value, start, stop)
  return np.asarray(value)[start:stop]


def _shares(size: int, replicas: int) -> list[tuple[int, int]]:
  """Each replica's rows of a batch of `size`: as even as can be, the first ones larger."""
  if size < replicas:
    raise ValueError(
      f"a batch of {size} images cannot be shared among {replicas} replicas: give batches "
      f"of at least {replicas} images (each replica streams its own)"
    )
  cuts = np.cumsum([0] + [size // replicas + (r < size % replicas) for r in range(replicas)])
  return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]


def per_replica(strategy: Any, batch: Any) -> Any:
  """`batch` split among the replicas of `strategy` along the first axis of each array,
  as the strategy's per-replica values (each a lazy share where the batch is lazy)."""
  replicas = strategy.num_replicas_in_sync
  leaves = [v for v in tf.nest.flatten(batch) if v is not None]
  sizes = {int(v.shape[0]) if hasattr(v, "shape") else len(v) for v in leaves}
  if len(sizes) != 1:
    raise ValueError(f"the arrays of a batch must have one batch size, got {sorted(sizes)}")
  shares = _shares(sizes.pop(), replicas)

  def share(context: Any) -> Any:
    start, stop = shares[context.replica_id_in_sync_group]
    return tf.nest.map_structure(lambda v: _rows(v, start, stop), batch)

  return strategy.experimental_distribute_values_from_function(share)


class _Batches:
  """The dataset's batches, as an iterator with the `get_next` of a tf.data iterator;
  under a strategy of several replicas (`strategy`), each split among them."""

  def __init__(self, batches: Iterator[Any], strategy: Any = None) -> None:
    self._batches = batches
    self._strategy = strategy

  def __iter__(self) -> _Batches:
    return self

  def __next__(self) -> Any:
    batch = next(self._batches)
    return batch if self._strategy is None else per_replica(self._strategy, batch)

  get_next = __next__


def _epoch_iterator(base: Any) -> Any:
  class LazyEpochIterator(base):
    """Keras's TensorFlow epoch iterator, without its tf.data dataset for a PyDataset (for
    any other data, as it is: a fit's validation arrays)."""

    lazy_batches = True

    def __init__(self, distribute_strategy: Any = None, *args: Any, **kwargs: Any) -> None:
      self._lazy = isinstance(kwargs.get("x"), keras.utils.PyDataset)
      if not self._lazy:
        base.__init__(self, distribute_strategy, *args, **kwargs)
        return
      super(base, self).__init__(*args, **kwargs)  # the plain EpochIterator's
      self._distribute_strategy = distribute_strategy

    def _get_iterator(self) -> Any:
      if not self._lazy:
        return base._get_iterator(self)
      strategy = self._distribute_strategy
      several = strategy is not None and strategy.num_replicas_in_sync > 1
      return _Batches(iter(self.data_adapter._get_iterator()), strategy if several else None)

    def tf_sync(self) -> None:
      if not self._lazy:
        base.tf_sync(self)

  return LazyEpochIterator


@contextlib.contextmanager
def batches_as_they_are(x: Any, strategy: Any) -> Iterator[None]:
  """While inside: Keras's fit, evaluate and predict hand the batches of `x`, where it is
  a PyDataset, to the steps as they are (split among the replicas of `strategy`, the
  model's, where it has several)."""
  trainer: Any = importlib.import_module("keras.src.backend.tensorflow.trainer")
  base = getattr(trainer, "TFEpochIterator", None)
  lazy = (
    isinstance(x, keras.utils.PyDataset)
    and base is not None
    and not getattr(base, "lazy_batches", False)  # already, in a fit's validation
    and keras.backend.backend() == "tensorflow"
  )
  if not lazy:
    yield
    return
  trainer.TFEpochIterator = _epoch_iterator(base)
  try:
    yield
  finally:
    trainer.TFEpochIterator = base


def keeping_batches(method: Callable[..., Any]) -> Callable[..., Any]:
  """Keras's `fit`, `evaluate` or `predict` (`method`), run `batches_as_they_are`."""

  @functools.wraps(method)
  def run(self: Any, x: Any = None, *args: Any, **kwargs: Any) -> Any:
    with batches_as_they_are(x, self.distribute_strategy):
      return method(self, x, *args, **kwargs)

  return run
