"""Planning: what the ops will do for given shapes, before running them.

- `types`: `Plan` and `PassPlan`, what every plan function returns.
- `plan` (2-D, and 3-D for a 5-entry filter shape), `plan_conv3d`: the C++ planner's
  choice per pass, with its workspace and its cost model's estimates.
- `routing`: which passes of a 2-D convolution run TensorFlow's own kernel instead.
- `kept_spectra`: when an eager call moves to the FFT with filter spectra kept.
- `device`: threads and GPU placement, as TensorFlow has them.
"""

from tf_largeconv.planning import device
from tf_largeconv.planning import kept_spectra
from tf_largeconv.planning import routing
from tf_largeconv.planning._plan import plan
from tf_largeconv.planning._plan import plan_problem
from tf_largeconv.planning._plan3d import plan_conv3d
from tf_largeconv.planning.types import PassPlan
from tf_largeconv.planning.types import Plan

__all__ = [
  "PassPlan",
  "Plan",
  "device",
  "kept_spectra",
  "plan",
  "plan_conv3d",
  "plan_problem",
  "routing",
]
