"""What runs inside a dask task: one process-wide TensorFlow set-up, the assembly of a task's
input window from the input chunks it overlaps, and the in-memory op on that window."""

import sys
import threading
import warnings

import numpy as np
import tensorflow as tf

import tf_largeconv
from tf_largeconv._arrays import _ALIGN
from tf_largeconv._arrays import aligned_empty
from tf_largeconv._arrays import as_array
from tf_largeconv._arrays import as_tensor

_setup_lock = threading.Lock()
_setup_done = False


def _worker_threads():
  """The dask.distributed worker's thread count, or None outside a distributed worker."""
  try:
    from distributed import get_worker
  except ImportError:
    return None
  try:
    return get_worker().state.nthreads
  except ValueError:  # not running inside a distributed worker
    return None


def setup_process():
  """Sets TensorFlow's thread pools to the worker's thread count, once per process.

  Runs at the start of every task and does its work in the first: inside a dask.distributed
  worker with n threads, TensorFlow's intra-op pool gets n threads (the n concurrent tasks
  share it, so the worker never runs more than n compute threads) and its inter-op pool 1
  (eager ops run on the calling task's thread). This must happen before TensorFlow runs
  its first op in the process; if something else ran one already, the pools stay as they
  are and a warning says so. Outside a distributed worker (dask's threaded scheduler, all
  tasks in one process) TensorFlow keeps its defaults: one pool of all cores, shared.
  """
  global _setup_done
  if _setup_done:
    return
  with _setup_lock:
    if _setup_done:
      return
    threads = _worker_threads()
    if threads:
      try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
      except RuntimeError:
        if tf.config.threading.get_intra_op_parallelism_threads() != threads:
          warnings.warn(
            f"tf_largeconv.dask: TensorFlow was initialised in this worker before the "
            f"first convolution task, so its intra-op pool was not set to the worker's "
            f"{threads} thread(s); tasks may oversubscribe the cores",
            RuntimeWarning,
            stacklevel=2,
          )
    _setup_done = True


_thread_buffers = threading.local()


def window_buffer(shape, dtype):
  """An aligned, uninitialised array for a task's window, in memory this thread keeps from
  one task to the next: a window is written once per task, and writing memory the process
  has just been given (a fresh mapping, page by page) costs several times the copy itself
  in dask workers. The buffer grows to the largest window the thread has assembled and is
  given up only when something still refers to it (a tensor made from it still alive)."""
  dtype = np.dtype(dtype)
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = getattr(_thread_buffers, "raw", None)
  # References: the thread's slot, `raw` and getrefcount's argument; any more is a user.
  if raw is None or raw.nbytes < nbytes + _ALIGN or sys.getrefcount(raw) > 3:
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    _thread_buffers.raw = raw
  start = (-raw.ctypes.data) % _ALIGN
  return raw[start : start + nbytes].view(dtype).reshape(shape)


class Window:
  """One task's input window: where each overlapped input chunk goes in it, and which part
  of it lies inside the image (the rest is the zero padding).

  Attributes:
    shape: the window's shape, in the input's axis order.
    places: per overlapped input chunk, in the order the task receives them, (slices into
      the chunk, slices into the window).
    inner: per axis, the slice of the window inside the image.
  """

  __slots__ = ("shape", "places", "inner")

  def __init__(self, shape, places, inner):
    self.shape = tuple(shape)
    self.places = tuple(places)
    self.inner = tuple(inner)

  def __getstate__(self):
    return (self.shape, self.places, self.inner)

  def __setstate__(self, state):
    self.shape, self.places, self.inner = state

  def assemble(self, chunks, dtype):
    """The window as one aligned array of `dtype`: the chunks' parts copied in, zeros only
    where the window leaves the image. Its memory is the calling thread's window buffer,
    reused from task to task (see `window_buffer`)."""
    window = window_buffer(self.shape, dtype)
    for axis, inside in enumerate(self.inner):
      before = [slice(None)] * len(self.shape)
      before[axis] = slice(0, inside.start)
      window[tuple(before)] = 0
      before[axis] = slice(inside.stop, None)
      window[tuple(before)] = 0
    for chunk, (src, dst) in zip(chunks, self.places):
      window[dst] = chunk[src]
    return window


class ConvSpec:
  """A convolution's filter (or, for the filter gradient, the filter's shape), dtypes and
  ConvProblem: stored once in the graph and shared by its tasks. The filter's tensor is
  made once per process (it is not pickled)."""

  def __init__(self, problem, dtype, filters=None, filter_sizes=None):
    self.problem = problem
    self.dtype = np.dtype(dtype)
    self.filters = filters
    self.filter_sizes = filter_sizes
    self._tensor = None

  def __getstate__(self):
    return (self.problem, self.dtype, self.filters, self.filter_sizes)

  def __setstate__(self, state):
    self.problem, self.dtype, self.filters, self.filter_sizes = state
    self._tensor = None

  def filter_tensor(self):
    if self._tensor is None:
      self._tensor = tf.convert_to_tensor(self.filters)
    return self._tensor

  def conv_kwargs(self):
    """The in-memory op's arguments for a window: the problem's, padding VALID."""
    return dict(self.problem.kwargs(), padding="VALID")


def take(chunk, index):
  """A copy of part of an input chunk (a halo strip): only this travels to the task that
  needs it, and it keeps no reference to the whole chunk."""
  return np.array(chunk[index], order="C", copy=True)


def forward(spec, window, chunks):
  """The output chunk whose input window `window` is, from the input chunks it overlaps."""
  setup_process()
  x = as_tensor(window.assemble(chunks, spec.dtype))
  return as_array(tf_largeconv.conv2d(x, spec.filter_tensor(), **spec.conv_kwargs()))


def backprop_filter(spec, window, chunks, out_backprop):
  """The filter gradient's share from one out_backprop chunk and its input window, in
  float64. `spec.dtype` is the dtype the op computes in: float32 for half-precision
  operands, which the in-memory op also accumulates in float32."""
  setup_process()
  x = as_tensor(window.assemble(chunks, spec.dtype))
  dy = out_backprop
  if not (
    dy.dtype == spec.dtype
    and dy.flags.c_contiguous
    and dy.flags.writeable
    and dy.ctypes.data % _ALIGN == 0
  ):
    dy = aligned_empty(out_backprop.shape, spec.dtype)
    dy[...] = out_backprop
  dw = tf_largeconv.conv2d_backprop_filter(
    x, spec.filter_sizes, as_tensor(dy), **spec.conv_kwargs()
  )
  return dw.numpy().astype(np.float64)


def add(parts):
  """The sum of partial filter gradients: one node of the tree reduction."""
  total = np.array(parts[0], np.float64)
  for p in parts[1:]:
    total += p
  return total


def cast(total, dtype):
  """The reduced filter gradient in the input's dtype (rounded once)."""
  return total.astype(dtype)
