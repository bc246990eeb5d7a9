"""Independent float64 numpy oracle for Conv2D and its gradients (grouped, strided,
dilated, any padding, NHWC/NCHW). Written from the definition, sharing no code with the
package, so it can check the package's geometry as well as its arithmetic. With
dtype=np.int64 it is the exact oracle of int32 convolutions: int64 arithmetic wraps modulo
2^64, so the result cast to int32 is the exact sum modulo 2^32, as TensorFlow's int32
kernel gives it."""

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

  def __init__(
    self,
    x_shape,
    w_shape,
    strides=(1, 1),
    padding="VALID",
    dilations=(1, 1),
    data_format="NHWC",
    dtype=np.float64,
  ):
    self.fmt = data_format
    self.dtype = dtype
    xs = x_shape if data_format == "NHWC" else (x_shape[0], x_shape[2], x_shape[3], x_shape[1])
    self.n, self.h, self.w, self.c = xs
    self.kh, self.kw, self.ci, self.co = w_shape
    self.groups = self.c // self.ci
    self.s, self.d = tuple(strides), tuple(dilations)
    (self.pt, self.pb), (self.pl, self.pr) = pads(
      (self.h, self.w), (self.kh, self.kw), self.s, self.d, padding
    )
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

  def check(self, pass_name, got, a, b, dtype_name, fft_size=None, what=None):
    """Checks one pass's result `got` for operands (a, b): see `PassCheck.check`."""
    return PassCheck(self, pass_name, a, b).check(got, dtype_name, fft_size, what)

  def check_passes(self, dtype_name, fft, x, w, dy, y=None, dx=None, dw=None, what=""):
    """Checks whichever of y, dx, dw is given; `fft` maps each pass to its transform size
    or None (see `planned_fft`)."""
    for name, got, a, b in (
      ("forward", y, x, w),
      ("backprop_input", dx, w, dy),
      ("backprop_filter", dw, x, dy),
    ):
      if got is not None:
        self.check(name, got, a, b, dtype_name, fft[name], f"{what}{name}")

  def output_shape(self):
    s = (self.n, self.oh, self.ow, self.co)
    return s if self.fmt == "NHWC" else (s[0], s[3], s[1], s[2])

  def forward(self, x, w):
    x = _nhwc(np.asarray(x, self.dtype), self.fmt)
    w = np.asarray(w, self.dtype)
    xp = np.pad(x, ((0, 0), (self.pt, self.pb), (self.pl, self.pr), (0, 0)))
    y = np.zeros((self.n, self.oh, self.ow, self.co), self.dtype)
    for kh in range(self.kh):
      for kw in range(self.kw):
        hs, ws = self._window(kh, kw)
        patch = xp[:, hs, ws, :]
        for ci, co in self._groups():
          y[..., co] += np.einsum("nhwc,co->nhwo", patch[..., ci], w[kh, kw, :, co])
    return _back(y, self.fmt)

  def backprop_input(self, w, dy):
    w = np.asarray(w, self.dtype)
    dy = _nhwc(np.asarray(dy, self.dtype), self.fmt)
    dxp = np.zeros(
      (self.n, self.h + self.pt + self.pb, self.w + self.pl + self.pr, self.c), self.dtype
    )
    for kh in range(self.kh):
      for kw in range(self.kw):
        hs, ws = self._window(kh, kw)
        for ci, co in self._groups():
          dxp[:, hs, ws, ci] += np.einsum("nhwo,co->nhwc", dy[..., co], w[kh, kw, :, co])
    dx = dxp[:, self.pt : self.pt + self.h, self.pl : self.pl + self.w, :]
    return _back(dx, self.fmt)

  def backprop_filter(self, x, dy):
    x = _nhwc(np.asarray(x, self.dtype), self.fmt)
    dy = _nhwc(np.asarray(dy, self.dtype), self.fmt)
    xp = np.pad(x, ((0, 0), (self.pt, self.pb), (self.pl, self.pr), (0, 0)))
    dw = np.zeros((self.kh, self.kw, self.ci, self.co), self.dtype)
    for kh in range(self.kh):
      for kw in range(self.kw):
        hs, ws = self._window(kh, kw)
        patch = xp[:, hs, ws, :]
        for ci, co in self._groups():
          dw[kh, kw, :, co] = np.einsum("nhwc,nhwo->co", patch[..., ci], dy[..., co])
    return dw


