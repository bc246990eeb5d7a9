"""The three passes of a convolution, by name.

Every value kept per pass (a route, a pass plan) is a `PerPass`, so code reads
`routes.backprop_input`, never `routes[1]`. The order of the fields is the order in which
the C++ planner lists its passes (`cc/core/common/vocabulary.h`, `kPasses`).
"""

from typing import Any
from typing import NamedTuple


class PerPass(NamedTuple):
  """One value for each pass of a convolution: its forward pass and its two gradients.

  A tuple (hashable where its values are), so it keys caches as a plain tuple would.
  """

  forward: Any
  backprop_input: Any
  backprop_filter: Any

  @classmethod
  def every(cls, value: Any) -> "PerPass":
    """`value` for every pass."""
    return cls(value, value, value)

  @classmethod
  def of(cls, values) -> "PerPass":
    """The values of a sequence in pass order; ValueError unless it has one per pass."""
    values = tuple(values)
    if len(values) != len(cls._fields):
      raise ValueError(f"expected one value per pass {cls._fields}, got {len(values)}")
    return cls(*values)
