"""The graphs of tf_largeconv.dask: validation, the output chunk grid, and one task per output
chunk that reads exactly its input window.

A task's window is the input region its outputs read: for output rows [o0, o1) along an axis
with stride s, dilated filter extent e and padding p before, input rows
[o0 * s - p, (o1 - 1) * s - p + e). Rows outside the image are the zero padding. The in-memory
op then runs on the window with padding VALID, which gives exactly those output rows; the C++
geometry (the one source of output sizes and padding) checks that for every window shape
before any task runs.
"""

import bisect
import collections
import itertools
import math
import numbers

import dask.array as da
import numpy as np
import tensorflow as tf
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv import planning
from tf_largeconv.dask import _tasks

_CORE = _loader.core()
# Fan-in of the filter gradient's tree reduction.
SPLIT_EVERY = 8


class TaskMemory(
  collections.namedtuple(
    "TaskMemory", ["window_bytes", "output_bytes", "workspace_bytes", "input_bytes"]
  )
):
  """Memory of the largest task of a dask convolution, in bytes.

  Attributes:
    window_bytes: the task's input window: its output chunk's receptive field, i.e. the
      input chunk plus the halo (dilated filter extent - 1, split as the padding splits it).
    output_bytes: the task's output chunk.
    workspace_bytes: the op's temporary memory bound, `workspace_limit` (default 64 MiB).
    input_bytes: the task's inputs: the input chunks inside its window and copies of the
      halo strips it needs from the chunks around it (together, the part of the window
      inside the image). The worker holds them while the task runs.
    total: window_bytes + output_bytes + workspace_bytes: what the task itself allocates
      (above TensorFlow's fixed per-process overhead).
  """

  __slots__ = ()

  @property
  def total(self):
    return self.window_bytes + self.output_bytes + self.workspace_bytes


# The floating dtypes only: the filter gradient sums its per-chunk shares in float64, which
# would not reproduce int32's wrap-around.
def _dtype_names():
  names = [d.name for d in _args.FLOAT_DTYPES]
  return ", ".join(names[:-1]) + " or " + names[-1]


def check_input(x, name="input"):
  """Checks that `x` is a 4-D dask array of a supported dtype with known chunks.

  Returns:
    Its dtype (numpy).
  """
  if not isinstance(x, da.Array):
    raise ValueError(
      f"{name} must be a 4-D dask array (dask.array.Array), got {type(x).__name__}; "
      f"wrap an array with dask.array.from_array, or use tf_largeconv for in-memory "
      f"tensors"
    )
  if x.ndim != 4:
    raise ValueError(f"{name} must be a 4-D dask array in data_format order, got shape {x.shape}")
  if any(math.isnan(c) for chunks in x.chunks for c in chunks):
    raise ValueError(f"{name} has unknown chunk sizes; call {name}.compute_chunk_sizes() first")
  try:
    supported = tf.as_dtype(x.dtype) in _args.FLOAT_DTYPES
  except TypeError:
    supported = False
  if not supported:
    raise TypeError(f"{name} must have dtype {_dtype_names()}, got {x.dtype}")
  return np.dtype(x.dtype)


def as_filter_array(filters, dtype, name):
  """`filters` (array-like, tensor or variable) as a numpy array of the input's dtype; a
  tensor must already have it, as for the in-memory op."""
  if isinstance(filters, (tf.Tensor, tf.Variable)):
    if filters.dtype != tf.as_dtype(dtype):
      raise TypeError(
        f"{name} must have the same dtype as input ({np.dtype(dtype).name}), "
        f"got {filters.dtype.name}"
      )
    return np.asarray(filters.numpy())
  return np.asarray(filters, dtype=dtype)


def _edges(chunks):
  return tuple(itertools.accumulate(chunks, initial=0))


