"""`tf_largeconv.plan`: what the op will do for given shapes, before running it.

The numbers come from the same C++ planner the kernels call, so `workspace_bytes` is
exactly the temporary memory each pass takes (through TensorFlow's allocator). The same
planner decides which passes of `conv2d` run TensorFlow's own kernel instead of the op
(`tf_routes`).
"""

import functools
import math
import os

import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader

_CORE = _loader.core()
# The algorithms a plan prices (every one the op's planner names but 'auto').
_MODELLED = tuple(a for a in _args.OP_ALGORITHMS if a != "auto")


def intra_op_threads():
  """Threads TensorFlow's CPU kernels get (what the op plans its slots for)."""
  n = tf.config.threading.get_intra_op_parallelism_threads()
  if n > 0:
    return n
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


class PassPlan:
  """The plan of one pass (forward, backprop_input or backprop_filter)."""

  def __init__(self, d):
    self.name = d["pass"]
    self.algorithm = d["algorithm"]
    self.workspace_bytes = int(d["workspace_bytes"])
    self.flops = float(d["flops"])
    self.fft_size = tuple(d["fft"]) if "fft" in d else None
    self.tile = tuple(d["tile"]) if "tile" in d else None
    self.tiles = tuple(d["tiles"]) if "tiles" in d else None
    # How an FFT pass is cut up (cc/core/fft.h, FftConfig): channel blocks, groups held at
    # once, and vec_block: groups per batched transform call, or with a single group, the
    # tiles of one item (a run of tiles that shares each filter value read; in the filter
    # pass, a sweep of tiles that shares each read and write of the accumulators).
    self.in_block = d.get("in_block")
    self.out_block = d.get("out_block")
    self.group_block = d.get("group_block")
    self.vec_block = d.get("vec_block")
    self.slots = d.get("slots")
    # What the FFT cost model counts: transforms, their points, spectral multiply-adds and
    # the filter values they read from memory (a 3-D plan reports the transforms only).
    self.fft_work = d.get("fft_work")
    if self.fft_work is None and "transforms" in d:
      self.fft_work = {"transforms": d["transforms"]}
    # The cost model's single-thread seconds of each algorithm (None: it cannot run here),
    # the FFT's for its configuration spread over two reference threads: what the choice
    # was made on.
    self.estimated_seconds = {a: d["cost_" + a] if d["cost_" + a] >= 0 else None
                              for a in _MODELLED}
    # The FFT's estimated seconds, as estimated_seconds has them, for a call whose filter
    # spectra were kept from an earlier call (its filter transforms left out), and the
    # bytes the spectrum cache holds for them; None and 0 where the FFT was not priced or
    # keeps none (the filter pass, 'direct', int32, or no FFT configuration fits).
    kept = d.get("cost_fft_kept", -1)
    self.kept_spectra_seconds = kept if kept >= 0 else None
    self.kept_spectra_bytes = int(d.get("kept_spectra_bytes", 0))

  def __repr__(self):
    return (f"PassPlan({self.name}: {self.algorithm}, workspace={self.workspace_bytes} B, "
            f"fft={self.fft_size}, tile={self.tile}, tiles={self.tiles})")


