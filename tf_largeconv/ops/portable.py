"""The portable path: tf.nn.conv2d's semantics from stock TensorFlow ops only.

Overlap-save FFT convolution with `tf.signal.rfft2d` / `irfft2d` over tiles of bounded
size, in a `tf.while_loop`, so it runs where the LargeConv ops cannot: under XLA
(`jit_compile=True`), in a SavedModel served without this package, and when the op library
fails to load. Differentiable through TensorFlow's own gradients.

Memory: one loop iteration transforms `tiles_per_step` tiles of F_h x F_w points for every
image and channel; what is live at once is bounded by `step_bytes()` (the input tiles,
their spectra, the products and the output tiles of one step, plus the filter's spectra),
chosen to fit `workspace_limit`. Under a gradient tape TensorFlow keeps each step's spectra
for the backward pass, so training holds about `steps x step_bytes()`.

This module computes the padding and output sizes itself: it must run without the compiled
modules (`_core`) that hold the package's geometry. `tests/test_portable.py` checks that
both agree on a grid of shapes.
"""

import collections

import tensorflow as tf

# Input channels per group up to which the spectral products are summed channel by channel
# (memory: one product the size of the output spectra) rather than by einsum.
_SUMMED_CHANNELS = 8

# A transform's fixed cost in points' worth (the planner's per-transform seconds over its
# per-point seconds, cc/core/plan/cost_model.cc).
_POINTS_PER_TRANSFORM = 1100


def _smooth_at_least(n):
  """The smallest 2-3-5-7-smooth integer >= n: sizes the transforms handle fast."""
  m = max(int(n), 1)
  while True:
    r = m
    for p in (2, 3, 5, 7):
      while r % p == 0:
        r //= p
    if r == 1:
      return m
    m += 1


