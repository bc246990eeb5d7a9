"""How a fold says what it cannot do exactly: the error for a layer no fold can hold, and
the report and warning of fold(..., exact=False)."""

import dataclasses

import numpy as np


class Unfoldable(ValueError):
  """A layer no fold can contain, whatever surrounds it (non-linear, or a setting fold does
  not handle); `node` is the graph node, so reparameterize can fold around it."""

  node = None


class FoldWarning(UserWarning):
  """Issued by fold(..., exact=False) when the fold differs from the block at the border."""


@dataclasses.dataclass(frozen=True)
class FoldReport:
  """How a non-exact fold differs from its block (`fold(..., exact=False)`).

  Attributes:
    differing_pixels: output pixels (height x width positions, any channel) where the
      folded convolution differs from the block, for an input of `input_size`.
    total_pixels: output pixels in all.
    input_size: the (height, width) the count is for.
    reasons: one line per layer that reads beyond a border where the fold is not zero.
  """

  differing_pixels: int
  total_pixels: int
  input_size: tuple
  reasons: tuple


def report(state, composer, block):
  """The FoldReport of a composition made with `count`, else None.

  Args:
    state: the block output's affine description (its `err` on the probe input).
    composer: the composer that made it (its `count` and `reasons`).
    block: the block (its input size).

  Returns:
    A FoldReport, or None when the composition did not count.
  """
  if not composer.count:
    return None
  # A pixel differs where the error is beyond float64 rounding (cancellations, e.g. a - a,
  # leave only rounding).
  err = np.abs(state.err.numpy()[0]).max(axis=-1)
  differs = err > 1e-9 * max(1.0, float(err.max()))
  return FoldReport(
    differing_pixels=int(differs.sum()),
    total_pixels=int(differs.size),
    input_size=block.size,
    reasons=tuple(composer.reasons),
  )
