"""Advice with numbers: the changes that cut the predicted peak most, each priced by
running the same report on the changed model or shape."""

from __future__ import annotations

from typing import Any

from tf_largeconv.memory._report import Advice
from tf_largeconv.memory._report import mib


def _fits(budget: int | None, *peaks: int | None) -> bool | None:
  if budget is None:
    return None
  return all(p is None or p <= budget for p in peaks)


def _large_kernels(model: Any, min_kernel_size: int) -> bool:
  import keras

  kinds = (keras.layers.Conv2D, keras.layers.DepthwiseConv2D, keras.layers.Conv2DTranspose)
  return any(
    type(layer) in kinds and max(layer.kernel_size) >= min_kernel_size for layer in model.layers
  )


def _stream(model: Any, shape: tuple[int, ...], budget: int | None) -> Advice | None:
  """stream.predict with the tile its planner picks for `budget` (default limit without)."""
  from tf_largeconv import stream

  try:
    p = stream.plan(model, shape, memory_limit=budget, stages=False)
  except (ValueError, TypeError) as e:
    if budget is not None and "memory_limit" in str(e):
      minimum = stream.plan(model, shape, tile=1).peak_bytes
      raise ValueError(
        f"budget {mib(budget)} is smaller than one output pixel's working set when "
        f"streamed; the minimum is {mib(minimum)} ({minimum} bytes)"
      ) from None
    return None
  change = f"stream.predict(model, image, tile={p.tile}) ({p.tiles} tiles)"
  return Advice(change, p.peak_bytes, None, _fits(budget, p.peak_bytes))


def advise(model: Any, shape: tuple[int, ...], rep: Any, budget: int | None) -> list[Advice]:
  from tf_largeconv import memory

  out = []
  training = rep.training_peak is not None
  if budget is not None:
    out.append(Advice("as is", rep.inference_peak, rep.training_peak, _fits(budget, *_p(rep))))
  if _large_kernels(model, 15):
    from tf_largeconv.keras import convert

    r = memory.report(convert(model), shape, training=training)
    out.append(Advice("tf_largeconv.keras.convert(model)", *_p(r), fits=_fits(budget, *_p(r))))
  if shape[0] > 1:
    half = (shape[0] // 2, *shape[1:])
    r = memory.report(model, half, training=training)
    out.append(Advice(f"batch {half[0]}", *_p(r), _fits(budget, *_p(r))))
  infer_half = rep.inference_peak // 2
  train_half = None if rep.training_peak is None else rep.training_peak // 2
  out.append(
    Advice(
      "mixed precision (keras.mixed_precision.set_global_policy('mixed_bfloat16'); "
      "activations in 16 bits, about half)",
      infer_half,
      train_half,
      _fits(budget, infer_half, train_half),
    )
  )
  streamed = _stream(model, shape, budget)
  if streamed is not None:
    out.append(streamed)
  out.sort(key=lambda a: (a.change != "as is", a.training_peak or a.inference_peak or 0))
  return out


def _p(rep: Any) -> tuple[int | None, int | None]:
  return rep.inference_peak, rep.training_peak
