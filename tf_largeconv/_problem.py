"""`ConvProblem`: one convolution's arguments, cleaned once, and the geometry of its shapes.

Every entry point (the ops, the planner, fold, dask, stream) builds a ConvProblem from the
user's arguments with one of its constructors (`conv2d`, `conv1d`, `conv3d`, `transpose`,
`depthwise`), which are the package's one argument-cleaning path; everything below them
takes the problem. Bound to shapes (`bind`), it gives the core's geometry (`geometry`,
`axes`), the dilated filter extent (`extent`) and the planner's plans (`plan`).

The constructors take the package's own options (`tf_largeconv._options.OPTIONS`) by
keyword and clean them; a problem carries each as a field of the same name, holding the op
attribute's value.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv._options import OPTIONS
from tf_largeconv._options import clean_options

_CORE = _loader.core()

# The ways a problem is built; all but 'conv3d' run as a 2-D convolution.
KINDS = ("conv2d", "conv1d", "conv3d", "transpose", "depthwise")


def dilated_extent(size: int, dilation: int) -> int:
  """The input rows (or columns) one output reads: the dilated filter's extent."""
  return (size - 1) * dilation + 1


# One spatial axis of a bound problem, in data_format order: input size, filter size,
# stride, dilation, output size, padding before and after, dilated filter extent.
Axis = collections.namedtuple(
  "Axis", ["size", "kernel", "stride", "dilation", "out", "pad_before", "pad_after", "extent"]
)


def _shape(value: Any, name: str) -> tuple[int | None, ...]:
  """A shape (list, tuple, array or TensorShape; None entries unknown) as a tuple."""
  if isinstance(value, tf.TensorShape):
    value = value.as_list()
  try:
    return tuple(None if v is None else int(v) for v in value)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a list of ints, got {name}={value!r}") from None


