"""tf_largeconv.dask: convolutions of dask arrays larger than memory (whole-slide images,
mosaics), chunk by chunk, on any dask scheduler (dask.distributed included).

Needs the optional extra: `pip install 'tf_largeconv[dask]'` (dask[array], distributed,
zarr, tifffile). `import tf_largeconv` alone never imports dask.

How it computes: one task per output chunk. A task receives the input chunks inside its
window and copies of the strips it needs from the chunks around it, copies exactly its window
(the output chunk's receptive field: the input chunk plus the halo, which is the dilated
filter extent - 1, split as the padding splits it) into one buffer, zero padded only where
the window leaves the image, and runs `tf_largeconv.conv2d` on it with padding VALID. So
every output element is computed exactly as the in-memory op computes it on the whole array
(up to the op's own rounding, which depends on the plan it makes for the window's shape),
and nothing ever holds the whole array.

Chunking: the batch axis maps chunk for chunk; each spatial axis is cut at the input's chunk
edges divided by the stride (rounded up), so an input chunked in multiples of the stride
gives equal output chunks (what zarr stores; otherwise `to_zarr` rechunks the result, with
a warning); the output channels are one chunk. A chunked channel axis is gathered whole into
each window (a convolution needs all input channels of a group). Any chunking works, chunks
smaller than the halo included: a window then spans several chunks.

Memory per task (bytes, for the largest task `task_memory` gives the numbers):
  window + output chunk + workspace_limit (default 64 MiB)
  + TensorFlow's fixed per-process overhead (about 0.5 GiB once per worker, importing it),
where window = batch chunk x ((out_rows - 1) * stride + extent) x (same for columns)
x in_channels x itemsize, extent = (filter size - 1) * dilation + 1. The window goes to
TensorFlow without a copy (DLPack), written into a buffer each thread keeps from task to task
(a thread holds its largest window between tasks too); the output chunk is the op's own
tensor memory (read-only, no copy; `compute()` returns a writeable array all the same).
The task's inputs are its own input chunk(s) and copies of the halo strips it needs from
the chunks around it, cut where those chunks are, so only the strips travel between
workers; together they are the part of the window inside the image.

Across the cluster, an input chunk stays in memory until the tasks of its neighbours below
have their strips, and dask runs the chunk grid row by row: expect about two rows of input
chunks across the image in memory at once (2 x width x chunk rows x channels x itemsize in
all, shared among the workers). A smaller chunk lowers both this and the per-task memory.

Workers: each task first makes sure its process is set up (once per process): inside a
dask.distributed worker with n threads, TensorFlow's intra-op pool is set to n threads and
its inter-op pool to 1 before TensorFlow runs its first op there, so the worker's concurrent
tasks share n threads and never oversubscribe the cores. tf_largeconv is imported once per
worker process, when the first task's function is loaded.

Writing (`conv2d_to_zarr`): each output chunk is one task: it computes the chunk, writes it,
and only then records it complete (an atomic rename in `OUTPUT/.largeconv-record/`). With
`resume=True` only the chunks not recorded are computed, and the output must have been
started with the same input, filters, arguments and layout (a fingerprint of them is stored
with it). A task retried after its worker died skips a chunk already recorded. A depthwise
convolution is written with its grouped filter [h, w, 1, in_channels * multiplier].
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

try:
  import dask.array
except ImportError as e:  # pragma: no cover (the extra is installed where tests run)
  raise ImportError(
    "tf_largeconv.dask needs the optional dependencies: pip install 'tf_largeconv[dask]' "
    "(dask[array], distributed, zarr, tifffile)"
  ) from e

import numpy as np

from tf_largeconv._options import takes_options
from tf_largeconv._problem import ConvProblem
from tf_largeconv._types import Padding
from tf_largeconv._types import TensorLike
from tf_largeconv._types import Window
from tf_largeconv.dask import _graph
from tf_largeconv.dask import _output
from tf_largeconv.dask._graph import TaskMemory
from tf_largeconv.dask._output import WriteReport
from tf_largeconv.dask._slides import open_slide


@takes_options
def conv2d(
  input: dask.array.Array,
  filters: TensorLike,
  strides: Window,
  padding: Padding,
  data_format: str | None = "NHWC",
  dilations: Window | None = None,
  name: str | None = None,
  **options: Any,
) -> dask.array.Array:
  """A 2-D convolution of a dask array: `tf_largeconv.conv2d`, chunk by chunk, lazily.

  Args:
    input: 4-D dask array in data_format order, float16, bfloat16, float32 or float64,
      any chunking.
    filters: numpy array, tensor or array-like, [height, width, in_channels / groups,
      out_channels]; cast to input's dtype (a tensor must have it already).
    strides, padding, data_format, dilations, algorithm, workspace_limit: as for
      `tf_largeconv.conv2d` (every padding, stride, dilation and layout; grouped when the
      filter's in-depth divides the input depth). `workspace_limit` bounds each task's
      temporary memory.
    name: prefix of the dask keys; default 'largeconv-conv2d'.

  Returns:
    A lazy dask array of input's dtype, shaped as `tf_largeconv.conv2d`'s result, whose
    `compute()` equals it. Chunks: see the module docstring.

  Raises:
    ValueError: input is not a 4-D dask array with known chunks; filters is not 4-D, its
      in-depth does not divide the input depth, or it is larger than the padded input;
      malformed strides, padding, dilations, data_format, algorithm or workspace_limit; a
      workspace_limit the FFT cannot meet with algorithm='fft'. All raised here, before any
      task exists.
    TypeError: an unsupported dtype, or a filter tensor of another dtype.
  """
  problem = ConvProblem.conv2d(strides, padding, data_format, dilations, **options)
  return _graph.Forward(input, filters, problem, name=name or "largeconv-conv2d").array()


@takes_options
def depthwise_conv2d(
  input: dask.array.Array,
  filter: TensorLike,
  strides: Window,
  padding: Padding,
  data_format: str | None = None,
  dilations: Window | None = None,
  name: str | None = None,
  **options: Any,
) -> dask.array.Array:
  """A depthwise 2-D convolution of a dask array: `tf_largeconv.depthwise_conv2d`, chunk by
  chunk, lazily (the grouped convolution with one group per input channel).

  Args:
    input: 4-D dask array in data_format order (see `conv2d`).
    filter: [height, width, in_channels, channel_multiplier]; output channel
      c * channel_multiplier + m comes from filter[:, :, c, m].
    strides, padding, data_format, dilations, algorithm, workspace_limit: as for
      `tf_largeconv.depthwise_conv2d`.
    name: prefix of the dask keys; default 'largeconv-depthwise'.

  Returns:
    A lazy dask array with in_channels * channel_multiplier output channels.

  Raises:
    ValueError: as for `conv2d`, and a filter that is not 4-D or whose in_channels differs
      from the input depth.
    TypeError: as for `conv2d`.
  """
  problem = ConvProblem.depthwise(strides, padding, data_format, dilations, **options)
  return _graph.Forward(
    input, filter, problem, name=name or "largeconv-depthwise", filter_name="filter"
  ).array()


@takes_options
def conv2d_backprop_filter(
  input: dask.array.Array,
  filter_sizes: Sequence[int],
  out_backprop: dask.array.Array | TensorLike,
  strides: Window,
  padding: Padding,
  data_format: str | None = "NHWC",
  dilations: Window | None = None,
  name: str | None = None,
  **options: Any,
) -> np.ndarray:
  """The gradient of `conv2d` with respect to its filter, over dask arrays: what fitting a
  large filter to a slide needs.

  One task per out_backprop chunk computes that chunk's share with
  `tf_largeconv.conv2d_backprop_filter` on its input window (padding VALID); the shares are
  summed in float64 by a tree reduction (8 per node), rounded once to input's dtype.
  Half-precision operands are computed in float32, as the in-memory op accumulates them.
  Memory per task: window + out_backprop chunk (copied if not aligned) + filter +
  workspace_limit. Computed on the current dask scheduler (a dask.distributed Client if one
  is active).

  Args:
    input: 4-D dask array, the convolution's input (any chunking).
    filter_sizes: 4 ints, the filter's shape [height, width, in_channels / groups,
      out_channels].
    out_backprop: the gradient of the convolution's output: a dask array (any chunking; its
      chunks are the tasks) or an array-like (chunked as `conv2d`'s result would be).
    strides, padding, data_format, dilations, algorithm, workspace_limit: as for `conv2d`.
    name: prefix of the dask keys; default 'largeconv-backprop-filter'.

  Returns:
    The filter gradient, a numpy array of input's dtype shaped `filter_sizes`, equal to
    `tf_largeconv.conv2d_backprop_filter` on the whole arrays.

  Raises:
    ValueError: as for `conv2d`; malformed filter_sizes; out_backprop not shaped as the
      convolution's output.
    TypeError: an unsupported dtype.
  """
  problem = ConvProblem.conv2d(strides, padding, data_format, dilations, **options)
  name = name or "largeconv-backprop-filter"
  return _graph.backprop_filter(input, filter_sizes, out_backprop, problem, name).compute()


@takes_options
def conv2d_to_zarr(
  input: dask.array.Array,
  filters: TensorLike,
  strides: Window,
  padding: Padding,
  output: str,
  data_format: str | None = "NHWC",
  dilations: Window | None = None,
  *,
  output_axes: str | None = None,
  output_format: str | None = None,
  levels: int | None = None,
  ngff_version: str = "0.5",
  scale: Mapping[str, float] | None = None,
  translation: Mapping[str, float] | None = None,
  units: Mapping[str, str | None] | None = None,
  compressors: Any = "auto",
  resume: bool = False,
  overwrite: bool = False,
  fingerprint: Mapping[str, Any] | None = None,
  client: Any = None,
  progress: Callable[[int, int, float], None] | None = None,
  **options: Any,
) -> WriteReport:
  """`conv2d`'s result computed into a zarr array or an OME-Zarr image, chunk by chunk,
  with a record of the chunks written so that an interrupted run resumes where it stopped
  (see "Writing" in the module's docstring).

  Args:
    input, filters, strides, padding, data_format, dilations, algorithm, workspace_limit:
      as for `conv2d`; rows and columns chunked in multiples of the stride.
    output: the directory to write: a zarr array, or with output_format 'ome-zarr' an
      OME-Zarr image (multiscales: level 0 the result, then `levels - 1` levels each half
      the size of the one before, by 2x2 means; written by ngff-zarr).
    output_axes: the output's axes as letters of data_format ('HWC', 'CHW', 'HW'; those left
      out of length 1). Default: data_format for zarr, 'CHW' (or 'HW') for OME-Zarr.
    output_format: 'zarr' or 'ome-zarr'; default 'ome-zarr' when output ends in '.ome.zarr'.
    levels: OME-Zarr pyramid levels; default: halved until the longer side is <= 1024.
    ngff_version: OME-Zarr version, '0.5' (zarr v3) or '0.4' (zarr v2).
    compressors: a zarr output's, as `zarr.create_array` takes them (None: uncompressed).
    scale, translation, units: the input's pixel size, origin and units along 'y' and 'x'
      (default 1, 0, none); the output's are each output pixel's and its window's centre.
    resume: finish an interrupted run into `output` (an absent output is started).
    overwrite: replace `output` if it exists. Neither: an existing output is an error.
    fingerprint: more JSON-able fields that define the output (e.g. the input file's size
      and time); the input enters by its dask token (a file's path and layout, not pixels).
    client: a dask.distributed Client; default the current one, else dask's threads here.
    progress: called as progress(chunks done, chunks in all, seconds) about once a second.

  Returns:
    A `WriteReport` (chunks computed, skipped, recomputed and retried, seconds, pixels).

  Raises:
    ValueError, TypeError: as for `conv2d`; bad output arguments; resume and overwrite
      together; a resume against an output with another fingerprint (the differing fields
      named) or without a record.
    FileExistsError: `output` exists and neither resume nor overwrite is set.
    OSError: a chunk could not be written (e.g. errno ENOSPC, the disk full): the chunks
      written before stay recorded, and a resume computes the rest.
  """
  if resume and overwrite:
    raise ValueError("resume and overwrite exclude each other: pass one")
  problem = ConvProblem.conv2d(strides, padding, data_format, dilations, **options)
  return _output.write(
    _graph.Forward(input, filters, problem),
    output,
    output_axes=output_axes,
    fmt=output_format or ("ome-zarr" if output.rstrip("/").endswith(".ome.zarr") else "zarr"),
    levels=levels,
    ngff_version=ngff_version,
    compressors=compressors,
    mode="resume" if resume else ("overwrite" if overwrite else "new"),
    client=client if client is not None else _default_client(),
    progress=progress,
    scale=_copied(scale),
    translation=_copied(translation),
    units=_copied(units),
    fingerprint=_copied(fingerprint),
  )


def _copied(mapping: Mapping[str, Any] | None) -> dict[str, Any] | None:
  return None if mapping is None else dict(mapping)


def _default_client() -> Any:
  """The current dask.distributed Client, or None."""
  try:
    from distributed import default_client
  except ImportError:  # pragma: no cover (distributed is part of the extra)
    return None
  try:
    return default_client()
  except ValueError:
    return None


@takes_options
def task_memory(
  input: dask.array.Array,
  filters: TensorLike,
  strides: Window,
  padding: Padding,
  data_format: str | None = "NHWC",
  dilations: Window | None = None,
  **options: Any,
) -> TaskMemory:
  """The memory of the largest task `conv2d` would run, for sizing chunks and workers.

  Args:
    input, filters, strides, padding, data_format, dilations, algorithm, workspace_limit:
      as for `conv2d` (nothing is computed).

  Returns:
    A `TaskMemory`: window_bytes, output_bytes, workspace_bytes, input_bytes, and total
    (= window + output + workspace, what the task allocates).
  """
  problem = ConvProblem.conv2d(strides, padding, data_format, dilations, **options)
  return _graph.Forward(input, filters, problem).task_memory()


__all__ = [
  "conv2d",
  "depthwise_conv2d",
  "conv2d_backprop_filter",
  "conv2d_to_zarr",
  "task_memory",
  "TaskMemory",
  "WriteReport",
  "open_slide",
]
