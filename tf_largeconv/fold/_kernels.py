"""The kernel algebra of folding, in TensorFlow ops so that FoldedBlock differentiates
through it: two kernels composed, a kernel dilated, regrouped, padded, and a bias carried
through a kernel. Kernels are in grouped-convolution storage, [kh, kw, C_in / groups, C]."""

import math

import numpy as np
import tensorflow as tf

from tf_largeconv import ops as _ops


def dilate(w, rate):
  """The kernel with rate-1 zeros between its taps, per spatial axis."""
  for axis, d in enumerate(rate):
    if d > 1:
      k = w.shape[axis]
      stuffed = tf.stack([w] + [tf.zeros_like(w)] * (d - 1), axis=axis + 1)
      shape = list(w.shape)
      shape[axis] = k * d
      w = tf.reshape(stuffed, shape)
      w = w[: (k - 1) * d + 1] if axis == 0 else w[:, : (k - 1) * d + 1]
  return w


def regroup(k, groups, target):
  """A kernel of `groups` groups as one of `target` groups (target divides groups): each
  target group holds groups/target original groups block-diagonally."""
  if groups == target:
    return k
  r = groups // target
  h, w, n, c = k.shape
  k6 = tf.reshape(k, [h, w, n, target, r, c // groups])
  eye = tf.eye(r, dtype=k.dtype)
  return tf.reshape(tf.einsum("hwnSso,ts->hwtnSso", k6, eye), [h, w, r * n, c])


def compose_kernels(a, ga, b, gb):
  """The kernel of B applied after A (full 2-D convolution over space, matrix product over
  channels), without expanding either group structure.

  Args:
    a: [ha, wa, C0/ga, C], in `ga` groups.
    ga: A's groups.
    b: [hb, wb, C/gb, C'], in `gb` groups.
    gb: B's groups.

  Returns:
    The [ha+hb-1, wa+wb-1, C0/g, C'] kernel in g = gcd(ga, gb) groups, and g.
  """
  ha, wa, na, c = a.shape
  hb, wb, _, cout = b.shape
  lcm = ga * gb // math.gcd(ga, gb)
  q, ob = c // lcm, cout // gb
  ra, rb = lcm // ga, lcm // gb
  # The channels between A and B in lcm parts: part p lies in A's group p // ra and B's
  # group p // rb. T[w, n, p, o]: the contribution through part p.
  a5 = tf.reshape(a, [ha, wa, na, lcm, q])
  b5 = tf.reshape(
    tf.transpose(tf.reshape(b, [hb, wb, rb, q, gb, ob]), [0, 1, 4, 2, 3, 5]), [hb, wb, lcm, q, ob]
  )
  if ha == wa == 1:
    t = tf.einsum("npq,hwpqo->hwnpo", a5[0, 0], b5)
  elif hb == wb == 1:
    t = tf.einsum("hwnpq,pqo->hwnpo", a5, b5[0, 0])
  else:
    # A as a batch of na images with C channels, correlated (full padding) with flipped B
    # as a convolution of lcm groups.
    image = tf.transpose(a, [2, 0, 1, 3])
    filt = tf.reverse(tf.reshape(tf.transpose(b5, [0, 1, 3, 2, 4]), [hb, wb, q, lcm * ob]), [0, 1])
    out = _ops.conv2d(image, filt, 1, [[0, 0], [hb - 1, hb - 1], [wb - 1, wb - 1], [0, 0]])
    t = tf.reshape(tf.transpose(out, [1, 2, 0, 3]), [ha + hb - 1, wa + wb - 1, na, lcm, ob])
  h, w = t.shape[0], t.shape[1]
  g = math.gcd(ga, gb)
  ga_s, gb_s = ga // g, gb // g
  t = tf.reshape(t, [h, w, na, g, lcm // g, ob])
  if ra == 1:  # one part per A group, one B group per result group
    k = tf.reshape(tf.transpose(t, [0, 1, 4, 2, 3, 5]), [h, w, ga_s * na, cout])
  elif rb == 1:  # one part per B group, one A group per result group
    k = tf.reshape(t, [h, w, na, cout])
  else:
    part = np.arange(lcm // g)
    to_a = tf.constant(part[:, None] // ra == np.arange(ga_s)[None], dtype=t.dtype)
    to_b = tf.constant(part[:, None] // rb == np.arange(gb_s)[None], dtype=t.dtype)
    k = tf.reshape(tf.einsum("hwnSpo,pa,pb->hwanSbo", t, to_a, to_b), [h, w, ga_s * na, cout])
  return k, g


def bias_through(bias, w, groups):
  """W applied to a constant bias: sum over W's taps and group inputs."""
  ws = tf.reduce_sum(w, axis=[0, 1])
  n, cout = ws.shape
  ws = tf.reshape(ws, [n, groups, cout // groups])
  b = tf.reshape(bias, [groups, n])
  return tf.reshape(tf.einsum("Gi,iGo->Go", b, ws), [cout])


def pad_kernel(k, top, bottom, left, right):
  """The kernel with zero taps added on each side."""
  if top == bottom == left == right == 0:
    return k
  return tf.pad(k, [[top, bottom], [left, right], [0, 0], [0, 0]])