# Unit roundoff of each dtype's storage, and of the accumulator the kernels use.
STORE_EPS = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}
# Half the spacing of the subnormals: the absolute rounding error of a store below the
# normal range, where STORE_EPS * |value| no longer bounds it.
STORE_TINY = {"float16": 2.0**-25, "bfloat16": 2.0**-134, "float32": 2.0**-150, "float64": 0.0}
ACC_EPS = {"float16": 2.0**-24, "bfloat16": 2.0**-24, "float32": 2.0**-24, "float64": 2.0**-53}

PASSES = ("forward", "backprop_input", "backprop_filter")


def tolerance(dtype_name, terms, magnitude):
  """Elementwise error bound of a direct sum.

  A sum of `terms` products whose absolute values sum to `magnitude` errs by at most one
  rounding on store plus a sqrt(n)-growth accumulation term.
  """
  return (
    (STORE_EPS[dtype_name] + 4.0 * np.sqrt(max(terms, 1)) * ACC_EPS[dtype_name]) * magnitude
    + STORE_TINY[dtype_name]
    + 1e-300
  )


def assert_close(got, want, dtype_name, terms, magnitude, what="result", extra=0.0):
  """Elementwise check of a directly summed result against `want`, whose own elementwise
  error bound is `extra` (0 for the oracle)."""
  got = np.asarray(got, np.float64)
  assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
  tol = tolerance(dtype_name, terms, magnitude) + extra
  err = np.abs(got - want)
  bad = err > tol
  if bad.any():
    i = tuple(int(j) for j in np.unravel_index(np.argmax(np.where(bad, err / tol, 0)), err.shape))
    raise AssertionError(
      f"{what}: {bad.sum()} of {bad.size} elements off; worst at {i}: got {got[i]:.9g}, "
      f"want {want[i]:.9g}, error {err[i]:.3e} vs tolerance {tol[i]:.3e} (magnitude "
      f"{np.broadcast_to(magnitude, err.shape)[i]:.3e})"
    )


def _norms(a, axes):
  return np.sqrt(np.sum(np.square(a), axis=axes))


