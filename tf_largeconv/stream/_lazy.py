"""A `keras.utils.PyDataset`'s batches handed to a StreamingModel's steps as the dataset
returns them (zarr and dask arrays, memory maps, `tf_largeconv.dask.open_slide` results),
so that `fit`, `evaluate` and `predict` read them window by window.

Keras's TensorFlow trainer puts a PyDataset through `tf.data.Dataset.from_generator`,
which reads every batch whole into a tensor. A StreamingModel's steps run eagerly, in
Python, so they can take the batches as they are: while one of its `fit`, `evaluate` or
`predict` runs on a PyDataset, the trainer's epoch iterator is one that iterates the
dataset's batches directly (with the `get_next` Keras's step functions call). Under a
tf.distribute strategy of several replicas, Keras's own iterator (tf.data) is kept: it
splits the batches among the replicas (and reads them whole).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import keras


class _Batches:
  """The dataset's batches, as an iterator with the `get_next` of a tf.data iterator."""

  def __init__(self, batches: Iterator[Any]) -> None:
    self._batches = batches

  def __iter__(self) -> _Batches:
    return self

  def __next__(self) -> Any:
    return next(self._batches)

  def get_next(self) -> Any:
    return next(self._batches)


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
      return _Batches(iter(self.data_adapter._get_iterator()))

    def tf_sync(self) -> None:
      if not self._lazy:
        base.tf_sync(self)

  return LazyEpochIterator


@contextlib.contextmanager
def batches_as_they_are(x: Any, strategy: Any) -> Iterator[None]:
  """While inside: Keras's fit, evaluate and predict hand the batches of `x`, where it is
  a PyDataset and `strategy` (the model's) has one replica, to the steps as they are."""
  trainer: Any = importlib.import_module("keras.src.backend.tensorflow.trainer")
  base = getattr(trainer, "TFEpochIterator", None)
  lazy = (
    isinstance(x, keras.utils.PyDataset)
    and base is not None
    and not getattr(base, "lazy_batches", False)  # already, in a fit's validation
    and strategy.num_replicas_in_sync == 1
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
