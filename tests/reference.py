"""Independent float64 numpy oracle for Conv2D and its gradients (grouped, strided,
dilated, any padding, NHWC/NCHW). Written from the definition, sharing no code with the
package, so it can check the package's geometry as well as its arithmetic."""

import numpy as np


def _same_pads(size, k, s, d):
  eff = (k - 1) * d + 1
  out = -(-size // s)
  total = max((out - 1) * s + eff - size, 0)
  return total // 2, total - total // 2


def pads(x_hw, f_hw, strides, dilations, padding):
  """((top, bottom), (left, right)) for 'SAME', 'VALID' or explicit ((t, b), (l, r))."""
  if padding == "SAME":
    return tuple(_same_pads(x_hw[i], f_hw[i], strides[i], dilations[i]) for i in range(2))
  if padding == "VALID":
    return ((0, 0), (0, 0))
  return tuple(tuple(p) for p in padding)


def _nhwc(a, data_format):
  return a if data_format == "NHWC" else np.transpose(a, (0, 2, 3, 1))


def _back(a, data_format):
  return a if data_format == "NHWC" else np.transpose(a, (0, 3, 1, 2))


class Conv:
  """One convolution problem: x/w/dy in float64, spatial strides/dilations as pairs."""

  def __init__(self, x_shape, w_shape, strides=(1, 1), padding="VALID", dilations=(1, 1),
               data_format="NHWC"):
    self.fmt = data_format
    xs = x_shape if data_format == "NHWC" else (x_shape[0], x_shape[2], x_shape[3], x_shape[1])
    self.n, self.h, self.w, self.c = xs
    self.kh, self.kw, self.ci, self.co = w_shape
    self.groups = self.c // self.ci
    self.s, self.d = tuple(strides), tuple(dilations)
    (self.pt, self.pb), (self.pl, self.pr) = pads((self.h, self.w), (self.kh, self.kw),
                                                  self.s, self.d, padding)
    eh = (self.kh - 1) * self.d[0] + 1
    ew = (self.kw - 1) * self.d[1] + 1
    self.oh = (self.h + self.pt + self.pb - eh) // self.s[0] + 1
    self.ow = (self.w + self.pl + self.pr - ew) // self.s[1] + 1

  def _window(self, kh, kw):
    hs = slice(kh * self.d[0], kh * self.d[0] + (self.oh - 1) * self.s[0] + 1, self.s[0])
    ws = slice(kw * self.d[1], kw * self.d[1] + (self.ow - 1) * self.s[1] + 1, self.s[1])
    return hs, ws

  def _groups(self):
    cog = self.co // self.groups
    for g in range(self.groups):
      yield slice(g * self.ci, (g + 1) * self.ci), slice(g * cog, (g + 1) * cog)

  def output_shape(self):
    s = (self.n, self.oh, self.ow, self.co)
    return s if self.fmt == "NHWC" else (s[0], s[3], s[1], s[2])

  def forward(self, x, w):
    x = _nhwc(np.asarray(x, np.float64), self.fmt)
    w = np.asarray(w, np.float64)
    xp = np.pad(x, ((0, 0), (self.pt, self.pb), (self.pl, self.pr), (0, 0)))
    y = np.zeros((self.n, self.oh, self.ow, self.co))
    for kh in range(self.kh):
      for kw in range(self.kw):
        hs, ws = self._window(kh, kw)
        patch = xp[:, hs, ws, :]
        for ci, co in self._groups():
          y[..., co] += np.einsum("nhwc,co->nhwo", patch[..., ci], w[kh, kw, :, co])
    return _back(y, self.fmt)

  def backprop_input(self, w, dy):
    w = np.asarray(w, np.float64)
    dy = _nhwc(np.asarray(dy, np.float64), self.fmt)
    dxp = np.zeros((self.n, self.h + self.pt + self.pb, self.w + self.pl + self.pr, self.c))
    for kh in range(self.kh):
      for kw in range(self.kw):
        hs, ws = self._window(kh, kw)
        for ci, co in self._groups():
          dxp[:, hs, ws, ci] += np.einsum("nhwo,co->nhwc", dy[..., co], w[kh, kw, :, co])
    dx = dxp[:, self.pt:self.pt + self.h, self.pl:self.pl + self.w, :]
    return _back(dx, self.fmt)

  def backprop_filter(self, x, dy):
    x = _nhwc(np.asarray(x, np.float64), self.fmt)
    dy = _nhwc(np.asarray(dy, np.float64), self.fmt)
    xp = np.pad(x, ((0, 0), (self.pt, self.pb), (self.pl, self.pr), (0, 0)))
    dw = np.zeros((self.kh, self.kw, self.ci, self.co))
    for kh in range(self.kh):
      for kw in range(self.kw):
        hs, ws = self._window(kh, kw)
        patch = xp[:, hs, ws, :]
        for ci, co in self._groups():
          dw[kh, kw, :, co] = np.einsum("nhwc,nhwo->co", patch[..., ci], dy[..., co])
    return dw


# Unit roundoff of each dtype's storage, and of the accumulator the kernels use.
STORE_EPS = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24,
             "float64": 2.0**-53}
ACC_EPS = {"float16": 2.0**-24, "bfloat16": 2.0**-24, "float32": 2.0**-24,
           "float64": 2.0**-53}


def tolerance(dtype_name, terms, magnitude, norm=0.0, transform_size=1):
  """Error bound per element.

  A direct sum of `terms` products whose absolute values sum to `magnitude` errs by at most
  one rounding on store plus a sqrt(n)-growth accumulation term, elementwise. An FFT
  computes every output from whole tiles, so its error is norm-wise instead: about
  u * log2(transform size) * |a|_2 * |b|_2 for the two operands (`norm`), spread over all
  elements (zero for the direct path, which passes norm=0).
  """
  elementwise = (STORE_EPS[dtype_name] +
                 4.0 * np.sqrt(max(terms, 1)) * ACC_EPS[dtype_name]) * magnitude
  fft = 8.0 * ACC_EPS[dtype_name] * np.log2(max(transform_size, 2)) * norm
  return elementwise + fft + 1e-300


def operand_norm(a, b):
  """|a|_2 * |b|_2, the scale of an FFT correlation's rounding error."""
  return float(np.linalg.norm(np.ravel(a)) * np.linalg.norm(np.ravel(b)))


def assert_close(got, want, dtype_name, terms, magnitude, what="result", norm=0.0,
                 transform_size=1):
  got = np.asarray(got, np.float64)
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
  tol = tolerance(dtype_name, terms, magnitude, norm, transform_size)
  err = np.abs(got - want)
  bad = err > tol
  assert not bad.any(), (
      f"{what}: {bad.sum()} of {bad.size} elements off; worst error "
      f"{err.max():.3e} vs tolerance {tol.flat[np.argmax(err)]:.3e}")
