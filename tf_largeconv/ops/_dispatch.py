"""Which kernel a conv2d call runs, and the cache that finds it again for eager calls.

An eager loop calls conv2d with the same shapes and arguments over and over, and the
kernel a call runs (the op with its attributes, or a route through TensorFlow's kernels)
depends on those alone: `eager_key`'s. It is looked up by them, so a repeated eager call
skips the argument checks and the choice of route.
"""

import functools
import threading
import weakref

import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv.ops import _routing
from tf_largeconv.planning import device
from tf_largeconv.planning import kept_spectra
from tf_largeconv.planning import routing

_CORE = _loader.core()

EAGER_KERNELS = {}  # eager_key -> kernel
EAGER_KERNELS_MAX = 1024


def remember(key, kernel):
  """Keeps `kernel` for eager calls with `key`, starting afresh once the cache is full."""
  if len(EAGER_KERNELS) >= EAGER_KERNELS_MAX:
    EAGER_KERNELS.clear()
  EAGER_KERNELS[key] = kernel
  return kernel


def _frozen(value):
  """`value` with its lists as tuples (hashable, if its leaves are), each leaf other than an
  int, a str or None tagged with its type: 1.0 and True equal 1 but are refused where 1 is
  taken, so they must not find 1's kernel."""
  if isinstance(value, (list, tuple)):
    return tuple(_frozen(v) for v in value)
  return value if type(value) in _PLAIN else (type(value), value)


_PLAIN = frozenset((int, str, type(None)))


def eager_key(input, filters, args):
  """What decides an eager call's kernel: the two tensors' shapes, dtypes and device, and
  the arguments as given; None outside eager execution, for operands other than tensors
  (variables, arrays: converted by the full path), inside `portable_only()`, or for
  arguments that are not hashable."""
  if (
    not (isinstance(input, tf.Tensor) and isinstance(filters, tf.Tensor) and tf.executing_eagerly())
    or _args.forced_portable()
  ):
    return None
  shapes = (input.shape, filters.shape, input.dtype, filters.dtype, input.device)
  if _PLAIN.issuperset(map(type, args)):  # as _frozen leaves them; each part hashable
    return shapes + (args,)
  key = shapes + (_frozen(args),)
  try:
    hash(key)
  except TypeError:
    return None
  return key


def kernel_for(input, filters, problem, eager=False):
  """The function (input, filters) -> output that runs conv2d of this 4-D (or unknown-rank)
  input for a resolved ConvProblem: each pass TensorFlow's kernel where the planner
  prefers it for that pass (`routing.schedule`), the op otherwise. With `eager`, for eager
  calls of input's shape and device alone (`_routing.eager_routed`)."""
  if problem.algorithm == "tf" and (_args.in_xla_context() or _loader.failure() is not None):
    # XLA compiles TensorFlow's own convolution, in every layout and grouping; without the
    # op library it is the only kernel 'tf' can name.
    return functools.partial(tf.nn.conv2d, **problem.tf_kwargs())
  key = problem.unbound()
  schedule = routing.OP_ONLY
  if key.algorithm in ("auto", "tf") and input.shape.rank == 4:
    schedule = routing.schedule(
      input.shape.as_list(), _routing.known_shape(filters), input.dtype, input, key
    )
  eager = eager and not device.runs_on_gpu(input)
  if not any(any(routes) for _, routes in schedule):
    if key.algorithm == "tf":
      raise ValueError(_routing.TF_KERNEL_NEEDS)
    kernel = functools.partial(_loader.ops().large_conv_conv2d, **key.attrs())
  elif eager:
    kernel = _routing.eager_routed(schedule, key, input.shape[0])
  else:
    return _routing.routed(schedule, key)
  if eager and key.algorithm == "auto" and key.keep_memory:  # spectra kept between calls
    routes = routing.at_batch(schedule, input.shape[0])
    kept_bytes = kept_spectra.kept_spectra_bytes(
      tuple(input.shape), tuple(filters.shape), key, input.dtype.name, routes
    )
    if kept_bytes:
      return KeptSpectraRoute(kernel, kept_forward(key, routes), kept_bytes)
  return kernel


class KeptSpectraRoute:
  """An eager kernel that runs `first` for a filter tensor that is not among the FILTERS
  distinct filter tensors it ran last, and `again` (the op's FFT, `kept_forward`) for one
  that is, where the spectrum cache's budget holds its spectra (`kept_bytes`, see
  `kept_spectra.kept_spectra_bytes`) beside those of every other filter that moved and is still
  alive. Which kernel a call runs depends only on the calls before it (in the order they
  took the lock, where threads share the kernel), never on timing.

  The budget is shared as the cache is, process-wide: a filter that moved holds its share
  while its tensor lives, and one that does not fit beside them stays on `first`, so that
  moved filters never evict each other's spectra (two 40 MiB entries under a 64 MiB budget
  would, and each call would then transform its filter again at the FFT's full price). The
  op keeps a filter's spectra from its second sight of it, so the first two calls that
  move still transform the filter."""

  __slots__ = ("_first", "_again", "_kept_bytes", "_seen")
  FILTERS = 4  # filter tensors remembered (weakly): a few layers' worth per shape
  _LOCK = threading.Lock()
  _MOVED = {}  # id(filter) -> (weak reference, kept bytes): every filter that moved

  def __init__(self, first, again, kept_bytes):
    self._first, self._again, self._kept_bytes = first, again, kept_bytes
    self._seen = []  # weak references, the filter run last at the end

  def __call__(self, x, w):
    with self._LOCK:
      again = self._saw(w) and self._fits(w)
    return (self._again if again else self._first)(x, w)

  def _saw(self, w):
    """Whether w is among the FILTERS distinct filter tensors run last; makes it the last."""
    live = [r for r in self._seen if r() is not None]
    others = [r for r in live if r() is not w]
    self._seen = (others + [weakref.ref(w)])[-self.FILTERS :]
    return len(others) < len(live)

  def _fits(self, w):
    """Whether w's spectra fit the budget beside those of the other live filters that
    moved (recording w among them if so)."""
    moved = self._MOVED
    for key in [k for k, (ref, _) in moved.items() if ref() is None]:
      del moved[key]
    held = sum(b for _, b in moved.values())
    budget = _CORE.spectrum_cache_budget()
    if id(w) in moved:
      return held <= budget
    if held + self._kept_bytes > budget:
      return False
    moved[id(w)] = (weakref.ref(w), self._kept_bytes)
    return True


@functools.lru_cache(maxsize=256)
def kept_forward(problem, routes):
  """conv2d as the op's FFT forward pass, whose filter spectra the op keeps from call to
  call, recorded on a LargeConv>Conv2DRoute op whose gradient runs the passes `routes`
  name, as the call without kept spectra would (`problem`: unbound)."""
  attrs = problem.replace(algorithm="fft").attrs()
  fft = functools.partial(_loader.ops().large_conv_conv2d, **attrs)
  route = _loader.ops().large_conv_conv2d_route
  spec = _routing.route_spec(problem, routes)
  return lambda x, w: route(fft(x, w), x, w, route=spec)
