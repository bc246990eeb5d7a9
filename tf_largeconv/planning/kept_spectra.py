"""Whether an eager call should move its forward pass to the op's FFT with the filter
spectra kept from an earlier call, and what they cost in the spectrum cache."""

import functools

import tensorflow as tf

from tf_largeconv import _loader
from tf_largeconv.planning import device
from tf_largeconv.planning import routing

_CORE = _loader.core()


# Filter spectra kept from one call to the next (the op's spectrum cache) take the
# filter's transforms out of an FFT pass, which can make it faster than TF's kernel where
# the FFT with the transforms is slower (7x7 filters with many channels). The planner
# prices every call as a first one, so such a pass is routed to TF's kernel, which never
# shows the filter to the op. An eager call whose filter tensor came before moves to the
# op's FFT where that, with its spectra kept, is priced below the pass's route by more
# than the model's error (`kept_spectra_bytes`); eager tensors are immutable, so the same
# tensor is the same filter.

# How many times below the route's forward pass the FFT with kept spectra must be priced
# for the pass to move: the cost model's own error on this choice, so that a saving within
# it does not move the pass. The error at a convolution is the ratio of the two passes'
# measured times over the ratio of their prices; the value is its median, rounded to a
# tenth (runs differ in the hundredths), over the planner sweep's forward points where the
# choice is in play (the kept FFT priced below the route at all), with TF's oneDNN kernels
# and with its Eigen ones, as benchmarks/cpu/kept_margin.py measures it; the figures are in
# benchmarks/results/cpu/kept_spectra_margin.json.
KEPT_SPECTRA_MARGIN = 1.3


def move_price(x_shape, f_shape, problem, dtype_name, routes):
  """What the move of this CPU convolution's forward pass (x_shape and f_shape tuples,
  batch known; `problem` an unbound ConvProblem) to the op's FFT with kept spectra is
  weighed on, as the planner prices it on TensorFlow's intra-op threads: (seconds of that
  FFT plus, where `routes` run no LargeConv>Conv2DRoute op, the one the move adds
  (MIXED_ROUTE_SECONDS); seconds of the forward pass of `routes`, as `routing.schedule`
  gives them: TF's kernel, or the op's own choice; bytes the spectrum cache keeps). None
  where there is no move to weigh: the planner refuses the arguments, prices no kept FFT,
  or the op's own choice is the FFT, whose spectra are kept anyway."""
  eligible = routing.tf_kernel_eligible(
    list(x_shape), list(f_shape), problem, tf.as_dtype(dtype_name)
  )
  try:
    p = routing.auto_plan(
      x_shape, f_shape, problem, eligible, device.intra_op_threads(), dtype_name
    ).forward
  except (ValueError, NotImplementedError):
    return None  # the op raises the error, the same in every mode
  # The op's own choice: the planner's, or where that is TF's kernel, the cheaper of the
  # op's two (the direct kernels on a tie, as the planner takes the earlier).
  op_fft = p["algorithm"] == "fft" or (
    p["algorithm"] == "tf" and 0 <= p["cost_fft"] < p["cost_direct"]
  )
  if p["cost_fft_kept"] < 0 or (not routes.forward and op_fft):
    return None
  current = p["cost_tf"] if routes.forward else p["cost_direct"]
  mixed = any(routes) and not all(routes)
  added = 0 if mixed else routing.MIXED_ROUTE_SECONDS * _CORE.REFERENCE_SLOTS
  return p["cost_fft_kept"] + added, current, p["kept_spectra_bytes"]


@functools.lru_cache(maxsize=1024)
def kept_spectra_bytes(x_shape, f_shape, problem, dtype_name, routes):
  """The bytes the spectrum cache keeps for this CPU convolution's forward pass where the
  op's FFT with them kept is priced KEPT_SPECTRA_MARGIN times below the forward pass of
  `routes` (`move_price`: the arguments, and the prices); 0 where it is not, or where
  there is no move to weigh."""
  price = move_price(x_shape, f_shape, problem, dtype_name, routes)
  if price is None:
    return 0
  kept, current, kept_bytes = price
  return kept_bytes if kept * KEPT_SPECTRA_MARGIN < current else 0
