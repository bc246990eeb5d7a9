"""Which passes of a 2-D convolution run TensorFlow's own kernel instead of the op: the
routes.

A route is a `PerPass` of booleans (True: that pass runs TensorFlow's kernel). On the CPU
the routes depend on the batch, so a call's routes come as a schedule: ((first_batch,
routes), ...), ascending from 1, each entry holding from its first batch up to the next
entry's. `schedule` gives a call its schedule and `at_batch` the routes of one batch; the
rest of this module is how they are chosen.
"""

import functools

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv._passes import PerPass
from tf_largeconv.planning import device

_CORE = _loader.core()
# The op's own algorithms: every one the planner prices but TensorFlow's kernels.
_OURS = tuple(a for a in _args.OP_ALGORITHMS if a not in ("auto", "tf"))

# The schedule of a convolution no pass of which runs TensorFlow's kernel.
OP_ONLY = ((1, PerPass.every(False)),)


# TensorFlow's own kernel is weighed for the full-width floating dtypes only, so float16
# and bfloat16 results always come from the op, which computes them in float32, and int32
# ones too (TF has no int32 filter gradient). On a GPU, TF's kernel is cuDNN, which takes
# the half types too (accumulating in float32); float64 there is cuDNN's slow path.
TF_KERNEL_DTYPES = tuple(d for d in _args.FLOAT_DTYPES if d.size >= 4)
TF_GPU_KERNEL_DTYPES = tuple(d for d in _args.FLOAT_DTYPES if d.size <= 4)


def tf_kernel_eligible(input_shape, filter_shape, problem, dtype, device="CPU"):
  """Whether TensorFlow's own kernels on `device` ('CPU' or 'GPU') can run this
  convolution (a 2-D ConvProblem and its shapes), gradients included: on the CPU NHWC,
  dilations 1 and float32/float64; on a GPU every layout and dilation and
  float16/bfloat16/float32. No groups on either."""
  if len(input_shape) != 4 or len(filter_shape) != 4:
    return False
  if device == "GPU":
    channels = input_shape[problem.channel_axis]
    return dtype in TF_GPU_KERNEL_DTYPES and channels == filter_shape[2]
  return (
    problem.data_format == "NHWC"
    and all(d == 1 for d in problem.dilations)
    and dtype in TF_KERNEL_DTYPES
    and input_shape[3] == filter_shape[2]
  )


def _tf_kernel_device(x_shape, f_shape, dtype, placed, problem):
  """'CPU' or 'GPU', the device an op taking `placed` runs on, where TensorFlow's own
  kernels there can run this convolution; None where they cannot."""
  if x_shape is None or f_shape is None or None in x_shape[1:] or None in f_shape:
    return None
  where = "GPU" if device.runs_on_gpu(placed) else "CPU"
  if not tf_kernel_eligible([1] + list(x_shape[1:]), list(f_shape), problem, dtype, where):
    return None
  return where


def tf_kernel_runs(x_shape, f_shape, dtype, placed, problem):
  """Whether TensorFlow's own kernels, on the device an op taking `placed` runs on, can run
  this convolution: shapes in data_format order (None, or None entries, where not known
  statically; the batch may be unknown)."""
  return _tf_kernel_device(x_shape, f_shape, dtype, placed, problem) is not None


# Which passes run TensorFlow's kernel depends on the batch: a larger one spreads the FFT
# path's filter transforms over more images. The routes are planned at each of
# ROUTE_BATCHES and hold from there to the next, so that a graph traced with an unknown
# batch, which picks among them at run time, and an eager call with the same batch run the
# same kernels and give identical results.
ROUTE_BATCHES = tuple(2**i for i in range(7))  # 1 ... 64


# An eager call of a route that mixes TF's kernels with the op's runs one more op, the
# LargeConv>Conv2DRoute that carries the gradient, whose gradient then calls each pass's
# op. Each kernel's own per-call cost is in the model already, so what mixing adds is the
# route op and its gradient's calls: about MIXED_ROUTE_SECONDS on the CPU (see
# benchmarks/results). A traced call costs nothing more at run time, but eager and
# traced calls run the same routes (see ROUTE_BATCHES). A pass is routed to the other
# side's kernel only where the mixed route saves more than that over running every pass
# one way; the model's seconds are single-thread seconds on REFERENCE_SLOTS threads, so
# the cost counts that many times.
MIXED_ROUTE_SECONDS = 25e-6


def _unmixed(passes, routes):
  """`routes` (mixed), or every pass TF's kernel or every pass the op's where that is priced
  within MIXED_ROUTE_SECONDS of them (`passes`: the planner's dicts, with each algorithm's
  cost; the op's is the lowest of its algorithms')."""

  def ours(p):
    return min(p["cost_" + a] for a in _OURS if p["cost_" + a] >= 0)

  options = {
    routes: sum(p["cost_tf"] if r else ours(p) for p, r in zip(passes, routes))
    + MIXED_ROUTE_SECONDS * _CORE.REFERENCE_SLOTS,
    PerPass.every(False): sum(ours(p) for p in passes),
  }
  if all(p["cost_tf"] >= 0 for p in passes):
    options[PerPass.every(True)] = sum(p["cost_tf"] for p in passes)
  return min(options, key=options.get)