@dataclasses.dataclass(frozen=True)
class ConvProblem:
  """A convolution's cleaned arguments (op attributes in data_format order, tuples) and,
  once bound, its input and filter shapes (as the 2-D or 3-D op takes them).

  Hashable: a problem without shapes is the key of the routing and kernel caches.
  """

  kind: str
  strides: tuple[int, ...]
  padding: str
  explicit_paddings: tuple[int, ...]
  data_format: str
  dilations: tuple[int, ...]
  # The OPTIONS, as the op's attributes hold them.
  algorithm: str = "auto"
  workspace_limit: int = -1
  keep_memory: bool = True
  dtype: tf.DType | None = None
  input_shape: tuple[int | None, ...] | None = None
  filter_shape: tuple[int | None, ...] | None = None

  # Building: the one argument-cleaning path.

  @classmethod
  def conv2d(
    cls, strides: Any, padding: Any, data_format: str | None = "NHWC", *args: Any, **kwargs: Any
  ) -> ConvProblem:
    """tf.nn.conv2d's arguments (strides/dilations: an int or 1, 2 or 4 ints; padding:
    'SAME', 'VALID' or four [before, after] pairs; data_format None means NHWC), then
    dilations, and by keyword `dtype` and the `OPTIONS`."""
    return cls._build(kwargs.pop("kind", "conv2d"), strides, padding, data_format, *args, **kwargs)

  @classmethod
  def _build(
    cls,
    kind: str,
    strides: Any,
    padding: Any,
    data_format: str | None,
    dilations: Any = None,
    *,
    dtype: Any = None,
    **options: Any,
  ) -> ConvProblem:
    """The problem of a kind's strides, padding, data_format and dilations (as tf.nn.conv3d
    takes them for 'conv3d', as tf.nn.conv2d for the others), each cleaned, its options
    cleaned and, given a dtype, checked for it."""
    clean = _args.window_3d if kind == "conv3d" else _args.window_2d
    window = clean(strides, padding, data_format, dilations)
    problem = cls(kind, *window, **clean_options(options))
    return problem if dtype is None else problem.for_dtype(tf.as_dtype(dtype))

  @classmethod
  def transpose(cls, strides: Any, padding: Any, *args: Any, **kwargs: Any) -> ConvProblem:
    """conv2d_transpose's arguments: the problem of the conv2d it transposes."""
    return cls.conv2d(strides, padding, *args, kind="transpose", **kwargs)

  @classmethod
  def depthwise(
    cls, strides: Any, padding: Any, data_format: str | None = None, *args: Any, **kwargs: Any
  ) -> ConvProblem:
    """tf.nn.depthwise_conv2d's arguments: a conv2d with one group per input channel,
    floating dtypes only; `bind` takes its filter [h, w, in_channels, multiplier]."""
    return cls.conv2d(strides, padding, data_format, *args, kind="depthwise", **kwargs)

  @classmethod
  def conv1d(
    cls,
    stride: Any,
    padding: Any,
    data_format: str | None = "NWC",
    dilations: Any = None,
    **kwargs: Any,
  ) -> ConvProblem:
    """tf.nn.conv1d's arguments (stride/dilations: an int or 1 or 3 ints; padding beyond
    TF's: one [before, after] pair for the width, or three): the conv2d of height 1 it
    runs as; `bind` takes the 1-D shapes."""
    if data_format is None:
      data_format = "NWC"
    if not isinstance(data_format, str) or data_format.upper() not in _args.FORMATS_1D:
      raise ValueError(
        "data_format must be 'NWC' or 'NCW' (or TensorFlow's aliases 'NHWC' / "
        f"'NCHW'), got data_format={data_format!r}"
      )
    fmt = _args.FORMATS_1D[data_format.upper()]
    return cls.conv2d(
      _args.window_1d(stride, "stride", fmt),
      _args.padding_1d(padding, fmt),
      fmt,
      _args.window_1d(dilations, "dilations", fmt),
      kind="conv1d",
      **kwargs,
    )

  @classmethod
  def conv3d(
    cls, strides: Any, padding: Any, data_format: str | None = "NDHWC", *args: Any, **kwargs: Any
  ) -> ConvProblem:
    """tf.nn.conv3d's arguments (strides/dilations: 5 ints in data_format order; padding
    'SAME' or 'VALID'; data_format 'NDHWC' or 'NCDHW'), then dilations, and by keyword
    `dtype` and the `OPTIONS`."""
    return cls._build("conv3d", strides, padding, data_format, *args, **kwargs)

  @classmethod
  def from_attrs(cls, attrs: dict[str, Any]) -> ConvProblem:
    """The problem of an op's attributes (as `attrs()` gives them, or read from a graph's
    op): a 2-D one for 4 strides, a 3-D one for 5. An option it lacks (attributes
    written before the option existed) takes its default."""
    options = {o.name: o.public(attrs[o.name]) for o in OPTIONS if o.name in attrs}
    args = (attrs["strides"], attrs["padding"], attrs["data_format"], attrs["dilations"])
    if len(attrs["strides"]) == 5:
      return cls.conv3d(*args, **options)
    if attrs["padding"] == "EXPLICIT":
      ex = list(attrs["explicit_paddings"])
      args = (args[0], [ex[i : i + 2] for i in range(0, 8, 2)], *args[2:])
    return cls.conv2d(*args, **options)

  # Derived problems.

  def replace(self, **changes: Any) -> ConvProblem:
    """This problem with some fields changed (already cleaned values)."""
    return dataclasses.replace(self, **changes)

  def resolved(self) -> ConvProblem:
    """The algorithm the call runs under the current context (`_args.resolve_algorithm`)."""
    algorithm = _args.resolve_algorithm(self.algorithm)
    return self if algorithm == self.algorithm else self.replace(algorithm=algorithm)

  def for_dtype(self, dtype: tf.DType, name: str = "input") -> ConvProblem:
    """This problem for operands of `dtype`, checked: TypeError naming `name` for a dtype
    the ops (or, depthwise, tf.nn.depthwise_conv2d) do not take, ValueError for an
    algorithm that cannot compute it."""
    _args.check_dtype(name, dtype, _args.FLOAT_DTYPES if self.kind == "depthwise" else _args.DTYPES)
    if not (self.kind == "conv3d" and self.algorithm in ("tf", _args.PORTABLE)):
      _args.check_algorithm(self.algorithm, dtype)  # tf.nn.conv3d checks its own
    return self if dtype == self.dtype else self.replace(dtype=dtype)

  def unbound(self) -> ConvProblem:
    """The problem without shapes or dtype: a cache key for its arguments alone."""
    if self.input_shape is None and self.filter_shape is None and self.dtype is None:
      return self
    return self.replace(input_shape=None, filter_shape=None, dtype=None)

  def bind(self, input_shape: Any, filter_shape: Any) -> ConvProblem:
    """The problem with its shapes, given as its kind's function takes them (conv1d: the
    1-D shapes, with extra batch dimensions, or those of its height-1 conv2d; depthwise:
    [h, w, in_channels, multiplier]; None for unknown sizes) and held as the 2-D or 3-D op
    takes them."""
    x, f = _shape(input_shape, "input_shape"), _shape(filter_shape, "filter_shape")
    if self.kind == "conv1d" and len(f) != 4:  # 4 entries: the height-1 conv2d's own
      if len(x) < 3 or len(f) != 3:
        raise ValueError(
          "conv1d needs an input shape batch_shape + [width, channels] (NWC) or batch_shape + "
          f"[channels, width] (NCW) and a filter shape [width, in_channels / groups, "
          f"out_channels], got {list(x)} and {list(f)}"
        )
      at = len(x) - (2 if self.data_format == "NHWC" else 1)
      x, f = x[:at] + (1,) + x[at:], (1,) + f
    elif self.kind == "depthwise" and len(f) == 4:
      grouped = None if f[2] is None or f[3] is None else f[2] * f[3]
      f = (f[0], f[1], 1, grouped)
    return self.replace(input_shape=x, filter_shape=f)

  # The op's view.

  @property
  def spatial_rank(self) -> int:
    return len(self.strides) - 2

  @property
  def channel_axis(self) -> int:
    """The channels' position in the op's input (1 channels first, last otherwise)."""
    return 1 if self.data_format[1] == "C" else self.spatial_rank + 1

  @property
  def spatial_axes(self) -> tuple[int, ...]:
    """The spatial dimensions' positions in the op's input, in data_format order."""
    first = 2 if self.channel_axis == 1 else 1
    return tuple(range(first, first + self.spatial_rank))

  @property
  def workspace_bound(self) -> int:
    """The bytes each pass may take as workspace: the limit, or the core's default."""
    return _CORE.DEFAULT_WORKSPACE_LIMIT if self.workspace_limit < 0 else self.workspace_limit

  def attrs(self) -> dict[str, Any]:
    """The op's attributes (lists, as the generated op wrappers take them)."""
    attrs: dict[str, Any] = dict(
      strides=list(self.strides),
      padding=self.padding,
      explicit_paddings=list(self.explicit_paddings),
      data_format=self.data_format,
      dilations=list(self.dilations),
      **{o.name: getattr(self, o.name) for o in OPTIONS},
    )
    if self.spatial_rank == 3:
      del attrs["explicit_paddings"]
    return attrs

  def options(self) -> dict[str, Any]:
    """The `OPTIONS` in their public form, as keyword arguments of the public functions."""
    return {o.name: o.public(getattr(self, o.name)) for o in OPTIONS}

  def kwargs(self) -> dict[str, Any]:
    """The problem as keyword arguments of the package's public functions."""
    return dict(self.tf_kwargs(), **self.options())

  def tf_kwargs(self) -> dict[str, Any]:
    """strides, padding, data_format and dilations as tf.nn's functions take them."""
    return dict(
      strides=list(self.strides),
      padding=self.tf_padding(),
      data_format=self.data_format,
      dilations=list(self.dilations),
    )

  def tf_padding(self) -> str | list[list[int]]:
    """padding as tf.nn's functions take it: the string, or the explicit pairs."""
    if self.padding != "EXPLICIT":
      return self.padding
    ex = self.explicit_paddings
    return [list(ex[i : i + 2]) for i in range(0, len(ex), 2)]

  # The geometry of the bound shapes.

  def shapes(self) -> tuple[tuple[int | None, ...], tuple[int | None, ...]]:
    """The bound (input shape, filter shape); ValueError for a problem without them."""
    if self.input_shape is None or self.filter_shape is None:
      raise ValueError("the problem has no shapes: bind(input_shape, filter_shape) first")
    return self.input_shape, self.filter_shape

  def _core_args(self, input_shape: Any = None) -> tuple[Any, ...]:
    x, f = (list(v) for v in self.shapes())
    if input_shape is not None:
      x = list(input_shape)
    if None in x or None in f:
      raise ValueError(f"the geometry needs known shapes, got input {x} and filter {f}")
    if self.spatial_rank == 3:
      return (x, f, list(self.strides), self.padding, self.data_format, list(self.dilations))
    explicit, dilations = list(self.explicit_paddings), list(self.dilations)
    return (x, f, list(self.strides), self.padding, explicit, self.data_format, dilations)

  def geometry(self) -> dict[str, Any]:
    """The core's geometry of the bound shapes (ConvGeometry or Conv3dGeometry as a dict;
    `output_shape` in data_format order, with the input's extra leading batch dimensions,
    which the rest plans as one batch of their product). Raises the core's ValueError or
    NotImplementedError for shapes and arguments that do not fit together."""
    n, x = self.spatial_rank + 1, self.shapes()[0]
    merged, batch = None, [v for v in x[:-n] if v is not None]
    if len(x) > n + 1 and len(batch) == len(x) - n:
      merged = (math.prod(batch),) + x[-n:]
    args = self._core_args(merged)
    g = _CORE.geometry3d(*args) if self.spatial_rank == 3 else _CORE.geometry(*args)
    if merged is not None:
      g["output_shape"] = tuple(x[:-n]) + tuple(g["output_shape"][1:])
    return g

  def extent(self, axis: int) -> int:
    """The dilated filter extent along spatial axis `axis` (0: the first in data_format
    order, height in 2-D), from the bound filter shape."""
    size = None if self.filter_shape is None else self.filter_shape[axis]
    if size is None:
      raise ValueError(f"extent({axis}) needs the filter's size there, got {self.filter_shape}")
    return dilated_extent(size, self.dilations[self.spatial_axes[axis]])

  def axes(self) -> list[Axis]:
    """Each spatial axis's geometry, in data_format order (from `geometry`)."""
    g = self.geometry()
    x, f = self.shapes()
    extra = len(x) - (self.spatial_rank + 2)  # leading batch dimensions
    out = [g["output_shape"][extra + i] for i in self.spatial_axes]
    if self.spatial_rank == 3:
      before, after = g["pad_before"], g["pad_after"]
    else:
      before, after = (g["pad_top"], g["pad_left"]), (g["pad_bottom"], g["pad_right"])
    return [
      Axis(
        x[extra + i],
        f[k],
        self.strides[i],
        self.dilations[i],
        out[k],
        before[k],
        after[k],
        self.extent(k),
      )
      for k, i in enumerate(self.spatial_axes)
    ]

  def static_output_shape(self) -> tuple[int | None, ...]:
    """The output shape where the bound input shape (one batch dimension) may have unknown
    (None) sizes, which stay unknown (output sizes are independent per dimension); the
    filter must be known."""
    x, f = self.shapes()
    shape, c = list(x), self.channel_axis
    filters = [int(v) for v in f]  # type: ignore[arg-type]
    # An unknown size is computed with a stand-in as large as the largest dilated filter
    # (valid for any padding), then reported unknown again.
    stand_in = max(self.extent(k) for k in range(self.spatial_rank))
    probe = [
      (filters[self.spatial_rank] if i == c else stand_in if i in self.spatial_axes else 1)
      if v is None
      else v
      for i, v in enumerate(shape)
    ]
    out = list(self.replace(input_shape=tuple(probe)).geometry()["output_shape"])
    return tuple(None if v is None and i != c else out[i] for i, v in enumerate(shape))

  def plan(self, input_shape: Any = None, **kwargs: Any) -> list[dict[str, Any]]:
    """The core planner's passes (its dicts) for the bound shapes, or for `input_shape`
    with the bound filter; `kwargs` as `_core.plan` / `_core.plan3d` take them (the
    algorithm and workspace limit default to the problem's)."""
    kwargs.setdefault("algorithm", self.algorithm)
    kwargs.setdefault("workspace_limit", self.workspace_limit)
    if self.spatial_rank == 3:
      return _CORE.plan3d(*self._core_args(input_shape), **kwargs)
    return _CORE.plan(*self._core_args(input_shape), **kwargs)

  def cuda_plan(self, input_shape: Any, algorithm: str, dtype_name: str) -> list[dict[str, Any]]:
    """The CUDA planner's passes for `input_shape` and the bound filter (2-D)."""
    args = self._core_args(input_shape)
    return _CORE.cuda_plan(*args, algorithm, self.workspace_limit, dtype_name)