class Plan:
  """Per-pass plans of one convolution; `str()` prints a short table.

  Attributes:
    forward, backprop_input, backprop_filter: `PassPlan`s.
    output_shape: the convolution's output shape.
    workspace_bytes: the largest temporary memory any one pass takes.
    workspace_limit: the limit the plan was made under, in bytes.
    unavailable: None, or why the op library could not be loaded: then the passes show
      what the ops would do, and every call runs the portable path (stock TF ops) instead.
  """

  def __init__(self, passes, output_shape, workspace_limit, threads, unavailable=None):
    self.forward, self.backprop_input, self.backprop_filter = passes
    self.passes = tuple(passes)
    self.output_shape = tuple(output_shape)
    self.workspace_limit = workspace_limit
    self.threads = threads
    self.workspace_bytes = max(p.workspace_bytes for p in passes)
    self.unavailable = unavailable

  def __str__(self):
    def sizes(v):
      return "x".join(map(str, v)) if v else "-"

    cells = [(p.name, p.algorithm, sizes(p.fft_size), sizes(p.tile), sizes(p.tiles),
              f"{p.in_block}x{p.out_block}" if p.fft_size else "-", str(p.slots or "-"),
              f"{p.workspace_bytes / 2**20:.2f} MiB", f"{p.flops / 1e9:.3f}")
             for p in self.passes]
    header = ("pass", "algorithm", "fft size", "tile", "tiles", "blocks", "slots", "workspace",
              "GFLOP")
    # Column widths: the 2-D table's, wider where a cell (a 3-D size) needs it.
    widths = [max([w] + [len(row[i]) + (1 if i > 1 else 0) for row in cells])
              for i, w in enumerate((16, 10, 12, 12, 9, 9, 6, 13, 9))]

    def line(row):
      return "".join(c.ljust(w) if i < 2 else c.rjust(w)
                     for i, (c, w) in enumerate(zip(row, widths)))

    kernels = {"onednn": "oneDNN's", "eigen": "Eigen's"}[_CORE.tf_kernels()]
    rows = [f"output {self.output_shape}, workspace limit {self.workspace_limit / 2**20:.1f} "
            f"MiB, {self.threads} thread(s), TF priced as {kernels} kernels",
            line(header) + "  model ms (1 thread): " + " / ".join(_MODELLED) + " / fft kept"]

    def ms(seconds):
      return "-" if seconds is None else f"{seconds * 1e3:.4g}"

    for p, row in zip(self.passes, cells):
      rows.append(line(row) + "  " + " / ".join(
          [ms(p.estimated_seconds[a]) for a in _MODELLED] + [ms(p.kept_spectra_seconds)]))
    if self.unavailable is not None:
      rows.append("the op library could not be loaded, so every pass runs the portable path "
                  f"(stock TensorFlow ops) instead of the above: {self.unavailable}")
    return "\n".join(rows)

  def __repr__(self):
    return f"Plan({self.passes!r})"


def plan(input_shape, filter_shape, strides, padding, data_format="NHWC", dilations=None,
         dtype=tf.float32, algorithm="auto", workspace_limit=None, num_threads=None):
  """Plans a convolution without running it.

  Args:
    input_shape: the input's shape in data_format order: 4 ints, or more where the input
      has extra leading batch dimensions (planned as one batch of their product).
    filter_shape: the filter's shape [height, width, in_channels / groups, out_channels].
    strides, padding, data_format, dilations, algorithm, workspace_limit: as for
      `tf_largeconv.conv2d`. A pass planned as 'tf' runs TensorFlow's own kernel (chosen
      for small filters where it is faster; its temporary memory is TensorFlow's, shown as
      an estimate that must fit the limit).
    dtype: the tensors' dtype (float16/bfloat16/float32 compute in float32; int32 is summed
      exactly, by the direct kernels only).
    num_threads: threads to plan for; default: TensorFlow's intra-op thread count.

  A 3-D convolution (`tf_largeconv.conv3d`) is planned by `tf_largeconv.plan_conv3d`,
  which this calls when filter_shape has 5 entries ([depth, height, width, in_channels /
  groups, out_channels]; a 5-D input_shape with a 4-entry filter_shape is a 2-D
  convolution with two batch dimensions, as above): input_shape then has 5 entries,
  strides and dilations 5, and data_format is 'NDHWC' or 'NCDHW' (the 2-D names stand for
  the 3-D layout with the channels in the same place, as in tf.nn.convolution: the default
  'NHWC' means 'NDHWC').

  A transposed convolution (`tf_largeconv.conv2d_transpose`) is planned by
  `tf_largeconv.plan_transpose`: the plan of the conv2d it transposes, whose
  backprop_input pass is the transpose's forward pass.

  Returns:
    A `Plan`; its output_shape keeps the input's batch dimensions.

  Raises:
    ValueError: malformed arguments, shapes that do not fit, algorithm='fft' with int32,
      algorithm='portable' (which runs stock TF ops, not the planned ops), or
      a workspace_limit that even the smallest FFT plan exceeds when algorithm='fft' (the
      message gives the minimum).
  """
  if _rank(filter_shape) == 5:
    from tf_largeconv import _conv3d  # pylint: disable=g-import-not-at-top (it imports this)
    return _conv3d.plan_conv3d(input_shape, filter_shape, strides, padding,
                               _FORMATS_3D.get(data_format, data_format), dilations, dtype,
                               algorithm, workspace_limit, num_threads)
  attrs = _args.conv_attrs(strides, padding, data_format, dilations, algorithm,
                           workspace_limit)
  return plan_from_attrs(input_shape, filter_shape, attrs, dtype, num_threads)


