"""An independent float64 numpy oracle of tf.nn.conv1d and its two gradients.

NWC throughout (callers transpose NCW); grouped when the filter's in-channels divide the
input's. Output o, tap k reads padded input position o * stride + k * dilation.
"""

import numpy as np

STORE_EPS = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}
ACC_EPS = {"float16": 2.0**-24, "bfloat16": 2.0**-24, "float32": 2.0**-24, "float64": 2.0**-53}


def pads(width, taps, stride, dilation, padding):
  """(before, after, out_width) of a 1-D convolution; padding 'SAME', 'VALID' or a pair."""
  extent = (taps - 1) * dilation + 1
  if padding == "VALID":
    before = after = 0
  elif padding == "SAME":
    out = -(-width // stride)
    total = max((out - 1) * stride + extent - width, 0)
    before, after = total // 2, total - total // 2
  else:
    before, after = padding
  out = max((width + before + after - extent) // stride + 1, 0)
  return before, after, out


class Conv1D:
  """conv1d of an input of shape x_shape (N, W, C) with a filter (K, C / G, O)."""

  def __init__(self, x_shape, w_shape, stride=1, padding="VALID", dilation=1):
    self.n, self.width, self.c = x_shape
    self.k, self.cig, self.co = w_shape
    self.groups = self.c // self.cig
    self.cog = self.co // self.groups
    self.stride, self.dilation = stride, dilation
    self.before, self.after, self.out = pads(self.width, self.k, stride, dilation, padding)

  def output_shape(self):
    return (self.n, self.out, self.co)

  def _taps(self, xp, k):
    """The padded input each output reads at tap k: (N, out, G, C / G)."""
    start = k * self.dilation
    cols = xp[:, start : start + (self.out - 1) * self.stride + 1 : self.stride, :]
    return cols.reshape(self.n, self.out, self.groups, self.cig)

  def _pad(self, x):
    return np.pad(np.asarray(x, np.float64), ((0, 0), (self.before, self.after), (0, 0)))

  def forward(self, x, w):
    xp = self._pad(x)
    w = np.asarray(w, np.float64).reshape(self.k, self.cig, self.groups, self.cog)
    y = np.zeros((self.n, self.out, self.groups, self.cog))
    if self.out:
      for k in range(self.k):
        y += np.einsum("nogi,igc->nogc", self._taps(xp, k), w[k])
    return y.reshape(self.n, self.out, self.co)

  def backprop_input(self, w, dy):
    w = np.asarray(w, np.float64).reshape(self.k, self.cig, self.groups, self.cog)
    dy = np.asarray(dy, np.float64).reshape(self.n, self.out, self.groups, self.cog)
    dxp = np.zeros((self.n, self.width + self.before + self.after, self.c))
    if self.out:
      for k in range(self.k):
        start = k * self.dilation
        dxp[:, start : start + (self.out - 1) * self.stride + 1 : self.stride, :] += np.einsum(
          "nogc,igc->nogi", dy, w[k]
        ).reshape(self.n, self.out, self.c)
    return dxp[:, self.before : self.before + self.width, :]

  def backprop_filter(self, x, dy):
    xp = self._pad(x)
    dy = np.asarray(dy, np.float64).reshape(self.n, self.out, self.groups, self.cog)
    dw = np.zeros((self.k, self.cig, self.groups, self.cog))
    if self.out:
      for k in range(self.k):
        dw[k] = np.einsum("nogi,nogc->igc", self._taps(xp, k), dy)
    return dw.reshape(self.k, self.cig, self.co)

  def terms(self, pass_name):
    """Products summed into one element of a pass's result."""
    if pass_name == "forward":
      return self.k * self.cig
    if pass_name == "backprop_input":
      return -(-self.k // self.stride) * self.cog
    return self.n * self.out


def assert_close(got, want, magnitude, dtype_name, terms, what):
  """`got` against the float64 oracle `want`: one rounding on store, plus an accumulation
  error (direct sums or FFT transforms) growing with sqrt(terms) and log(terms), relative
  to the largest magnitude (sum of |products|) of the result: FFT errors spread over a
  whole transform."""
  got = np.asarray(got, np.float64)
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
  scale = float(np.max(magnitude)) if magnitude.size else 0.0
  tol = (
    STORE_EPS[dtype_name] * np.abs(want)
    + 8.0 * ACC_EPS[dtype_name] * np.sqrt(max(terms, 1)) * np.log2(terms + 2) * scale
    + 1e-300
  )
  err = np.abs(got - want)
  bad = err > tol
  if bad.any():
    i = tuple(int(j) for j in np.unravel_index(np.argmax(err / tol), err.shape))
    raise AssertionError(
      f"{what}: {bad.sum()} of {bad.size} elements off; worst at {i}: got "
      f"{got[i]:.9g}, want {want[i]:.9g}, error {err[i]:.3e} vs tolerance "
      f"{tol[i]:.3e}"
    )


def check_passes(conv, dtype_name, x, w, dy, y, dx, dw, what=""):
  """All three passes of `conv` against the oracle."""
  ax, aw, ady = (
    np.abs(np.asarray(x, np.float64)),
    np.abs(np.asarray(w, np.float64)),
    np.abs(np.asarray(dy, np.float64)),
  )
  for name, got, want, mag in (
    ("forward", y, conv.forward(x, w), conv.forward(ax, aw)),
    ("backprop_input", dx, conv.backprop_input(w, dy), conv.backprop_input(aw, ady)),
    ("backprop_filter", dw, conv.backprop_filter(x, dy), conv.backprop_filter(ax, ady)),
  ):
    assert_close(got, want, mag, dtype_name, conv.terms(name), f"{what} {name}")