class PassCheck:
  """The oracle's answer to one pass of `conv` and the error bounds around it.

  `a`, `b` are the pass's operands as the op takes them, in the problem's data format:
  forward (x, w), backprop_input (w, dy), backprop_filter (x, dy).
  """

  def __init__(self, conv, pass_name, a, b):
    assert pass_name in PASSES, pass_name
    self.conv, self.pass_name = conv, pass_name
    self.a, self.b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    run = getattr(conv, pass_name)
    self.want = run(self.a, self.b)
    self.magnitude = run(np.abs(self.a), np.abs(self.b))
    c = conv
    self.terms = {
      "forward": c.kh * c.kw * c.ci,
      "backprop_input": c.kh * c.kw * (c.co // max(c.groups, 1)),
      "backprop_filter": c.n * c.oh * c.ow,
    }[pass_name]

  def plane_norms(self, a):
    """2-norms of `a` (shaped as the pass's result) over each output plane: (image,
    channel) planes of the forward and backprop_input results, (in, out) channel pairs of
    the filter gradient."""
    if self.pass_name == "backprop_filter":
      return _norms(a, (0, 1))
    return _norms(_nhwc(a, self.conv.fmt), (1, 2))

  def fft_bound(self, fft_size, dtype_name):
    """Bound on the 2-norm of each output plane's error for an FFT pass with transforms
    of `fft_size` (h, w), computing in dtype_name's accumulator type.

    An FFT correlation of two signals errs in 2-norm by about u * log2(T) * |a|_2 * |b|_2
    (T the transform's size). Each output plane is a sum over one group's channels of such
    correlations, so by Cauchy-Schwarz its error is bounded by the norms of exactly the
    operand slices it reads: the image's group of input planes and the output channel's
    filter (forward), the image's group of gradient planes and the filters of the input
    channel (backprop_input), one input channel and one output channel over the whole
    batch (backprop_filter).
    """
    c = self.conv
    g, cig, cog = c.groups, c.ci, c.co // max(c.groups, 1)
    log_t = np.log2(max(int(np.prod(fft_size)), 2))
    if self.pass_name == "forward":
      x = _nhwc(self.a, c.fmt)
      xn = _norms(x.reshape(c.n, c.h * c.w, g, cig), (1, 3))  # (n, g)
      wn = _norms(self.b, (0, 1, 2))  # (co,)
      bound = xn[:, np.arange(c.co) // cog] * wn[None, :]  # (n, co)
    elif self.pass_name == "backprop_input":
      dy = _nhwc(self.b, c.fmt)
      dyn = _norms(dy.reshape(c.n, c.oh * c.ow, g, cog), (1, 3))  # (n, g)
      wn = _norms(self.a.reshape(c.kh * c.kw, cig, g, cog), (0, 3)).T.reshape(-1)  # (c,)
      bound = dyn[:, np.arange(g * cig) // cig] * wn[None, :]  # (n, c)
    else:
      xn = _norms(_nhwc(self.a, c.fmt), (0, 1, 2))  # (c,)
      dyn = _norms(_nhwc(self.b, c.fmt), (0, 1, 2))  # (co,)
      first = (np.arange(c.co) // cog) * cig  # (co,)
      bound = xn[first[None, :] + np.arange(cig)[:, None]] * dyn[None, :]  # (ci, co)
    return 8.0 * ACC_EPS[dtype_name] * log_t * bound

  def check(self, got, dtype_name, fft_size=None, what=None, want=None, want_tolerance=0.0):
    """Asserts `got` is within the bound of the path that computed it.

    Args:
      got: the pass's result.
      dtype_name: the tensors' dtype.
      fft_size: the plan's transform size where the pass ran the FFT; None where it summed
        directly (elementwise bound).
      what: names the check in the failure message.
      want, want_tolerance: compare with another implementation's result (e.g. TF's),
        whose own elementwise error bound is `want_tolerance`, instead of the oracle.

    Returns:
      For the FFT, the worst plane's error as a fraction of its bound; None otherwise.
    """
    what = what or self.pass_name
    got = np.asarray(got, np.float64)
    ref = self.want if want is None else np.asarray(want, np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    if fft_size is None:
      assert_close(
        got, ref, dtype_name, self.terms, self.magnitude, f"{what} (direct)", want_tolerance
      )
      return None
    # Rounding on store (and the other side's own error) is elementwise: its 2-norm per
    # plane adds to the transform's.
    store = STORE_EPS[dtype_name] * np.abs(ref) + STORE_TINY[dtype_name] + want_tolerance
    limit = self.plane_norms(store) + self.fft_bound(fft_size, dtype_name) + 1e-300
    ratio = self.plane_norms(got - ref) / limit
    assert (ratio <= 1).all(), (
      f"{what} (fft {tuple(fft_size)}): {(ratio > 1).sum()} of {ratio.size} planes off; "
      f"worst is {ratio.max():.2f}x its bound"
    )
    return ratio.max(initial=0.0)


def planned_fft(passes):
  """{pass name: transform size (h, w), or None where the pass sums directly} from a plan's
  passes: `PassPlan`s of tf_largeconv.plan, or the dicts the modules' planners return."""
  out = {}
  for p in passes:
    if isinstance(p, dict):
      name, algorithm, fft = p["pass"], p["algorithm"], p.get("fft")
    else:
      name, algorithm, fft = p.name, p.algorithm, p.fft_size
    out[name] = tuple(fft) if algorithm == "fft" else None
  return out