# plan()'s 2-D data_format names for a 3-D convolution: the channels in the same place.
_FORMATS_3D = {"NHWC": "NDHWC", "NCHW": "NCDHW"}


def _rank(shape):
  """The number of entries of a shape given as a list, tuple, array or TensorShape (None
  where it has no length)."""
  try:
    return len(shape)
  except (TypeError, ValueError):
    return None


def plan_from_attrs(input_shape, filter_shape, attrs, dtype=tf.float32, num_threads=None):
  """`plan` for already-normalised op attributes (see `_args.conv_attrs`)."""
  if attrs["algorithm"] == _args.PORTABLE:
    raise ValueError("algorithm='portable' runs stock TensorFlow ops, not the LargeConv ops "
                     "that plan() describes; plan with algorithm='auto', 'direct', 'fft' or "
                     "'tf'")
  dtype = _args.normalize_dtype(dtype)
  threads = int(num_threads) if num_threads else intra_op_threads()
  input_shape = [int(v) for v in input_shape]
  filter_shape = [int(v) for v in filter_shape]
  batch_shape = input_shape[:-3] if len(input_shape) > 4 else input_shape[:1]
  if len(input_shape) > 4:  # extra batch dimensions, merged as conv2d merges them
    input_shape = [math.prod(batch_shape)] + input_shape[-3:]
  args = (input_shape, filter_shape, attrs["strides"], attrs["padding"],
          attrs["explicit_paddings"], attrs["data_format"], attrs["dilations"])
  geometry = _CORE.geometry(*args)
  kwargs = dict(workspace_limit=attrs["workspace_limit"], num_threads=threads,
                dtype=dtype.name)
  # Each pass runs TensorFlow's kernel or the op's, whichever the planner prices lower
  # (TF's backprop kernels are far slower than its forward one with few channels, where the
  # op's FFT passes win), as `route_schedule` has it for this batch.
  routes = (attrs["algorithm"] == "tf",) * 3
  eligible = tf_kernel_eligible(input_shape, filter_shape, attrs, dtype)
  if attrs["algorithm"] == "auto" and eligible:
    routes = routes_for(route_schedule(tuple(input_shape[1:]), tuple(filter_shape),
                                       _args.attrs_key(attrs), dtype.name, threads),
                        input_shape[0])
  theirs = ours = None
  if any(routes) or eligible:  # raises where 'tf' was asked for and TF's kernels cannot
    theirs = _CORE.plan(*args, algorithm="tf", allow_tf=eligible, **kwargs)
  if not all(routes):
    ours = _CORE.plan(*args, algorithm=attrs["algorithm"], allow_tf=False, **kwargs)
    for mine, tfs in zip(ours, theirs or ()):  # what TF's kernel costs, for the table
      mine["cost_tf"] = tfs["cost_tf"]
  passes = [t if r else o for r, t, o in zip(routes, theirs or routes, ours or routes)]
  limit = attrs["workspace_limit"]
  if limit < 0:
    limit = _CORE.DEFAULT_WORKSPACE_LIMIT
  output_shape = batch_shape + list(geometry["output_shape"][1:])
  return Plan([PassPlan(d) for d in passes], output_shape, limit, threads, _loader.failure())


# TensorFlow's own kernel is weighed for the full-width floating dtypes only, so float16
# and bfloat16 results always come from the op, which computes them in float32, and int32
# ones too (TF has no int32 filter gradient). On a GPU, TF's kernel is cuDNN, which takes
# the half types too (accumulating in float32); float64 there is cuDNN's slow path.
TF_KERNEL_DTYPES = tuple(d for d in _args.FLOAT_DTYPES if d.size >= 4)
TF_GPU_KERNEL_DTYPES = tuple(d for d in _args.FLOAT_DTYPES if d.size <= 4)


