"""Strides in the spectrum (cc/core/cpu/fft_decimation.h, ExpandStuffed and FoldStrided): the
FFT passes transform a zero-stuffed out_backprop tile (backprop_input, backprop_filter) from its
decimated plane, and take a strided forward pass's kept outputs from a folded spectrum of
the decimated size, wherever the stride divides the transform's side. Each case is checked
against the float64 oracle in all three passes, and asserts from the plan that it runs
what it is named for: the stride dividing the transform (or not), several tiles whose
origins fall on different residues of the stride (odd tiles), a single wrap-around tile,
batched groups, runs of tiles and the filter pass's sweeps of tiles."""

import pytest
from reference import Conv
from reference import planned_fft

import tf_largeconv as lc

# (name, x_shape, w_shape, strides, padding, workspace_limit, data_format, dtype, expect):
# `expect` names what the plan must show (see _check_plan).
CASES = [
  # Even filters leave odd tiles, so tile origins alternate between residues 0 and 1.
  (
    "odd_tiles",
    (2, 70, 64, 3),
    (10, 10, 3, 4),
    (2, 2),
    "SAME",
    400_000,
    "NHWC",
    "float32",
    {"divides": (True, True), "odd_tiles": True},
  ),
  # Explicit padding moves the origins of the stuffed tiles off the stride.
  (
    "explicit_pad",
    (1, 61, 57, 2),
    (9, 8, 2, 3),
    (2, 2),
    [[0, 0], [3, 2], [1, 4], [0, 0]],
    300_000,
    "NHWC",
    "float32",
    {"divides": (True, True)},
  ),
  (
    "stride_2x3",
    (2, 66, 75, 2),
    (11, 12, 2, 3),
    (2, 3),
    "SAME",
    500_000,
    "NCHW",
    "float32",
    {"divides": (True, True)},
  ),
  # The forward and filter passes' transforms are divided by the stride in height only.
  (
    "stride_3",
    (1, 80, 80, 2),
    (13, 13, 2, 2),
    (3, 3),
    "VALID",
    600_000,
    "NHWC",
    "float64",
    {
      "divides": {
        "forward": (True, False),
        "backprop_input": (True, True),
        "backprop_filter": (True, False),
      }
    },
  ),
  ("stride_4", (1, 97, 90, 1), (15, 15, 1, 2), (4, 4), "SAME", None, "NHWC", "float32", {}),
  # One wrap-around tile covering the whole image.
  (
    "wrap_tile",
    (2, 40, 36, 2),
    (9, 9, 2, 2),
    (2, 2),
    "SAME",
    None,
    "NHWC",
    "float64",
    {"single_tile": True},
  ),
  # Many groups: batched transforms of several groups at one tile.
  (
    "depthwise",
    (2, 48, 50, 8),
    (11, 11, 1, 8),
    (2, 2),
    "SAME",
    2_000_000,
    "NHWC",
    "float32",
    {"batched_groups": True},
  ),
  # One group: several tiles an item (forward, backprop_input), and sweeps of tiles over
  # accumulators beyond the cache (filter, its transforms divided in height only).
  (
    "runs_and_sweeps",
    (4, 60, 60, 64),
    (7, 7, 64, 64),
    (2, 2),
    "SAME",
    None,
    "NHWC",
    "float32",
    {
      "runs": True,
      "divides": {
        "forward": (True, True),
        "backprop_input": (True, True),
        "backprop_filter": (True, False),
      },
    },
  ),
]


def _check_plan(plan, strides, expect):
  passes = {p.name: p for p in plan.passes}
  for p in passes.values():
    assert p.algorithm == "fft", p
  for name, p in passes.items():
    divides = tuple(p.fft_size[i] % strides[i] == 0 for i in range(2))
    if "divides" in expect:
      want = expect["divides"]
      assert divides == (want[name] if isinstance(want, dict) else want), (name, p, strides)
    if expect.get("odd_tiles") and name != "backprop_input":
      assert p.tiles[0] > 1 and p.tile[0] % 2, (name, p)
    if expect.get("single_tile"):
      assert p.tiles == (1, 1), (name, p)
    if expect.get("batched_groups"):
      assert p.vec_block > 1, (name, p)
  if expect.get("runs"):
    assert all(p.vec_block > 1 for p in passes.values()), plan.passes


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_strided_fft_passes_match_oracle(rng, case):
  _, x_shape, w_shape, strides, padding, limit, fmt, dtype, expect = case
  nchw = fmt == "NCHW"
  if nchw:
    x_shape = (x_shape[0], x_shape[3], x_shape[1], x_shape[2])
  pad = padding
  if isinstance(padding, list) and nchw:
    pad = [padding[0], padding[3], padding[1], padding[2]]
  plan = lc.plan(
    x_shape, w_shape, list(strides), pad, data_format=fmt, algorithm="fft", workspace_limit=limit
  )
  # The cases are sized for the two threads of the project's machines.
  if plan.threads <= 2:
    _check_plan(plan, strides, expect)
  ref_pad = padding if not isinstance(padding, list) else (tuple(padding[1]), tuple(padding[2]))
  ref = Conv(x_shape, w_shape, strides, ref_pad, (1, 1), fmt)
  x = rng.standard_normal(x_shape).astype(dtype)
  w = rng.standard_normal(w_shape).astype(dtype)
  dy = rng.standard_normal(ref.output_shape()).astype(dtype)
  kwargs = dict(data_format=fmt, algorithm="fft", workspace_limit=limit)
  y = lc.conv2d(x, w, list(strides), pad, **kwargs)
  dx = lc.conv2d_backprop_input(x_shape, w, dy, list(strides), pad, **kwargs)
  dw = lc.conv2d_backprop_filter(x, w_shape, dy, list(strides), pad, **kwargs)
  ref.check_passes(
    dtype, planned_fft(plan.passes), x, w, dy, y=y.numpy(), dx=dx.numpy(), dw=dw.numpy()
  )


def test_plan_counts_the_decimated_transforms():
  """The cost model counts the strided transforms at their decimated size: a stride of 2
  dividing the transform takes three quarters of the inverse transforms' points (forward)
  and of the stuffed tiles' (the gradients) out of the count."""
  shape, filt = (4, 128, 128, 8), (31, 31, 8, 8)
  plan = lc.plan(shape, filt, [2, 2], "SAME", algorithm="fft")
  for p in plan.passes:
    fh, fw = p.fft_size
    assert fh % 2 == 0 and fw % 2 == 0, p
    work = p.fft_work
    full = work["transforms"] * fh * fw
    tiles = shape[0] * p.tiles[0] * p.tiles[1]
    stuffed = tiles * filt[3]  # out_backprop channels (forward: the outputs) per tile
    if p.name == "backprop_input":
      stuffed *= -(-filt[2] // p.out_block)
    elif p.name == "backprop_filter":
      stuffed *= -(-filt[2] // p.in_block)
    assert work["transform_points"] == pytest.approx(full - 0.75 * stuffed * fh * fw), p