def axis_geometry(size, k, stride, dilation, padding, explicit=(0, 0)):
  """(output size, padding before, padding after) of one spatial axis, as tf.nn.conv2d
  computes them: SAME pads (output - 1) * stride + dilated extent - size in total, the
  smaller half before."""
  extent = (k - 1) * dilation + 1
  if padding == "SAME":
    out = -(-size // stride)
    total = max((out - 1) * stride + extent - size, 0)
    return out, total // 2, total - total // 2
  before, after = explicit if padding == "EXPLICIT" else (0, 0)
  out = (size + before + after - extent) // stride + 1
  if size + before + after < extent:
    raise ValueError(
      f"the filter (dilated extent {extent}) is larger than the padded input "
      f"({size + before + after})"
    )
  return out, before, after


def step_bytes(batch, in_c, out_c, fft_h, fft_w, tiles_per_step, real_bytes=4):
  """Bytes live in one loop step: per tile, image and channel the real tile and its
  spectrum (input channels), the product spectrum and the real output tile (output
  channels)."""
  points, bins = fft_h * fft_w, fft_h * (fft_w // 2 + 1)
  per_channel = points * real_bytes + bins * 2 * real_bytes
  return tiles_per_step * batch * (in_c + out_c) * per_channel


TilePlan = collections.namedtuple(
  "TilePlan", ["fft_h", "fft_w", "tile_h", "tile_w", "tiles_h", "tiles_w", "per_step", "steps"]
)


def _smooth_sizes(lo, hi):
  """2-3-5-7-smooth sizes from the smallest >= lo up to the smallest >= hi."""
  sizes, n = [], _smooth_at_least(lo)
  while True:
    sizes.append(n)
    if n >= hi:
      return sizes
    n = _smooth_at_least(n + 1)


def plan_tiles(batch, in_c, out_c, ext_h, ext_w, dense_h, dense_w, workspace_limit, real_bytes=4):
  """Transform sizes and tiles per loop step for filter extents ext_* and dense outputs
  dense_* (stride 1 positions).

  Every pair of smooth transform sizes from the filter's extent up to one tile covering
  everything is priced as its transformed points (input and output channels, every tile),
  plus a fixed cost per transform; the cheapest whose one-tile step fits the limit (None:
  64 MiB) wins, then as many tiles go in a step as fit.

  Raises:
    ValueError: even the smallest transform's step exceeds the limit (the message gives
      the minimum).
  """
  limit = (64 << 20) if workspace_limit is None or workspace_limit < 0 else workspace_limit
  best = None
  for fh in _smooth_sizes(ext_h, dense_h + ext_h - 1):
    tiles_h = -(-dense_h // (fh - ext_h + 1))
    for fw in _smooth_sizes(ext_w, dense_w + ext_w - 1):
      if step_bytes(batch, in_c, out_c, fh, fw, 1, real_bytes) > limit:
        continue
      transforms = tiles_h * -(-dense_w // (fw - ext_w + 1)) * (in_c + out_c)
      cost = transforms * (fh * fw + _POINTS_PER_TRANSFORM)
      if best is None or cost < best[0]:
        best = (cost, fh, fw)
  if best is None:
    need = step_bytes(
      batch, in_c, out_c, _smooth_at_least(ext_h), _smooth_at_least(ext_w), 1, real_bytes
    )
    raise ValueError(
      f"workspace_limit {limit} bytes is too small for the portable path: it "
      f"needs at least {need} bytes for one tile of every image"
    )
  _, fh, fw = best
  tile_h, tile_w = fh - ext_h + 1, fw - ext_w + 1
  tiles_h, tiles_w = -(-dense_h // tile_h), -(-dense_w // tile_w)
  count = tiles_h * tiles_w
  one = step_bytes(batch, in_c, out_c, fh, fw, 1, real_bytes)
  per_step = max(1, min(count, limit // one))
  return TilePlan(fh, fw, tile_h, tile_w, tiles_h, tiles_w, per_step, -(-count // per_step))


def _nhwc(x, strides, dilations, padding, explicit_paddings):
  """An NCHW input and its attributes in NHWC order."""
  x = tf.transpose(x, [0, 2, 3, 1])
  strides = [strides[0], strides[2], strides[3], strides[1]]
  dilations = [dilations[0], dilations[2], dilations[3], dilations[1]]
  if padding == "EXPLICIT":
    p = explicit_paddings
    explicit_paddings = [p[0], p[1], p[4], p[5], p[6], p[7], p[2], p[3]]
  return x, strides, dilations, explicit_paddings


def _filter_spectra(w, groups, dilation, extent, fft_size):
  """The dilated filter [kh, kw, in / groups, out] as [groups, in, out, ext_h, ext_w]
  spectra of `fft_size`, conjugated (a product with them correlates)."""
  kh, kw, in_per_group, out_c = w.shape
  (dh, dw), (ext_h, ext_w) = dilation, extent
  wd = tf.transpose(w, [2, 3, 0, 1])  # [in, out, kh, kw]
  if dh > 1 or dw > 1:
    wd = tf.reshape(wd, [in_per_group, out_c, kh, 1, kw, 1])
    wd = tf.pad(wd, [[0, 0], [0, 0], [0, 0], [0, dh - 1], [0, 0], [0, dw - 1]])
    wd = tf.reshape(wd, [in_per_group, out_c, kh * dh, kw * dw])[:, :, :ext_h, :ext_w]
  wd = tf.reshape(wd, [in_per_group, groups, out_c // groups, ext_h, ext_w])
  wd = tf.transpose(wd, [1, 0, 2, 3, 4])
  return tf.math.conj(tf.signal.rfft2d(wd, fft_length=list(fft_size)))


def _tiles(xt, w_spec, plan, groups, out_c):
  """The overlap-save loop over the padded input xt [batch, in, H, W]: every tile's output,
  as [tiles, batch, out_c, tile_h, tile_w] in row-major tile order."""
  batch, in_c = xt.shape[0], xt.shape[1]
  in_per_group = in_c // groups
  fh, fw, tile_h, tile_w = plan.fft_h, plan.fft_w, plan.tile_h, plan.tile_w
  per_step, steps, count = plan.per_step, plan.steps, plan.tiles_h * plan.tiles_w

  def tile(index):
    i, j = index // plan.tiles_w, index % plan.tiles_w
    window = tf.slice(xt, tf.stack([0, 0, i * tile_h, j * tile_w]), [batch, in_c, fh, fw])
    spec = tf.signal.rfft2d(tf.reshape(window, [batch, groups, in_per_group, fh, fw]))
    if in_per_group <= _SUMMED_CHANNELS:
      # A few input channels: broadcast products summed one channel at a time. einsum
      # would run a batched matmul of tiny [b x i] @ [i x o] blocks over every bin, several
      # times slower for a single channel.
      prod = spec[:, :, 0, None] * w_spec[None, :, 0]
      for i in range(1, in_per_group):
        prod += spec[:, :, i, None] * w_spec[None, :, i]
    else:
      prod = tf.einsum("bgiuv,giouv->bgouv", spec, w_spec)
    out = tf.signal.irfft2d(prod, fft_length=[fh, fw])[..., :tile_h, :tile_w]
    return tf.reshape(out, [batch, out_c, tile_h, tile_w])

  def body(step, acc):
    first = step * per_step
    outs = [tile(tf.minimum(first + t, count - 1)) for t in range(per_step)]
    return step + 1, acc.write(step, tf.stack(outs))

  acc = tf.TensorArray(xt.dtype, size=steps, element_shape=[per_step, batch, out_c, tile_h, tile_w])
  _, acc = tf.while_loop(
    lambda s, _: s < steps,
    body,
    (tf.constant(0), acc),
    parallel_iterations=1,
    maximum_iterations=steps,
  )
  return tf.reshape(acc.stack(), [steps * per_step, batch, out_c, tile_h, tile_w])[:count]


def conv2d(
  x,
  w,
  strides,
  padding,
  explicit_paddings,
  data_format,
  dilations,
  groups=None,
  workspace_limit=None,
):
  """tf.nn.conv2d (grouped when w's in-depth divides x's depth) from stock TF ops.

  Args:
    x: 4-D input in data_format order; w: [kh, kw, in_c / groups, out_c].
    strides, dilations: 4 ints in data_format order (batch and depth 1).
    padding: 'SAME', 'VALID' or 'EXPLICIT' (with explicit_paddings: 8 ints in data_format
      order).
    workspace_limit: bytes for one loop step (None: 64 MiB).
  """
  nchw = data_format == "NCHW"
  if nchw:
    x, strides, dilations, explicit_paddings = _nhwc(
      x, strides, dilations, padding, explicit_paddings
    )
  dtype = x.dtype
  compute = tf.float64 if dtype == tf.float64 else tf.float32
  x = tf.cast(x, compute)
  w = tf.cast(w, compute)
  batch, height, width, in_c = (x.shape[0], x.shape[1], x.shape[2], x.shape[3])
  kh, kw, in_per_group, out_c = w.shape
  if groups is None:
    groups = in_c // in_per_group
  sh, sw = strides[1], strides[2]
  dh, dw = dilations[1], dilations[2]
  ep = explicit_paddings if padding == "EXPLICIT" else [0] * 8
  out_h, top, _ = axis_geometry(height, kh, sh, dh, padding, (ep[2], ep[3]))
  out_w, left, _ = axis_geometry(width, kw, sw, dw, padding, (ep[4], ep[5]))
  ext_h, ext_w = (kh - 1) * dh + 1, (kw - 1) * dw + 1
  dense_h, dense_w = (out_h - 1) * sh + 1, (out_w - 1) * sw + 1
  if out_h <= 0 or out_w <= 0 or batch == 0 or out_c == 0:
    shape = [batch, out_h, out_w, out_c]
    y = tf.zeros([max(v, 0) for v in shape], dtype)
    return tf.transpose(y, [0, 3, 1, 2]) if nchw else y

  real_bytes = 8 if compute == tf.float64 else 4
  plan = plan_tiles(batch, in_c, out_c, ext_h, ext_w, dense_h, dense_w, workspace_limit, real_bytes)
  tile_h, tile_w, tiles_h, tiles_w = plan.tile_h, plan.tile_w, plan.tiles_h, plan.tiles_w

  # Zero padding: the convolution's own, then enough after for whole tiles (and whole
  # steps); rows and columns the input has beyond what the tiles read are cropped.
  need_h = tiles_h * tile_h + ext_h - 1
  need_w = tiles_w * tile_w + ext_w - 1
  x = x[:, : max(0, min(height, need_h - top)), : max(0, min(width, need_w - left)), :]
  x = tf.pad(
    x,
    [
      [0, 0],
      [top, max(0, need_h - top - x.shape[1])],
      [left, max(0, need_w - left - x.shape[2])],
      [0, 0],
    ],
  )
  w_spec = _filter_spectra(w, groups, (dh, dw), (ext_h, ext_w), (plan.fft_h, plan.fft_w))
  tiles = _tiles(tf.transpose(x, [0, 3, 1, 2]), w_spec, plan, groups, out_c)
  y = tf.reshape(tiles, [tiles_h, tiles_w, batch, out_c, tile_h, tile_w])
  y = tf.transpose(y, [2, 0, 4, 1, 5, 3])  # [batch, tiles_h, tile_h, tiles_w, tile_w, out]
  y = tf.reshape(y, [batch, tiles_h * tile_h, tiles_w * tile_w, out_c])
  y = y[:, :dense_h:sh, :dense_w:sw, :]
  y = tf.cast(y, dtype)
  return tf.transpose(y, [0, 3, 1, 2]) if nchw else y