def tf_kernel_eligible(input_shape, filter_shape, attrs, dtype, device="CPU"):
  """Whether TensorFlow's own kernels on `device` ('CPU' or 'GPU') can run this
  convolution, gradients included: on the CPU NHWC, dilations 1 and float32/float64; on a
  GPU every layout and dilation and float16/bfloat16/float32. No groups on either."""
  if len(input_shape) != 4 or len(filter_shape) != 4:
    return False
  if device == "GPU":
    channels = input_shape[1 if attrs["data_format"] == "NCHW" else 3]
    return dtype in TF_GPU_KERNEL_DTYPES and channels == filter_shape[2]
  return (attrs["data_format"] == "NHWC" and all(d == 1 for d in attrs["dilations"]) and
          dtype in TF_KERNEL_DTYPES and input_shape[3] == filter_shape[2])


def runs_on_gpu(tensor):
  """Whether an op taking `tensor` runs on a GPU, as TensorFlow places it: where the tensor
  names a device (eager tensors always do; graph tensors under a tf.device scope), that
  device's type; otherwise a GPU if one is visible, as TF prefers it."""
  device = (getattr(tensor, "device", None) or "").upper()
  if "GPU" in device:
    return True
  if "CPU" in device:
    return False
  return _gpu_visible()


@functools.cache
def _gpu_visible():
  # Logical devices are fixed once TensorFlow's runtime is up; asked once, not per trace.
  return bool(tf.config.list_logical_devices("GPU"))


def _tf_kernel_device(x_shape, f_shape, dtype, placed, attrs):
  """'CPU' or 'GPU', the device an op taking `placed` runs on, where TensorFlow's own
  kernels there can run this convolution; None where they cannot."""
  if x_shape is None or f_shape is None or None in x_shape[1:] or None in f_shape:
    return None
  device = "GPU" if runs_on_gpu(placed) else "CPU"
  if not tf_kernel_eligible([1] + list(x_shape[1:]), list(f_shape), attrs, dtype, device):
    return None
  return device


def tf_kernel_runs(x_shape, f_shape, dtype, placed, attrs):
  """Whether TensorFlow's own kernels, on the device an op taking `placed` runs on, can run
  this convolution: shapes in data_format order (None, or None entries, where not known
  statically; the batch may be unknown)."""
  return _tf_kernel_device(x_shape, f_shape, dtype, placed, attrs) is not None


# Which passes run TensorFlow's kernel depends on the batch: a larger one spreads the FFT
# path's filter transforms over more images. The routes are planned at each of
# ROUTE_BATCHES and hold from there to the next, so that a graph traced with an unknown
# batch, which picks among them at run time, and an eager call with the same batch run the
# same kernels and give identical results.
ROUTE_BATCHES = tuple(2**i for i in range(7))  # 1 ... 64


# An eager call of a route that mixes TF's kernels with the op's runs one more op, the
# LargeConv>Conv2DRoute that carries the gradient, whose gradient then calls each pass's
# op. Python's time, a 3x3 1->8 filter on one 8x8 image, interleaved, on a 2-core
# Zen 4: a forward call took 65 us on the route (TF, op, op), 49 on TF's kernels
# alone and 19 on the op alone; a training step 536, 702 and 509 us (TF's own gradient
# functions cost more than the route's); under tf.custom_gradient the mixed route had
# taken 162 and 662. Each kernel's own per-call cost is in the model already, so what
# mixing adds is the route op and its gradient's calls, about this much. A traced call
# costs nothing more at run time, but eager and traced calls run the same routes (see
# ROUTE_BATCHES). A pass is routed to the other side's kernel only where the mixed route
# saves more than that over running every pass one way; the model's seconds are
# single-thread seconds on REFERENCE_SLOTS threads, so the cost counts that many times.
MIXED_ROUTE_SECONDS = 25e-6


def _unmixed(passes, routes):
  """`routes` (mixed), or every pass TF's kernel or every pass the op's where that is priced
  within MIXED_ROUTE_SECONDS of them (`passes`: the planner's dicts, with each algorithm's
  cost; the op's is the lower of direct and fft)."""
  def ours(p):
    return min(c for c in (p["cost_direct"], p["cost_fft"]) if c >= 0)

  options = {routes: sum(p["cost_tf"] if r else ours(p) for p, r in zip(passes, routes)) +
             MIXED_ROUTE_SECONDS * _CORE.REFERENCE_SLOTS,
             (False,) * 3: sum(ours(p) for p in passes)}
  if all(p["cost_tf"] >= 0 for p in passes):
    options[(True,) * 3] = sum(p["cost_tf"] for p in passes)
  return min(options, key=options.get)


