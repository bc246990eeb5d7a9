"""TF Conv2D semantics expressed through torch.nn.functional.conv2d, as the GPU oracle:
HWIO filters become OIHW, SAME/EXPLICIT padding (possibly asymmetric) is padded explicitly,
NHWC is permuted, and the two gradients come from autograd."""

import numpy as np
import torch
import torch.nn.functional as F


def to_device(a, dtype_name):
  """A CUDA tensor of torch dtype `dtype_name` holding array `a` (rounded from float64)."""
  return torch.as_tensor(np.asarray(a, np.float64)).to("cuda", getattr(torch, dtype_name))


def tf_pads(h, w, kh, kw, strides, dilations, padding):
  """(top, bottom, left, right) as TF computes them."""
  if padding == "VALID":
    return (0, 0, 0, 0)
  if padding != "SAME":
    (t, b), (l, r) = padding
    return (t, b, l, r)
  out = []
  for size, k, s, d in ((h, kh, strides[0], dilations[0]), (w, kw, strides[1], dilations[1])):
    eff = (k - 1) * d + 1
    total = max((-(-size // s) - 1) * s + eff - size, 0)
    out += [total // 2, total - total // 2]
  return tuple(out)


def conv2d_and_grads(x, w, dy, strides, padding, dilations, data_format):
  """Forward output and (d input, d filter) for x in data_format, w HWIO, dy like the output.
  Returns tensors in the same layouts as the inputs."""
  xn = x if data_format == "NCHW" else x.permute(0, 3, 1, 2)
  xn = xn.detach().clone().requires_grad_(True)
  wo = w.permute(3, 2, 0, 1).detach().clone().requires_grad_(True)
  groups = xn.shape[1] // w.shape[2]
  t, b, l, r = tf_pads(
    xn.shape[2], xn.shape[3], w.shape[0], w.shape[1], strides, dilations, padding
  )
  y = F.conv2d(
    F.pad(xn, (l, r, t, b)), wo, stride=tuple(strides), dilation=tuple(dilations), groups=groups
  )
  dyn = dy if data_format == "NCHW" else dy.permute(0, 3, 1, 2)
  y.backward(dyn)
  back = (lambda a: a) if data_format == "NCHW" else (lambda a: a.permute(0, 2, 3, 1))
  return (
    back(y.detach()).contiguous(),
    back(xn.grad).contiguous(),
    wo.grad.permute(2, 3, 1, 0).contiguous(),
  )


def conv2d_transpose(x, w, out_hw, stride, padding):
  """tf.nn.conv2d_transpose through torch's conv_transpose2d, for x NCHW and w HWIO of the
  conv2d it transposes (w's out channels are x's): torch's output, cropped symmetrically
  by the smaller of TF's two pads per axis, is cropped the rest of the way (TF's padding
  may be uneven) and zero-extended where the conv2d's windows never reached (VALID with a
  remainder), to the output size out_hw."""
  h, wd = out_hw
  kh, kw = w.shape[:2]
  t, b, l, r = tf_pads(h, wd, kh, kw, (stride, stride), (1, 1), padding)
  pt, pl = min(t, b), min(l, r)
  y = F.conv_transpose2d(x, w.permute(3, 2, 0, 1), stride=stride, padding=(pt, pl))
  t, l = t - pt, l - pl
  y = F.pad(y, (0, max(l + wd - y.shape[3], 0), 0, max(t + h - y.shape[2], 0)))
  return y[:, :, t : t + h, l : l + wd]


def conv3d_and_grads(x, w, dy, strides, pads, dilations, data_format):
  """Conv3D's forward output and (d input, d filter) through torch.nn.functional.conv3d,
  for x in data_format, w DHWIO, dy like the output; `pads` is ((front, back), (top,
  bottom), (left, right)) as TF computes them (reference3d.Oracle3d's before / after).
  Returns tensors in the same layouts as the inputs."""
  xn = x if data_format == "NCDHW" else x.permute(0, 4, 1, 2, 3)
  xn = xn.detach().clone().requires_grad_(True)
  wo = w.permute(4, 3, 0, 1, 2).detach().clone().requires_grad_(True)
  groups = xn.shape[1] // w.shape[3]
  flat = [p for pair in reversed(pads) for p in pair]  # F.pad wants the last dimension first
  y = F.conv3d(F.pad(xn, flat), wo, stride=tuple(strides), dilation=tuple(dilations), groups=groups)
  dyn = dy if data_format == "NCDHW" else dy.permute(0, 4, 1, 2, 3)
  y.backward(dyn)
  back = (lambda a: a) if data_format == "NCDHW" else (lambda a: a.permute(0, 2, 3, 4, 1))
  return (
    back(y.detach()).contiguous(),
    back(xn.grad).contiguous(),
    wo.grad.permute(2, 3, 4, 1, 0).contiguous(),
  )
