"""What `StreamingModel` needs under `tf.distribute.MultiWorkerMirroredStrategy` that Keras
3's `fit` does not do there: the first batch for building the compiled loss and metrics,
and step logs Keras can reduce across the workers."""

from __future__ import annotations

from typing import Any

import tensorflow as tf


def multi_worker(strategy: Any) -> bool:
  """Whether `strategy` is a MultiWorkerMirroredStrategy (where Keras's `fit` needs help)."""
  return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def first_batch(strategy: Any, iterator: Any) -> Any:
  """This worker's first replica's share of the first batch of Keras's epoch `iterator`.

  Keras builds the compiled loss and metrics under a strategy from one batch that it first
  all-reduces replica by replica; MultiWorkerMirroredStrategy's reduce refuses a nested
  batch ("Attempt to convert a value (PerReplica...)"). Only shapes and dtypes matter to the
  build, and one replica's share has them."""
  for _, _, it in iterator:
    return _first_replica(strategy, next(it))
  return None


def _first_replica(strategy: Any, data: Any) -> Any:
  if isinstance(data, (list, tuple)):
    return type(data)(_first_replica(strategy, v) for v in data)
  if isinstance(data, dict):
    return {k: _first_replica(strategy, v) for k, v in data.items()}
  if isinstance(data, tf.distribute.DistributedValues):
    return strategy.experimental_local_results(data)[0]
  return data


def step_logs(strategy: Any, logs: dict[str, Any]) -> dict[str, Any]:
  """A step's metric values as Keras reduces them across the replicas. Under
  MultiWorkerMirroredStrategy Keras reduces each along its axis 0 as well, which a scalar
  lacks: there every scalar is given as a vector of one value (the reduced result is the
  same scalar). Under any other strategy, `logs` as they are."""
  if not multi_worker(strategy):
    return logs
  return {k: tf.reshape(v, [1]) if tf.rank(v) == 0 else v for k, v in logs.items()}


def batch_size(x: Any) -> int:
  """The batch of `x` from its shape alone (a lazy input is never read for it)."""
  return int(x.shape[0])


def unscaled(loss: tf.Tensor) -> tf.Tensor:
  """A replica's loss as the whole batch's: Keras divides mean losses by the number of
  replicas of a tf.distribute strategy (their gradients are summed), and its loss tracker
  multiplies them back."""
  replicas = tf.distribute.get_strategy().num_replicas_in_sync
  return loss * tf.cast(replicas, loss.dtype) if replicas > 1 else loss
