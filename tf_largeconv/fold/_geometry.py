"""Padding and output sizes for fold, from the package's one geometry (`ConvProblem`):
a layer's own, and those of the one convolution of the block input that computes a block's
output (its padding, and the zeros the folded kernel needs around it)."""

from tf_largeconv._problem import ConvProblem


def geometry(size, kernel, strides, padding, dilations=(1, 1)):
  """(pad_top, pad_bottom, pad_left, pad_right), (out_h, out_w) of a convolution."""
  problem = ConvProblem.conv2d(list(strides), padding, "NHWC", list(dilations))
  axes = problem.bind([1, size[0], size[1], 1], [kernel[0], kernel[1], 1, 1]).axes()
  pads = tuple(p for a in axes for p in (a.pad_before, a.pad_after))
  return pads, tuple(a.out for a in axes)


def _axis(state, block, a):
  """Along axis `a`: (kernel size, offset, output size, stride, block's input size)."""
  return state.kernel.shape[a], state.offset[a], state.size[a], state.stride[a], block.size[a]


def _keras_extension(state, block, mode):
  """(top, bottom, left, right) zeros to add to the kernel so that a Keras convolution with
  padding `mode` ('SAME' or 'VALID') and the state's stride computes the state, or None."""
  ext = []
  for a in (0, 1):
    kh, oh, out, s, size = _axis(state, block, a)
    found = None
    for kf in range(kh, kh + 2 * abs(oh) + 2 * s + kh + 2):
      try:
        pads, o = geometry((size, size), (kf, kf), (s, s), mode)
      except ValueError:  # a 'valid' kernel larger than the input
        break
      top = pads[0] - oh
      if o[0] == out and 0 <= top <= kf - kh:
        found = (top, kf - kh - top)
        break
    if found is None:
      return None
    ext.extend(found)
  return tuple(ext)


def keras_geometry(state, block):
  """The padding of the Keras layer that computes `state` from the block input.

  Args:
    state: the block output's affine description.
    block: the block.

  Returns:
    ('same' or 'valid', (top, bottom, left, right) zeros to add to the kernel).

  Raises:
    ValueError: neither padding computes it.
  """
  for mode in ("SAME", "VALID"):
    ext = _keras_extension(state, block, mode)
    if ext is not None:
      return mode.lower(), ext
  rows = state.size[0] - (block.size[0] if state.stride[0] == 1 else 0)
  cols = state.size[1] - (block.size[1] if state.stride[1] == 1 else 0)
  where = (
    f"is {rows:+d} rows and {cols:+d} columns the size of its input, reading from "
    f"offset {tuple(-o for o in state.offset)}"
    if state.stride == (1, 1)
    else f"has size {state.size} with stride {state.stride}"
  )
  raise ValueError(
    f"the output of block '{block.name}' {where}: no convolution with "
    "padding 'same' or 'valid' computes it (FoldedBlock, which pads "
    "explicitly, can)"
  )


def explicit_geometry(state, block):
  """(explicit pads ((top, bottom), (left, right)), kernel extension) for conv2d."""
  pads, ext = [], []
  for a in (0, 1):
    kh, oh, out, s, size = _axis(state, block, a)
    top_zeros = max(0, -oh)
    top = oh + top_zeros
    bottom = (out - 1) * s + kh + top_zeros - size - top
    bottom_zeros = max(0, -bottom)
    pads.append((top, bottom + bottom_zeros))
    ext.extend((top_zeros, bottom_zeros))
  return tuple(pads), tuple(ext)