@functools.lru_cache(maxsize=1024)
def route_schedule(image_shape, f_shape, attrs_key, dtype_name, threads):
  """The CPU planner's routes for an eligible convolution of images `image_shape` (height,
  width and channels in data_format order) by batch: ((first_batch, routes), ...),
  ascending from 1, each `routes` (forward, backprop_input, backprop_filter, True where
  that pass runs TF's kernel) holding from `first_batch` images up to the next entry's
  first. Each is the planner's choice per pass, unless a route that mixes TF's kernels
  with the op's saves less than its own cost (MIXED_ROUTE_SECONDS). In the cost model the
  op's time per image falls with the batch while TF's does not, so a pass that leaves TF's
  kernel at some batch stays with the op at every larger one: the batches are planned in
  turn until no pass runs TF's kernel. Raises ValueError or
  NotImplementedError for arguments the planner refuses."""
  # Cached: eager code calls conv2d with the same shapes over and over, and a graph traced
  # with an unknown batch needs every entry.
  attrs = _args.attrs_from_key(attrs_key)
  schedule = []
  for batch in ROUTE_BATCHES:
    passes = _CORE.plan([batch, *image_shape], list(f_shape), attrs["strides"],
                        attrs["padding"], attrs["explicit_paddings"], attrs["data_format"],
                        attrs["dilations"], algorithm="auto", allow_tf=True,
                        workspace_limit=attrs["workspace_limit"], num_threads=threads,
                        dtype=dtype_name)
    routes = tuple(p["algorithm"] == "tf" for p in passes)
    if any(routes) and not all(routes):
      routes = _unmixed(passes, routes)
    if not schedule or routes != schedule[-1][1]:
      schedule.append((batch, routes))
    if not any(routes):
      break
  return tuple(schedule)


@functools.lru_cache(maxsize=1024)
def _cpu_schedule(image_shape, f_shape, attrs_key, dtype_name):
  """`route_schedule` for TensorFlow's intra-op threads, or one entry, all False, for
  arguments the planner refuses (the op raises the error then, the same in every mode).
  Cached: asking TF for its thread count costs more than a small convolution, and the
  count is fixed once TF runs, which it does once the convolution's tensors exist."""
  try:
    return route_schedule(image_shape, f_shape, attrs_key, dtype_name, intra_op_threads())
  except (ValueError, NotImplementedError):
    return ((1, (False,) * 3),)


def routes_for(schedule, batch):
  """The routes `schedule` (see `route_schedule`) gives `batch` images (0: the first)."""
  return [routes for first, routes in schedule if first <= max(batch, 1)][-1]


def tf_kernel_routes(x_shape, f_shape, dtype, placed, attrs):
  """The routes of `tf_routes` where TensorFlow's kernels can run the convolution
  (`tf_kernel_runs`, same arguments), by batch as `route_schedule` gives them: one entry
  where the batch is known (or on a GPU, whose routes do not depend on it), all of them
  where it is not; one entry, all False, where TF's kernels cannot run the convolution."""
  device = _tf_kernel_device(x_shape, f_shape, dtype, placed, attrs)
  if device is None:
    return ((1, (False,) * 3),)
  key = _args.attrs_key(attrs)
  if device == "GPU" or attrs["algorithm"] == "tf":
    return ((1, tf_routes(tuple(x_shape), tuple(f_shape), key, dtype.name, device)),)
  schedule = _cpu_schedule(tuple(x_shape[1:]), tuple(f_shape), key, dtype.name)
  if x_shape[0] is not None:
    return ((1, routes_for(schedule, x_shape[0])),)
  return schedule


# Filter spectra kept from one call to the next (the op's spectrum cache) take the
# filter's transforms out of an FFT pass: a 7x7 128->128 forward pass on one 64x64 image,
# one thread, ran 100.9 ms through the FFT, 34.9 with its spectra kept, and 58.1 through
# TF's kernel. The planner prices every call as a first one, so such a pass is routed to
# TF's kernel, which never shows the filter to the op. An eager call whose filter tensor
# came before moves to the op's FFT where that is priced below the pass's route with its
# spectra kept (`kept_spectra_bytes`); eager tensors are immutable, so the same tensor is
# the same filter.


