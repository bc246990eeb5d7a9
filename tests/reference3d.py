"""A float64 oracle of TensorFlow's Conv3D, written from its definition (no code shared
with the package), the error bound a result of either algorithm must meet, and the Conv3D
configurations the 3-D tests share: the core kernels (test_conv3d.py) and the CUDA kernels,
emulated (test_cuda_emulation3d.py) and on a device (gpu/test_cuda_kernels3d.py). numpy
only, so the GPU machines (no TensorFlow) can import it."""

import itertools

import numpy as np

PASSES = ("forward", "backprop_input", "backprop_filter")
# Unit roundoff of the stored results and of the type the kernels compute in, and (float16)
# the absolute rounding error of a store below the normal range.
STORE_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
ACC_EPS = {"float64": 2.0**-53, "float32": 2.0**-24, "float16": 2.0**-24, "bfloat16": 2.0**-24}
STORE_TINY = {"float64": 0.0, "float32": 0.0, "float16": 2.0**-25, "bfloat16": 0.0}


class Oracle3d:
  """One Conv3D problem in float64: x (data_format), w [KD, KH, KW, C_in / groups, C_out]."""

  def __init__(self, x_shape, w_shape, strides, padding, dilations, data_format):
    self.fmt = data_format
    last = x_shape if data_format == "NDHWC" else tuple(x_shape[i] for i in (0, 2, 3, 4, 1))
    self.n, self.c = last[0], last[4]
    self.size = last[1:4]
    self.k = w_shape[:3]
    self.ci, self.co = w_shape[3], w_shape[4]
    self.groups = self.c // self.ci
    self.s, self.d = tuple(strides), tuple(dilations)
    self.before, self.after, self.out = [], [], []
    for size, k, s, d in zip(self.size, self.k, self.s, self.d):
      extent = (k - 1) * d + 1
      if padding == "SAME":
        out = -(-size // s)
        total = max((out - 1) * s + extent - size, 0)
        before, after = total // 2, total - total // 2
      else:
        before = after = 0
        out = (size - extent) // s + 1
      self.before.append(before)
      self.after.append(after)
      self.out.append(out)

  def to_last(self, a):
    return (
      np.asarray(a, np.float64)
      if self.fmt == "NDHWC"
      else np.transpose(np.asarray(a, np.float64), (0, 2, 3, 4, 1))
    )

  def from_last(self, a):
    return a if self.fmt == "NDHWC" else np.transpose(a, (0, 4, 1, 2, 3))

  def output_shape(self):
    return tuple(self.from_last(np.empty((self.n, *self.out, self.co))).shape)

  def taps(self):
    """(tap, window slices of the padded input it meets) for every filter tap."""
    for tap in itertools.product(*(range(k) for k in self.k)):
      yield (
        tap,
        tuple(
          slice(t * d, t * d + (o - 1) * s + 1, s)
          for t, d, o, s in zip(tap, self.d, self.out, self.s)
        ),
      )

  def channel_groups(self):
    cog = self.co // self.groups
    for g in range(self.groups):
      yield slice(g * self.ci, (g + 1) * self.ci), slice(g * cog, (g + 1) * cog)

  def padded(self, x):
    return np.pad(x, [(0, 0)] + list(zip(self.before, self.after)) + [(0, 0)])

  def forward(self, x, w):
    xp = self.padded(self.to_last(x))
    y = np.zeros((self.n, *self.out, self.co))
    for tap, (sd, sh, sw) in self.taps():
      for ci, co in self.channel_groups():
        y[..., co] += np.einsum("ndhwc,co->ndhwo", xp[:, sd, sh, sw, ci], w[tap][:, co])
    return self.from_last(y)

  def backprop_input(self, w, dy):
    dy = self.to_last(dy)
    padded = [s + b + a for s, b, a in zip(self.size, self.before, self.after)]
    dxp = np.zeros((self.n, *padded, self.c))
    for tap, (sd, sh, sw) in self.taps():
      for ci, co in self.channel_groups():
        dxp[:, sd, sh, sw, ci] += np.einsum("ndhwo,co->ndhwc", dy[..., co], w[tap][:, co])
    crop = tuple(slice(b, b + s) for b, s in zip(self.before, self.size))
    return self.from_last(dxp[(slice(None), *crop)])

  def backprop_filter(self, x, dy):
    xp = self.padded(self.to_last(x))
    dy = self.to_last(dy)
    dw = np.zeros((*self.k, self.ci, self.co))
    for tap, (sd, sh, sw) in self.taps():
      for ci, co in self.channel_groups():
        dw[tap][:, co] = np.einsum("ndhwc,ndhwo->co", xp[:, sd, sh, sw, ci], dy[..., co])
    return dw


def operands(oracle, x, w, dy, pass_name):
  return {"forward": (x, w), "backprop_input": (w, dy), "backprop_filter": (x, dy)}[pass_name]


def run_pass(module, pass_name, x, w, dy, attrs, **kwargs):
  """One pass through `module` (_core, or _core.cuda_emulation for the CUDA kernels);
  attrs: strides, padding, data_format, dilations."""
  if pass_name == "forward":
    return module.conv3d(x, w, **attrs, **kwargs)
  if pass_name == "backprop_input":
    return module.conv3d_backprop_input(list(x.shape), w, dy, **attrs, **kwargs)
  return module.conv3d_backprop_filter(x, list(w.shape), dy, **attrs, **kwargs)


def check(oracle, pass_name, got, x, w, dy, dtype, fft_size):
  """Asserts `got` is within the error bound of the path that computed it.

  A direct sum of n products errs by at most about sqrt(n) roundings of the sum of their
  magnitudes, plus one rounding on store. An FFT correlation errs in 2-norm by about
  u * log2(N) * |a|_2 * |b|_2 (N points per transform); every result element is a sum of
  such correlations over slices of the operands, so by Cauchy-Schwarz the operands' whole
  norms bound each element's error.
  """
  a, b = (np.asarray(t, np.float64) for t in operands(oracle, x, w, dy, pass_name))
  run = getattr(oracle, pass_name)
  want = run(a, b)
  got = np.asarray(got, np.float64)
  assert got.shape == want.shape, (pass_name, got.shape, want.shape)
  eps = ACC_EPS[dtype]
  tol = STORE_EPS[dtype] * np.abs(want) + STORE_TINY[dtype]
  if fft_size is None:
    terms = {
      "forward": np.prod(oracle.k) * oracle.ci,
      "backprop_input": np.prod(oracle.k) * oracle.co // oracle.groups,
      "backprop_filter": oracle.n * np.prod(oracle.out),
    }[pass_name]
    tol = tol + 4.0 * np.sqrt(max(terms, 1)) * eps * run(np.abs(a), np.abs(b))
  else:
    log_n = np.log2(max(np.prod(fft_size), 2))
    tol = tol + 8.0 * eps * log_n * np.linalg.norm(a) * np.linalg.norm(b)
  err = np.abs(got - want)
  worst = np.unravel_index(np.argmax(err - tol), err.shape) if err.size else None
  assert (err <= tol + 1e-300).all(), (
    f"{pass_name} ({'fft ' + str(fft_size) if fft_size else 'direct'}): "
    f"{(err > tol).sum()} of {err.size} off; at {worst}: got {got[worst]}, want {want[worst]}"
  )


# (input shape, filter shape, strides, padding, dilations, data_format)


CASES = {
  "valid": ((1, 6, 7, 8, 2), (3, 2, 4, 2, 3), (1, 1, 1, 1, 1), "VALID", (1, 1, 1, 1, 1), "NDHWC"),
  "same_strided": (
    (2, 7, 6, 9, 3),
    (3, 3, 4, 3, 2),
    (1, 2, 1, 3, 1),
    "SAME",
    (1, 1, 1, 1, 1),
    "NDHWC",
  ),
  "dilated": ((1, 9, 8, 10, 2), (2, 3, 3, 2, 2), (1, 1, 1, 1, 1), "SAME", (1, 2, 1, 3, 1), "NDHWC"),
  "grouped_ncdhw": (
    (2, 4, 5, 6, 7),
    (3, 2, 3, 2, 6),
    (1, 1, 1, 1, 1),
    "SAME",
    (1, 1, 1, 1, 1),
    "NCDHW",
  ),
  "depthwise": (
    (1, 6, 7, 5, 3),
    (4, 3, 2, 1, 3),
    (1, 1, 1, 1, 1),
    "SAME",
    (1, 1, 1, 1, 1),
    "NDHWC",
  ),
  "strided_dilated_ncdhw": (
    (1, 2, 11, 9, 10),
    (3, 2, 3, 2, 4),
    (1, 1, 2, 3, 2),
    "VALID",
    (1, 1, 2, 1, 2),
    "NCDHW",
  ),
  "filter_fills_input": (
    (2, 4, 5, 3, 2),
    (4, 5, 3, 2, 3),
    (1, 1, 1, 1, 1),
    "VALID",
    (1, 1, 1, 1, 1),
    "NDHWC",
  ),
  "many_channels": (
    (1, 5, 6, 7, 12),
    (3, 3, 3, 12, 40),
    (1, 1, 2, 1, 1),
    "SAME",
    (1, 1, 1, 1, 1),
    "NDHWC",
  ),
}


def problem(case, rng, dtype):
  x_shape, w_shape, strides, padding, dilations, fmt = CASES[case]
  oracle = Oracle3d(
    x_shape,
    w_shape,
    [strides[i] for i in spatial(fmt)],
    padding,
    [dilations[i] for i in spatial(fmt)],
    fmt,
  )
  x = rng.standard_normal(x_shape).astype(dtype)
  w = rng.standard_normal(w_shape).astype(dtype)
  dy = rng.standard_normal(oracle.output_shape()).astype(dtype)
  attrs = dict(strides=list(strides), padding=padding, data_format=fmt, dilations=list(dilations))
  return oracle, x, w, dy, attrs


def spatial(fmt):
  return (1, 2, 3) if fmt == "NDHWC" else (2, 3, 4)
