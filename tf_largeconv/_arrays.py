"""Arrays handed to TensorFlow and back without a copy where DLPack allows: aligned,
contiguous numpy buffers for windows and results."""

import numpy as np
import tensorflow as tf

# Windows and gradients go to TensorFlow through DLPack, without a copy, for these dtypes
# (numpy has no bfloat16, so a bfloat16 array is copied by tf.convert_to_tensor).
_DLPACK_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
# TensorFlow's tensors are 64-byte aligned (Eigen's widest vectors); windows are too.
_ALIGN = 64


def aligned_empty(shape, dtype):
  """An uninitialised C-contiguous array whose data starts on a 64-byte boundary."""
  dtype = np.dtype(dtype)
  nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  raw = np.empty(nbytes + _ALIGN, np.uint8)
  start = (-raw.ctypes.data) % _ALIGN
  return raw[start : start + nbytes].view(dtype).reshape(shape)


def as_tensor(a):
  """`a` as a tensor, sharing its memory where it can (aligned, contiguous, writeable)."""
  if (
    a.dtype in _DLPACK_DTYPES
    and a.size
    and a.flags.c_contiguous
    and a.flags.writeable
    and a.ctypes.data % _ALIGN == 0
  ):
    return tf.experimental.dlpack.from_dlpack(a.__dlpack__())
  return tf.convert_to_tensor(a)


def as_array(t):
  """A tensor's values as numpy, sharing the tensor's memory (read-only) where DLPack can:
  an output chunk is not copied again after the op wrote it (`compute()` still returns a
  writeable array: dask assembles it)."""
  if np.dtype(t.dtype.as_numpy_dtype) in _DLPACK_DTYPES and t.shape.num_elements():
    return np.from_dlpack(t)
  return t.numpy()