def auto_plan(x_shape, f_shape, problem, allow_tf, threads, dtype_name):
  """The CPU planner's 'auto' choice for each pass (a PerPass of its dicts) of the
  ConvProblem `problem` for x_shape by f_shape, TF's kernel among the choices where
  `allow_tf`. Raises ValueError or NotImplementedError for arguments it refuses."""
  bound = problem.bind(x_shape, f_shape)
  return PerPass.of(
    bound.plan(algorithm="auto", allow_tf=allow_tf, num_threads=threads, dtype=dtype_name)
  )


@functools.lru_cache(maxsize=1024)
def planned_schedule(image_shape, f_shape, problem, dtype_name, threads):
  """The CPU planner's schedule for an eligible convolution of images `image_shape`
  (height, width and channels in data_format order) on `threads` threads (`problem`: an
  unbound ConvProblem). Each entry's
  routes are the planner's choice per pass, unless a route that mixes TF's kernels
  with the op's saves less than its own cost (MIXED_ROUTE_SECONDS). In the cost model the
  op's time per image falls with the batch while TF's does not, so a pass that leaves TF's
  kernel at some batch stays with the op at every larger one: the batches are planned in
  turn until no pass runs TF's kernel. Raises ValueError or
  NotImplementedError for arguments the planner refuses."""
  # Cached: eager code calls conv2d with the same shapes over and over, and a graph traced
  # with an unknown batch needs every entry.
  entries = []
  for batch in ROUTE_BATCHES:
    passes = auto_plan([batch, *image_shape], f_shape, problem, True, threads, dtype_name)
    routes = PerPass.of(p["algorithm"] == "tf" for p in passes)
    if any(routes) and not all(routes):
      routes = _unmixed(passes, routes)
    if not entries or routes != entries[-1][1]:
      entries.append((batch, routes))
    if not any(routes):
      break
  return tuple(entries)


@functools.lru_cache(maxsize=1024)
def _cpu_schedule(image_shape, f_shape, problem, dtype_name):
  """`planned_schedule` for TensorFlow's intra-op threads, or OP_ONLY for arguments the
  planner refuses (the op raises the error then, the same in every mode).
  Cached: asking TF for its thread count costs more than a small convolution, and the
  count is fixed once TF runs, which it does once the convolution's tensors exist."""
  try:
    return planned_schedule(image_shape, f_shape, problem, dtype_name, device.intra_op_threads())
  except (ValueError, NotImplementedError):
    return OP_ONLY


def at_batch(schedule, batch):
  """The routes `schedule` gives `batch` images (0: the first entry's)."""
  return [routes for first, routes in schedule if first <= max(batch, 1)][-1]


def schedule(x_shape, f_shape, dtype, placed, problem):
  """The schedule of a call: x_shape and f_shape in data_format order (None, or None
  entries, where not known statically), `placed` a tensor the call takes (its device),
  `problem` its ConvProblem. One entry where the batch is known (or on a GPU, whose routes do not
  depend on it), all of them where it is not; OP_ONLY where TensorFlow's kernels cannot run
  the convolution (`tf_kernel_runs`)."""
  where = _tf_kernel_device(x_shape, f_shape, dtype, placed, problem)
  if where is None:
    return OP_ONLY
  key = problem.unbound()
  if where == "GPU" or key.algorithm == "tf":
    return ((1, device_routes(tuple(x_shape), tuple(f_shape), key, dtype.name, where)),)
  planned = _cpu_schedule(tuple(x_shape[1:]), tuple(f_shape), key, dtype.name)
  if x_shape[0] is not None:
    return ((1, at_batch(planned, x_shape[0])),)
  return planned


@functools.lru_cache(maxsize=1024)
def device_routes(x_shape, f_shape, problem, dtype_name, where="CPU"):
  """The routes of this eligible convolution on device `where` ('CPU' or 'GPU'): every
  pass TensorFlow's kernel where algorithm='tf'. On the CPU those of x_shape's batch (1
  where it is None) in the CPU schedule; on a GPU the CUDA planner weighs cuDNN's modelled
  time against its own choice for the forward pass of a batch of GPU_ROUTE_BATCH images,
  and every pass follows that choice."""
  # Cached: eager code calls conv2d with the same shapes over and over, and the decision
  # depends only on these arguments (and the thread count, fixed once TF is initialised).
  if problem.algorithm == "tf":
    return PerPass.every(True)
  if where == "GPU":
    try:
      shape = [_CORE.GPU_ROUTE_BATCH] + list(x_shape[1:])
      passes = problem.bind(shape, f_shape).cuda_plan(shape, "auto", dtype_name)
      forward = PerPass.of(passes).forward
    except (ValueError, NotImplementedError):
      return PerPass.every(False)  # bad arguments: the op raises the error, in every mode
    return PerPass.every(bool(forward["tf_faster"]))
  return at_batch(
    _cpu_schedule(tuple(x_shape[1:]), tuple(f_shape), problem, dtype_name), x_shape[0] or 1
  )
