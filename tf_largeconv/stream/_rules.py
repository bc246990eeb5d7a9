"""How each kind of layer streams: which input range an output range reads, and how the
output range is computed from that input window.

Every spatial axis is handled alike. For one layer and one axis, an output range [a, b)
needs the input range `needs(a, b)`, which may reach past the input's edges: the part
outside is the layer's own padding (zeros for a convolution, the lowest value for max
pooling). The runner hands `run` the part of that range inside the input and the number of
padded rows on each side; `run` returns exactly the output range.

Kinds of rule:
- `Pointwise`: each output pixel from the same input pixel (activations, normalization over
  channels, 1x1 dense layers, merges of branches).
- `Sliding`: convolutions and pooling (any kernel, stride, dilation, padding): the layer's
  op is given the window's padded rows as explicit padding (`_windowed`), or, where the op
  cannot take it, the layer is run with padding 'valid' on the window padded by hand; either
  way a window that reaches an edge of the image sees exactly the padding the whole image
  would.
- `Shift`: ZeroPadding and Cropping.
- `Upsample`: UpSampling, nearest (no halo) or bilinear (one input pixel of halo, which the
  result drops except at the image's edges, where the window's edge is the image's).
- `Transpose`: transposed convolutions, run with padding 'valid' on a zero-extended window.
- `Reduce`: global average or max pooling, reduced across tiles by the runner.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import tensorflow as tf

from tf_largeconv._problem import ConvProblem

Call = Callable[..., tf.Tensor]


def slide_axis(
  n: int, kernel: int, stride: int, dilation: int, padding: str | tuple[int, int]
) -> tuple[int, int, int]:
  """(output size, padding before, kernel extent) of a sliding window along one axis of
  `n` pixels, from the package's one geometry (`ConvProblem`, as every op of the package).

  `padding` is 'valid', 'same', 'causal' (all padding before) or explicit (before, after).
  Raises ValueError when the window is larger than the padded axis."""
  shapes = ([1, n, 1], [kernel, 1, 1])
  if padding == "causal":
    extent = ConvProblem.conv1d(stride, "VALID", "NWC", dilation).bind(*shapes).extent(1)
    padding = (extent - 1, 0)
  pads = [list(padding)] if isinstance(padding, tuple) else padding.upper()
  (axis,) = ConvProblem.conv1d(stride, pads, "NWC", dilation).bind(*shapes).axes()[1:]
  return axis.out, axis.pad_before, axis.extent


def _pad(x: tf.Tensor, pads: Sequence[tuple[int, int]], value: float) -> tf.Tensor:
  if not any(p for pair in pads for p in pair):
    return x
  return tf.pad(x, [[0, 0], *[list(p) for p in pads], [0, 0]], constant_values=value)


def crop(x: tf.Tensor, starts: Sequence[int], lengths: Sequence[int]) -> tf.Tensor:
  """x's spatial window of `lengths` from `starts` (x itself when that is all of it).

  Its gradient pads the window's gradient with zeros to x's shape: the same tensor as
  TensorFlow's gradient of a slice (StridedSliceGrad), whose CPU kernel takes about 25
  times as long (0.24 s against 0.008 s for a 600^2 x 32 float32 window)."""
  if all(s == 0 and n == m for s, n, m in zip(starts, lengths, x.shape[1:-1])):
    return x
  index = (slice(None),) + tuple(slice(s, s + n) for s, n in zip(starts, lengths)) + (Ellipsis,)
  sizes = x.shape[1:-1]
  if any(m is None for m in sizes):
    return x[index]
  pads = [[0, 0], *[[s, m - s - n] for s, n, m in zip(starts, lengths, sizes)], [0, 0]]

  @tf.custom_gradient
  def window(t: tf.Tensor) -> Any:
    return t[index], lambda dy: tf.pad(dy, pads)

  return window(x)


class Span:
  """One axis of one step of a tile: the output range [a, b) and the input range [lo, hi)
  it needs, of which [lo_in, hi_in) lies inside the input (the rest is padding). A range
  wholly past an edge has an empty [lo_in, hi_in) at that edge and is all padding."""

  __slots__ = ("a", "b", "lo", "hi", "lo_in", "hi_in")

  def __init__(self, a: int, b: int, lo: int, hi: int, n_in: int) -> None:
    self.a, self.b, self.lo, self.hi = a, b, lo, hi
    self.lo_in, self.hi_in = clip(lo, hi, n_in)

  @property
  def pads(self) -> tuple[int, int]:
    """Padded pixels before and after the part inside the input (never negative)."""
    before = min(max(self.lo_in - self.lo, 0), self.hi - self.lo)
    return before, self.hi - self.lo - before - (self.hi_in - self.lo_in)


def clip(lo: int, hi: int, n: int) -> tuple[int, int]:
  """The part of [lo, hi) inside [0, n): empty (at the nearer edge) when none is."""
  lo_in = min(max(lo, 0), n)
  return lo_in, max(min(hi, n), lo_in)


class Rule:
  """The streaming rule of one layer. `bind` fixes the geometry for the input sizes and
  returns the output sizes; `needs` and `run` then work per tile."""

  kind = "rule"
  spatial_out = True

  def bind(self, sizes: Sequence[int]) -> tuple[int, ...]:
    return tuple(sizes)

  def needs(self, axis: int, a: int, b: int) -> tuple[int, int]:
    return a, b

  def scale(self, axis: int) -> Fraction:
    """Output pixels per input pixel along `axis`, away from the edges."""
    return Fraction(1)

  def run(self, inputs: list[tf.Tensor], spans: Sequence[Span]) -> tf.Tensor:
    raise NotImplementedError


class Pointwise(Rule):
  """Each output pixel from the same pixel of every input."""

  kind = "pointwise"

  def __init__(self, call: Call) -> None:
    self.call = call

  def run(self, inputs: list[tf.Tensor], spans: Sequence[Span]) -> tf.Tensor:
    return self.call(*inputs)


class _Kernel(Rule):
  """A rule whose layer has a kernel: `call` runs the layer (padding 'valid') with
  `kernel` taps per axis, `strides` and `dilations`."""

  def __init__(
    self, call: Call, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int]
  ) -> None:
    self.call, self.kernel, self.strides, self.dilations = call, kernel, strides, dilations

  def extent(self, axis: int) -> int:
    return (self.kernel[axis] - 1) * self.dilations[axis] + 1


class Sliding(_Kernel):
  """A window of `kernel` taps per axis, `strides`, `dilations` and `padding` ('valid',
  'same', 'causal' or explicit pairs per axis). With `explicit`, `call(x, pads)` runs it on
  `x` padded by `pads` ((before, after) per axis); else `call(x)` runs it with padding
  'valid' on `x` padded by hand with `pad_value`. With `average`, the padded taps are left
  out of each mean (average pooling with padding 'same')."""

  kind = "sliding"

  def __init__(
    self,
    call: Call,
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    padding: str | Sequence[tuple[int, int]],
    pad_value: float = 0.0,
    average: bool = False,
    explicit: bool = False,
  ) -> None:
    super().__init__(call, kernel, strides, dilations)
    self.padding = padding
    self.pad_value, self.average, self.explicit = pad_value, average, explicit
    # Whether an explicit call pads a copy under a gradient tape (`_windowed.taped`),
    # whether it runs the package's op there (`_windowed.package_under_tape`), and whether it
    # runs as one fused function outside it (`_windowed.fused_outside_tape`).
    self.taped_copy = False
    self.package_under_tape = False
    self.fused = False
    self.geometry: list[tuple[int, int, int]] = []

  def _padding(self, axis: int) -> str | tuple[int, int]:
    if isinstance(self.padding, str):
      return self.padding
    before, after = self.padding[axis]
    return int(before), int(after)

  def bind(self, sizes: Sequence[int]) -> tuple[int, ...]:
    self.geometry = [
      slide_axis(n, k, s, d, self._padding(axis))
      for axis, (n, k, s, d) in enumerate(zip(sizes, self.kernel, self.strides, self.dilations))
    ]
    return tuple(g[0] for g in self.geometry)

  def needs(self, axis: int, a: int, b: int) -> tuple[int, int]:
    _, before, extent = self.geometry[axis]
    s = self.strides[axis]
    return a * s - before, (b - 1) * s - before + extent

  def scale(self, axis: int) -> Fraction:
    return Fraction(1, self.strides[axis])

  def run(self, inputs: list[tf.Tensor], spans: Sequence[Span]) -> tf.Tensor:
    pads = [sp.pads for sp in spans]
    if self.explicit:
      return self.call(inputs[0], pads)
    y = self.call(_pad(inputs[0], pads, self.pad_value))
    if self.average and any(p for pair in pads for p in pair):
      shape = [1] + [sp.hi_in - sp.lo_in for sp in spans] + [1]
      ones = tf.ones(shape, inputs[0].dtype)
      y = y / self.call(_pad(ones, pads, 0.0))
    return y


class Shift(Rule):
  """ZeroPadding (`before` > 0 rows of zeros first) and Cropping (`before` < 0): output
  pixel i is input pixel i - before, zero outside the input."""

  kind = "shift"

  def __init__(self, before: Sequence[int], after: Sequence[int]) -> None:
    self.before, self.after = before, after

  def bind(self, sizes: Sequence[int]) -> tuple[int, ...]:
    out = tuple(n + b + a for n, b, a in zip(sizes, self.before, self.after))
    if min(out) <= 0:
      raise ValueError(f"crops the input of spatial size {tuple(sizes)} to nothing")
    return out

  def needs(self, axis: int, a: int, b: int) -> tuple[int, int]:
    return a - self.before[axis], b - self.before[axis]

  def run(self, inputs: list[tf.Tensor], spans: Sequence[Span]) -> tf.Tensor:
    return _pad(inputs[0], [sp.pads for sp in spans], 0.0)


class Upsample(Rule):
  """Repeats each pixel `factors` times (nearest) or interpolates (bilinear, `halo` 1);
  `call` is the layer itself, run on the window."""

  kind = "upsample"

  def __init__(
    self, call: Call, factors: Sequence[int], halo: int, window: Call | None = None
  ) -> None:
    self.call, self.factors, self.halo = call, factors, halo
    # window(x, starts, lengths): only the wanted output pixels, or None to run `call`.
    self.window = window

  def bind(self, sizes: Sequence[int]) -> tuple[int, ...]:
    return tuple(n * f for n, f in zip(sizes, self.factors))

  def needs(self, axis: int, a: int, b: int) -> tuple[int, int]:
    f = self.factors[axis]
    return a // f - self.halo, (b - 1) // f + 1 + self.halo

  def scale(self, axis: int) -> Fraction:
    return Fraction(self.factors[axis])

  def run(self, inputs: list[tf.Tensor], spans: Sequence[Span]) -> tf.Tensor:
    starts = [sp.a - sp.lo_in * f for sp, f in zip(spans, self.factors)]
    lengths = [sp.b - sp.a for sp in spans]
    y = self.window(inputs[0], starts, lengths) if self.window is not None else None
    return y if y is not None else crop(self.call(inputs[0]), starts, lengths)


class Transpose(_Kernel):
  """A transposed convolution: input pixel x reaches output pixels x * stride + t *
  dilation - before, for taps t. `call` is the layer with padding 'valid' (output starting
  at x * stride); `out_size(axis, n)` is the layer's own output size."""

  kind = "transpose"

  def __init__(
    self,
    call: Call,
    kernel: Sequence[int],
    strides: Sequence[int],
    dilations: Sequence[int],
    padding: str,
    out_size: Callable[[Sequence[int]], Sequence[int]],
  ) -> None:
    super().__init__(call, kernel, strides, dilations)
    self.padding, self.out_size = padding, out_size
    self.before: list[int] = []

  def bind(self, sizes: Sequence[int]) -> tuple[int, ...]:
    out = tuple(int(v) for v in self.out_size(sizes))
    self.before = []
    for axis, m in enumerate(out):
      if self.padding == "valid":
        self.before.append(0)
      else:  # TensorFlow pads as the forward convolution from `m` pixels would
        k, s, d = self.kernel[axis], self.strides[axis], self.dilations[axis]
        self.before.append(slide_axis(m, k, s, d, "same")[1])
    return out

  def needs(self, axis: int, a: int, b: int) -> tuple[int, int]:
    s, before, extent = self.strides[axis], self.before[axis], self.extent(axis)
    first = min(-(-(a + before - extent + 1) // s), (a + before) // s)
    return first, (b - 1 + before) // s + 1

  def scale(self, axis: int) -> Fraction:
    return Fraction(self.strides[axis])

  def run(self, inputs: list[tf.Tensor], spans: Sequence[Span]) -> tf.Tensor:
    y = self.call(_pad(inputs[0], [sp.pads for sp in spans], 0.0))
    starts = [sp.a - (sp.lo * s - bf) for sp, s, bf in zip(spans, self.strides, self.before)]
    return crop(y, starts, [sp.b - sp.a for sp in spans])


class Reduce(Rule):
  """Global average ('mean') or max pooling over the spatial axes: the runner reduces each
  tile and combines the tiles."""

  kind = "reduce"
  spatial_out = False

  def __init__(self, how: str, keepdims: bool) -> None:
    self.how, self.keepdims = how, keepdims

  def partial(self, x: tf.Tensor) -> tf.Tensor:
    axes = list(range(1, len(x.shape) - 1))
    if self.how == "max":
      return tf.reduce_max(x, axis=axes)
    return tf.reduce_sum(tf.cast(x, tf.float64), axis=axes)

  def combine(self, parts: list[tf.Tensor], count: int, dtype: tf.DType, rank: int) -> tf.Tensor:
    if self.how == "max":
      y = tf.reduce_max(tf.stack(parts), axis=0)
    else:
      y = tf.cast(tf.add_n(parts) / float(count), dtype)
    if self.keepdims:
      y = tf.reshape(y, [tf.shape(y)[0]] + [1] * rank + [y.shape[-1]])
    return y