def output_chunks(in_chunks, stride, out_size):
  """Output chunks along a spatial axis: the input chunk edges divided by the stride
  (rounded up), so an input chunked in multiples of the stride gives equal output chunks.
  Output rows beyond the last input edge (large explicit padding) get chunks of the first
  chunk's size."""
  bounds = sorted({min(-(-e // stride), out_size) for e in _edges(in_chunks)} | {0})
  step = max(bounds[1] - bounds[0], 1) if len(bounds) > 1 else max(out_size, 1)
  while bounds[-1] < out_size:
    bounds.append(min(bounds[-1] + step, out_size))
  return tuple(b - a for a, b in zip(bounds[:-1], bounds[1:]))


def _windows(out_chunks, stride, pad_before, extent):
  """The input rows [start, stop) each output chunk reads (see the module docstring)."""
  edges = _edges(out_chunks)
  return [
    (o0 * stride - pad_before, (o1 - 1) * stride - pad_before + extent)
    for o0, o1 in zip(edges[:-1], edges[1:])
  ]


def _overlaps(edges, start, stop):
  """(chunk index, slice in the chunk, slice in the window) of each input chunk that overlaps
  the window [start, stop) of an axis whose chunks end at `edges`."""
  lo, hi = max(start, 0), min(stop, edges[-1])
  found = []
  j = max(bisect.bisect_right(edges, lo) - 1, 0)
  while lo < hi and j < len(edges) - 1 and edges[j] < hi:
    a, b = max(lo, edges[j]), min(hi, edges[j + 1])
    if a < b:
      found.append((j, slice(a - edges[j], b - edges[j]), slice(a - start, b - start)))
    j += 1
  return found


class Blocks:
  """The tasks of one convolution over a dask input: per output block, its Window and the
  keys of the pieces it reads.

  A piece is a whole input chunk where the window covers it, and otherwise a halo strip: a
  copy of just the overlapped part, cut by its own small task (`strips`), which the
  scheduler runs where the chunk is, so only the strip travels to the task that needs it
  and that task holds no more than its window's worth of input.

  Args:
    x: the input dask array.
    windows: per axis, the [start, stop) of each output chunk's window along that axis.
    name: the prefix of the strip tasks' keys.
  """

  def __init__(self, x, windows, name):
    self.x = x
    edges = [_edges(c) for c in x.chunks]
    per_axis = [[_overlaps(e, a, b) for a, b in wins] for e, wins in zip(edges, windows)]
    itemsize = x.dtype.itemsize
    self.blocks = []  # (block index, Window, piece keys)
    self.input_bytes = []  # per block, the bytes of its pieces
    self.strips = {}  # strip key: task
    strip_keys = {}
    for idx in itertools.product(*(range(len(w)) for w in windows)):
      spans = [windows[axis][i] for axis, i in enumerate(idx)]
      shape = tuple(b - a for a, b in spans)
      inner = []
      for (a, b), e in zip(spans, edges):
        lo, hi = min(max(-a, 0), b - a), min(max(e[-1] - a, 0), b - a)
        inner.append(slice(lo, max(lo, hi)))
      keys, places, nbytes = [], [], 0
      for parts in itertools.product(*(per_axis[axis][i] for axis, i in enumerate(idx))):
        chunk = tuple(p[0] for p in parts)
        src = tuple(p[1] for p in parts)
        dst = tuple(p[2] for p in parts)
        key = (x.name,) + chunk
        if any(
          sl.stop - sl.start != x.chunks[axis][j] for axis, (j, sl) in enumerate(zip(chunk, src))
        ):
          bounds = tuple((sl.start, sl.stop) for sl in src)
          if (key, bounds) not in strip_keys:
            strip = (f"{name}-halo", len(self.strips))
            strip_keys[key, bounds] = strip
            self.strips[strip] = (_tasks.take, key, src)
          key = strip_keys[key, bounds]
          src = (slice(None),) * len(src)
        keys.append(key)
        places.append((src, dst))
        nbytes += math.prod(sl.stop - sl.start for sl in dst) * itemsize
      self.blocks.append((idx, _tasks.Window(shape, places, inner), keys))
      self.input_bytes.append(nbytes)


def _check_windows(shapes, problem, dtype):
  """Plans each distinct (window, output block) shape pair as a VALID convolution of the
  bound problem's filter: errors (e.g. a workspace_limit the FFT cannot meet) surface now,
  not in a task, and the C++ geometry confirms each window gives exactly its output
  block."""
  valid = problem.replace(padding="VALID", explicit_paddings=())
  for window_shape, out_shape in sorted(shapes):
    if 0 in window_shape:
      continue  # an empty batch chunk: nothing to plan
    p = planning.plan_problem(valid.bind(window_shape, problem.filter_shape), dtype, num_threads=1)
    if tuple(p.output_shape) != tuple(out_shape):
      raise AssertionError(
        f"tf_largeconv.dask: window {window_shape} gives {p.output_shape}, expected {out_shape}"
      )


def _batch_windows(chunks):
  """The batch axis's windows: each chunk its own."""
  edges = _edges(chunks)
  return list(zip(edges[:-1], edges[1:]))


class Forward:
  """A validated forward convolution over a dask input, and its graph.

  Args:
    x: the input dask array.
    filters: the filter, array-like or tensor (converted to x's dtype).
    problem: the 2-D ConvProblem (its kind's filter: a depthwise one is grouped here).
    name, filter_name: the prefix of the dask keys; the filter's name in errors.
  """

  def __init__(self, x, filters, problem, name="largeconv-conv2d", filter_name="filters"):
    self.dtype = check_input(x)
    filters = as_filter_array(filters, self.dtype, filter_name)
    if problem.kind == "depthwise":
      filters = _args.grouped_filter(filters, x.shape[problem.channel_axis])
      problem = problem.replace(kind="conv2d")
    if filters.ndim != 4:
      raise ValueError(
        f"{filter_name} must be 4-D [height, width, in_channels / groups, "
        f"out_channels], got shape {filters.shape}"
      )
    self.filters = filters
    self.problem = problem.bind(x.shape, filters.shape)
    self.attrs = problem.attrs()  # the op attributes, as the output's fingerprint has them
    self.geom = self.problem.geometry()
    c_axis = self.problem.channel_axis
    out_chunks, windows = [None] * 4, [None] * 4
    out_chunks[0], windows[0] = x.chunks[0], _batch_windows(x.chunks[0])
    out_chunks[c_axis], windows[c_axis] = (self.geom["out_c"],), [(0, x.shape[c_axis])]
    for axis, a in zip(self.problem.spatial_axes, self.problem.axes()):
      out_chunks[axis] = output_chunks(x.chunks[axis], a.stride, a.out)
      windows[axis] = _windows(out_chunks[axis], a.stride, a.pad_before, a.extent)
    self.x = x
    self.out_chunks = tuple(out_chunks)
    self.name = f"{name}-{tokenize(x, self.filters, sorted(self.attrs.items()))}"
    self.blocks = Blocks(x, windows, self.name)
    _check_windows(
      {(w.shape, self.out_shape(idx)) for idx, w, _ in self.blocks.blocks},
      self.problem,
      self.dtype,
    )

  def out_shape(self, idx):
    return tuple(self.out_chunks[axis][i] for axis, i in enumerate(idx))

  def task_memory(self):
    """The TaskMemory of the task with the largest window + output."""
    itemsize = self.dtype.itemsize
    best = None
    for (idx, window, _), held in zip(self.blocks.blocks, self.blocks.input_bytes):
      m = TaskMemory(
        math.prod(window.shape) * itemsize,
        math.prod(self.out_shape(idx)) * itemsize,
        self.problem.workspace_bound,
        held,
      )
      if best is None or (m.total, m.input_bytes) > (best.total, best.input_bytes):
        best = m
    return best

  def chunk_tasks(self):
    """The graph's parts: (the shared tasks: halo strips and the spec, as a dict; per
    output chunk index, its task `(forward, spec key, window, piece keys)`)."""
    spec_key = f"{self.name}-spec"
    shared = dict(self.blocks.strips)
    shared[spec_key] = _tasks.ConvSpec(self.problem.unbound(), self.dtype, filters=self.filters)
    tasks = {
      idx: (_tasks.forward, spec_key, window, keys) for idx, window, keys in self.blocks.blocks
    }
    return shared, tasks

  def graph(self, layer):
    """`layer` (tasks that use the shared tasks and the input) as a HighLevelGraph over
    the input's."""
    return HighLevelGraph.from_collections(self.name, layer, dependencies=[self.x])

  def array(self):
    shared, tasks = self.chunk_tasks()
    layer = dict(shared)
    layer.update({(self.name,) + idx: task for idx, task in tasks.items()})
    return da.Array(
      self.graph(layer), self.name, chunks=self.out_chunks, meta=np.empty((0,) * 4, self.dtype)
    )


def _filter_sizes(filter_sizes):
  if isinstance(filter_sizes, (tf.Tensor, tf.Variable)):
    filter_sizes = filter_sizes.numpy().tolist()
  try:
    sizes = list(filter_sizes)
  except TypeError:
    sizes = None
  if (
    sizes is None
    or len(sizes) != 4
    or not all(
      isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 0 for v in sizes
    )
  ):
    raise ValueError(
      f"filter_sizes must be 4 non-negative ints [height, width, "
      f"in_channels / groups, out_channels], got {filter_sizes!r}"
    )
  return [int(v) for v in sizes]


def _out_backprop(out_backprop, x, problem, out_shape):
  """out_backprop as a dask array (an array-like chunked as the forward output would be),
  checked against the output's shape and x's dtype, with its channels in one chunk."""
  if isinstance(out_backprop, da.Array):
    dy = out_backprop
  else:
    if isinstance(out_backprop, (tf.Tensor, tf.Variable)):
      out_backprop = out_backprop.numpy()
    dy = np.asarray(out_backprop)
    if dy.shape == out_shape:  # chunked as the forward output would be
      chunks = [x.chunks[0], None, None, None]
      chunks[problem.channel_axis] = -1
      for axis, a in zip(problem.spatial_axes, problem.axes()):
        chunks[axis] = output_chunks(x.chunks[axis], a.stride, a.out)
      dy = da.from_array(dy, chunks=tuple(chunks))
  if tuple(dy.shape) != out_shape:
    raise ValueError(
      f"out_backprop must have the convolution's output shape {out_shape}, got {tuple(dy.shape)}"
    )
  check_input(dy, "out_backprop")
  if dy.dtype != x.dtype:
    dy = dy.astype(x.dtype)
  if len(dy.chunks[problem.channel_axis]) > 1:
    dy = dy.rechunk({problem.channel_axis: -1})
  return dy


def _tree_sum(layer, level, name):
  """Adds to `layer` the tree reduction (SPLIT_EVERY per node) of the keys `level`;
  returns the root's key."""
  depth = 0
  while len(level) > 1:
    level_name = f"{name}-sum{depth}"
    groups = [level[i : i + SPLIT_EVERY] for i in range(0, len(level), SPLIT_EVERY)]
    for i, group in enumerate(groups):
      layer[(level_name, i)] = (_tasks.add, group)
    level = [(level_name, i) for i in range(len(groups))]
    depth += 1
  return level[0]


def backprop_filter(x, filter_sizes, out_backprop, problem, name):
  """The filter gradient over dask arrays for a 2-D ConvProblem, as a one-chunk dask
  array (see __init__)."""
  dtype = check_input(x)
  filter_sizes = _filter_sizes(filter_sizes)
  problem = problem.bind(x.shape, filter_sizes)
  out_shape = tuple(problem.geometry()["output_shape"])
  dy = _out_backprop(out_backprop, x, problem, out_shape)
  c_axis = problem.channel_axis
  windows = [None] * 4
  windows[0], windows[c_axis] = _batch_windows(dy.chunks[0]), [(0, x.shape[c_axis])]
  for axis, a in zip(problem.spatial_axes, problem.axes()):
    windows[axis] = _windows(dy.chunks[axis], a.stride, a.pad_before, a.extent)
  token = tokenize(x, dy, filter_sizes, sorted(problem.attrs().items()))
  name = f"{name}-{token}"
  blocks = Blocks(x, windows, name)
  compute_dtype = np.dtype(np.float32) if dtype.itemsize < 4 else dtype
  _check_windows(
    {(w.shape, tuple(dy.chunks[a][i] for a, i in enumerate(idx))) for idx, w, _ in blocks.blocks},
    problem,
    compute_dtype,
  )
  spec_key = f"{name}-spec"
  layer = dict(blocks.strips)
  layer[spec_key] = _tasks.ConvSpec(problem.unbound(), compute_dtype, filter_sizes=filter_sizes)
  level = []
  for idx, window, keys in blocks.blocks:
    key = (f"{name}-part",) + idx
    layer[key] = (_tasks.backprop_filter, spec_key, window, keys, (dy.name,) + idx)
    level.append(key)
  layer[(name, 0, 0, 0, 0)] = (_tasks.cast, _tree_sum(layer, level, name), dtype)
  graph = HighLevelGraph.from_collections(name, layer, dependencies=[x, dy])
  return da.Array(
    graph, name, chunks=tuple((s,) for s in filter_sizes), meta=np.empty((0,) * 4, dtype)
  )