@functools.lru_cache(maxsize=1024)
def kept_spectra_bytes(x_shape, f_shape, attrs_key, dtype_name, routes):
  """The bytes the spectrum cache keeps for this CPU convolution's forward pass (x_shape
  and f_shape tuples, batch known) where the op's FFT with them kept is priced below the
  forward pass of `routes` (as `tf_kernel_routes` gives them: TF's kernel, or the op's own
  choice) plus, where `routes` run no LargeConv>Conv2DRoute op, the one the move adds
  (MIXED_ROUTE_SECONDS); 0 where it is not (or where the op's own choice is the FFT, whose
  spectra are kept anyway). Plans with TensorFlow's intra-op threads."""
  attrs = _args.attrs_from_key(attrs_key)
  eligible = tf_kernel_eligible(list(x_shape), list(f_shape), attrs, tf.as_dtype(dtype_name))
  try:
    p = _CORE.plan(list(x_shape), list(f_shape), attrs["strides"], attrs["padding"],
                   attrs["explicit_paddings"], attrs["data_format"], attrs["dilations"],
                   algorithm="auto", allow_tf=eligible, workspace_limit=attrs["workspace_limit"],
                   num_threads=intra_op_threads(), dtype=dtype_name)[0]
  except (ValueError, NotImplementedError):
    return 0  # the op raises the error, the same in every mode
  # The op's own choice: the planner's, or where that is TF's kernel, the cheaper of the
  # op's two (the direct kernels on a tie, as the planner takes the earlier).
  op_fft = p["algorithm"] == "fft" or (p["algorithm"] == "tf" and
                                       0 <= p["cost_fft"] < p["cost_direct"])
  if p["cost_fft_kept"] < 0 or (not routes[0] and op_fft):
    return 0
  current = p["cost_tf"] if routes[0] else p["cost_direct"]
  mixed = any(routes) and not all(routes)
  added = 0 if mixed else MIXED_ROUTE_SECONDS * _CORE.REFERENCE_SLOTS
  return p["kept_spectra_bytes"] if p["cost_fft_kept"] + added < current else 0


def prefers_tf_kernel(x_shape, f_shape, attrs_key, dtype_name, device="CPU"):
  """Whether the planner runs this eligible convolution's forward pass through
  TensorFlow's kernel on `device` (see `tf_routes`)."""
  return tf_routes(x_shape, f_shape, attrs_key, dtype_name, device)[0]


@functools.lru_cache(maxsize=1024)
def tf_routes(x_shape, f_shape, attrs_key, dtype_name, device="CPU"):
  """(forward, backprop_input, backprop_filter): whether each pass of this eligible
  convolution runs TensorFlow's kernel on `device`: every pass where algorithm='tf'. On
  the CPU the planner weighs TF's kernel for each pass of x_shape's batch (1 where it is
  None), as `route_schedule` has it; on a GPU the CUDA planner weighs cuDNN's modelled
  time against its own choice for the forward pass of a batch of GPU_ROUTE_BATCH images
  (the model is fitted on an H100: see the README's GPU section), and every pass follows
  that choice."""
  # Cached: eager code calls conv2d with the same shapes over and over, and the decision
  # depends only on these arguments (and the thread count, fixed once TF is initialised).
  attrs = _args.attrs_from_key(attrs_key)
  if attrs["algorithm"] == "tf":
    return (True,) * 3
  if device == "GPU":
    try:
      shape = [_CORE.GPU_ROUTE_BATCH] + list(x_shape[1:])
      forward = _CORE.cuda_plan(shape, list(f_shape), attrs["strides"],
                                attrs["padding"], attrs["explicit_paddings"],
                                attrs["data_format"], attrs["dilations"], "auto",
                                attrs["workspace_limit"], dtype_name)[0]
    except (ValueError, NotImplementedError):
      return (False,) * 3  # bad arguments: our op raises the error, the same in every mode
    return (bool(forward["tf_faster"]),) * 3
  return routes_for(_cpu_schedule(tuple(x_shape[1:]), tuple(f_shape), attrs_key, dtype_name),
                    x_shape[0] or 1)
