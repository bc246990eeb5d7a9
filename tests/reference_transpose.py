"""Independent float64 numpy oracle of the transposed 2-D convolution (tf.nn.conv2d_transpose),
written from its definition as a scatter, sharing no code with the package or with
reference.py: every input pixel x[n, i, j, c] adds x * w[a, b, o, c] to output pixel
(i * stride - pad_top + a * dilation, j * stride - pad_left + b * dilation) of output channel
o (of c's group), where it falls inside the output. The padding is the one the conv2d that
maps an output-shaped tensor to the input would use."""

import numpy as np


def conv_pads(size, k, s, d, padding):
  """(before, after) padding along one dimension of the conv2d (input `size`)."""
  if padding == "VALID":
    return 0, 0
  if padding == "SAME":
    extent = (k - 1) * d + 1
    total = max((-(-size // s) - 1) * s + extent - size, 0)
    return total // 2, total - total // 2
  return tuple(padding)


def conv2d_transpose(x, w, output_shape, strides, padding, dilations=(1, 1), data_format="NHWC"):
  """The transpose, in float64.

  Args:
    x: input, [n, h, w, c] (NHWC) or [n, c, h, w] (NCHW).
    w: filters [kh, kw, out_channels / groups, c].
    output_shape: 4 ints in data_format order.
    strides, dilations: (h, w) pairs.
    padding: 'SAME', 'VALID', or ((top, bottom), (left, right)).
  """
  x = np.asarray(x, np.float64)
  w = np.asarray(w, np.float64)
  if data_format == "NCHW":
    x = x.transpose(0, 2, 3, 1)
    n, oc, oh, ow = output_shape
  else:
    n, oh, ow, oc = output_shape
  kh, kw, ocg, c = w.shape
  groups = oc // ocg
  cg = c // groups
  pads = [
    conv_pads(size, k, s, d, padding if isinstance(padding, str) else padding[i])
    for i, (size, k, s, d) in enumerate(zip((oh, ow), (kh, kw), strides, dilations))
  ]
  y = np.zeros((n, oh, ow, oc))
  for i in range(x.shape[1]):
    for j in range(x.shape[2]):
      for a in range(kh):
        r = i * strides[0] - pads[0][0] + a * dilations[0]
        if not 0 <= r < oh:
          continue
        for b in range(kw):
          col = j * strides[1] - pads[1][0] + b * dilations[1]
          if not 0 <= col < ow:
            continue
          for g in range(groups):
            src = x[:, i, j, g * cg : (g + 1) * cg]  # (n, cg)
            taps = w[a, b, :, g * cg : (g + 1) * cg]  # (ocg, cg)
            y[:, r, col, g * ocg : (g + 1) * ocg] += src @ taps.T
  return y.transpose(0, 3, 1, 2) if data_format == "NCHW" else y
