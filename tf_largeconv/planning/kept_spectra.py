"""Whether an eager call should move its forward pass to the op's FFT with the filter
spectra kept from an earlier call, and what they cost in the spectrum cache."""

import functools

import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv.planning import device
from tf_largeconv.planning import routing

_CORE = _loader.core()


# Filter spectra kept from one call to the next (the op's spectrum cache) take the
# filter's transforms out of an FFT pass, which can make it faster than TF's kernel where
# the FFT with the transforms is slower (7x7 filters with many channels). The planner prices every call as a first one, so such a pass is routed to
# TF's kernel, which never shows the filter to the op. An eager call whose filter tensor
# came before moves to the op's FFT where that is priced below the pass's route with its
# spectra kept (`kept_spectra_bytes`); eager tensors are immutable, so the same tensor is
# the same filter.


@functools.lru_cache(maxsize=1024)
def kept_spectra_bytes(x_shape, f_shape, attrs_key, dtype_name, routes):
  """The bytes the spectrum cache keeps for this CPU convolution's forward pass (x_shape
  and f_shape tuples, batch known) where the op's FFT with them kept is priced below the
  forward pass of `routes` (as `routing.schedule` gives them: TF's kernel, or the op's own
  choice) plus, where `routes` run no LargeConv>Conv2DRoute op, the one the move adds
  (MIXED_ROUTE_SECONDS); 0 where it is not (or where the op's own choice is the FFT, whose
  spectra are kept anyway). Plans with TensorFlow's intra-op threads."""
  attrs = _args.attrs_from_key(attrs_key)
  eligible = routing.tf_kernel_eligible(list(x_shape), list(f_shape), attrs, tf.as_dtype(dtype_name))
  try:
    p = _CORE.plan(list(x_shape), list(f_shape), attrs["strides"], attrs["padding"],
                   attrs["explicit_paddings"], attrs["data_format"], attrs["dilations"],
                   algorithm="auto", allow_tf=eligible, workspace_limit=attrs["workspace_limit"],
                   num_threads=device.intra_op_threads(), dtype=dtype_name)[0]
  except (ValueError, NotImplementedError):
    return 0  # the op raises the error, the same in every mode
  # The op's own choice: the planner's, or where that is TF's kernel, the cheaper of the
  # op's two (the direct kernels on a tie, as the planner takes the earlier).
  op_fft = p["algorithm"] == "fft" or (p["algorithm"] == "tf" and
                                       0 <= p["cost_fft"] < p["cost_direct"])
  if p["cost_fft_kept"] < 0 or (not routes.forward and op_fft):
    return 0
  current = p["cost_tf"] if routes.forward else p["cost_direct"]
  mixed = any(routes) and not all(routes)
  added = 0 if mixed else routing.MIXED_ROUTE_SECONDS * _CORE.REFERENCE_SLOTS
  return p["kept_spectra_bytes"] if p["cost_fft_kept"] + added < current else 0

