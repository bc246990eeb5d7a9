"""ConvProblem: each way of building it gives the output shapes TensorFlow's own functions
give (tf.nn.conv2d, conv1d, conv3d, conv2d_transpose, depthwise_conv2d are the oracle),
its extent and padding agree with them, and bad arguments raise errors naming the
argument."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from tf_largeconv import _args
from tf_largeconv import _loader
from tf_largeconv._options import OPTIONS
from tf_largeconv._problem import ConvProblem


def _zeros(shape):
  return tf.zeros(shape, tf.float32)


# (input NHWC, filter, strides, padding, dilations): odd sizes, strides, dilations and
# explicit padding; TF's CPU kernel takes strides and dilations together only in 1.
CASES_2D = [
  ((2, 17, 13, 3), (4, 3, 3, 5), 1, "SAME", 1),
  ((1, 17, 13, 3), (4, 3, 3, 5), [2, 3], "SAME", 1),
  ((1, 17, 13, 4), (5, 2, 2, 6), [3, 1], "VALID", 1),
  ((1, 17, 13, 3), (3, 3, 3, 2), 1, "VALID", [2, 3]),
  ((1, 17, 13, 3), (3, 4, 3, 2), 1, "SAME", 2),
  ((1, 9, 11, 2), (3, 3, 2, 4), 2, [[0, 0], [1, 4], [0, 2], [0, 0]], 1),
]


@pytest.mark.parametrize("x, f, strides, padding, dilations", CASES_2D)
def test_conv2d_shapes_extents_and_paddings_are_tensorflows(x, f, strides, padding, dilations):
  want = tf.nn.conv2d(_zeros(x), _zeros(f), strides, padding, dilations=dilations).shape
  problem = ConvProblem.conv2d(strides, padding, "NHWC", dilations).bind(x, f)
  assert tuple(problem.geometry()["output_shape"]) == tuple(want)
  assert problem.static_output_shape() == tuple(want)
  for k, axis in enumerate(problem.axes()):
    # The extent: with stride 1 and VALID, TF's output loses extent - 1 rows.
    valid = tf.nn.conv2d(_zeros(x), _zeros(f), 1, "VALID", dilations=dilations).shape
    assert axis.extent == problem.extent(k) == x[1 + k] - valid[1 + k] + 1
    assert axis.out == want[1 + k]
  # The paddings: TF's values for the input padded by hand, with VALID, are its own.
  rng = np.random.default_rng(0)
  xs, fs = rng.standard_normal(x).astype(np.float32), rng.standard_normal(f).astype(np.float32)
  pads = [[0, 0]] + [[a.pad_before, a.pad_after] for a in problem.axes()] + [[0, 0]]
  by_hand = tf.nn.conv2d(tf.pad(xs, pads), fs, strides, "VALID", dilations=dilations)
  ref = tf.nn.conv2d(xs, fs, strides, padding, dilations=dilations)
  np.testing.assert_allclose(by_hand.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_conv2d_nchw_names_its_axes():
  x, f = (1, 3, 17, 13), (4, 3, 3, 5)
  problem = ConvProblem.conv2d(2, "SAME", "NCHW").bind(x, f)
  assert (problem.channel_axis, problem.spatial_axes) == (1, (2, 3))
  nhwc = tf.nn.conv2d(_zeros((1, 17, 13, 3)), _zeros(f), 2, "SAME").shape
  assert tuple(problem.geometry()["output_shape"]) == (1, 5, nhwc[1], nhwc[2])


@pytest.mark.parametrize(
  "x, f, stride, padding, dilations, fmt",
  [
    ((2, 31, 3), (5, 3, 4), 2, "SAME", 1, "NWC"),
    ((2, 31, 3), (5, 3, 4), 1, "VALID", 3, "NWC"),
    ((4, 2, 31, 3), (5, 3, 4), [1, 3, 1], "VALID", 1, "NWC"),
    ((2, 3, 31), (5, 3, 4), 2, "SAME", 1, "NCW"),
  ],
)
def test_conv1d_is_the_conv2d_of_height_one(x, f, stride, padding, dilations, fmt):
  # The oracle: tf.nn.conv1d (NCW transposed to NWC, which TF's CPU kernel needs).
  nwc = (x[0], x[2], x[1]) if fmt == "NCW" else x
  want = list(tf.nn.conv1d(_zeros(nwc), _zeros(f), stride, padding, dilations=dilations).shape)
  if fmt == "NCW":
    want = [want[0], want[2], want[1]]
  problem = ConvProblem.conv1d(stride, padding, fmt, dilations).bind(x, f)
  out = list(problem.geometry()["output_shape"])
  height = len(x) - (2 if fmt == "NWC" else 1)
  assert out[height] == 1 and out[:height] + out[height + 1 :] == want
  assert problem.extent(1) == (f[0] - 1) * dilations + 1
  assert problem.extent(0) == 1


@pytest.mark.parametrize(
  "x, f, strides, padding",
  [
    ((1, 7, 9, 8, 2), (3, 2, 4, 2, 3), [1, 2, 1, 3, 1], "SAME"),
    ((2, 7, 9, 8, 2), (3, 2, 4, 2, 3), [1, 1, 2, 1, 1], "VALID"),
  ],
)
def test_conv3d_shapes_are_tensorflows(x, f, strides, padding):
  want = tf.nn.conv3d(_zeros(x), _zeros(f), strides, padding).shape
  problem = ConvProblem.conv3d(strides, padding).bind(x, f)
  assert tuple(problem.geometry()["output_shape"]) == tuple(want)
  assert [a.out for a in problem.axes()] == list(want[1:4])
  ncdhw = ConvProblem.conv3d([1, 1] + strides[1:4], padding, "NCDHW")
  got = ncdhw.bind((x[0], x[4]) + x[1:4], f).geometry()["output_shape"]
  assert tuple(got) == (want[0], want[4]) + tuple(want[1:4])


@pytest.mark.parametrize(
  "out_shape, f, strides, padding",
  [((2, 17, 13, 3), (4, 3, 3, 5), 2, "SAME"), ((1, 16, 11, 2), (3, 5, 2, 4), [3, 2], "VALID")],
)
def test_transpose_is_the_conv2d_it_transposes(out_shape, f, strides, padding):
  # The transpose's input has the shape the problem's geometry gives for output_shape, and
  # tf.nn.conv2d_transpose maps it back to output_shape.
  problem = ConvProblem.transpose(strides, padding).bind(out_shape, f)
  y_shape = problem.geometry()["output_shape"]
  got = tf.nn.conv2d_transpose(_zeros(y_shape), _zeros(f), out_shape, strides, padding)
  assert tuple(got.shape) == out_shape
  assert problem.kind == "transpose"


@pytest.mark.parametrize(
  "x, f, strides, padding, dilations",
  [
    ((2, 17, 13, 3), (5, 4, 3, 2), [1, 2, 2, 1], "SAME", None),
    ((1, 17, 13, 4), (3, 3, 4, 1), [1, 1, 1, 1], "VALID", [2, 3]),
  ],
)
def test_depthwise_groups_one_per_channel(x, f, strides, padding, dilations):
  want = tf.nn.depthwise_conv2d(_zeros(x), _zeros(f), strides, padding, dilations=dilations)
  problem = ConvProblem.depthwise(strides, padding, None, dilations).bind(x, f)
  assert problem.filter_shape == (f[0], f[1], 1, f[2] * f[3])
  geometry = problem.geometry()
  assert tuple(geometry["output_shape"]) == tuple(want.shape)
  assert geometry["groups"] == x[3]
  # Its filter, grouped as the grouped conv2d takes it, gives TF's values.
  w = np.random.default_rng(0).standard_normal(f).astype(np.float32)
  xs = np.random.default_rng(1).standard_normal(x).astype(np.float32)
  grouped = _args.grouped_filter(tf.constant(w), x[3])
  got = tf.nn.conv2d(xs, grouped, strides, padding, dilations=dilations)
  ref = tf.nn.depthwise_conv2d(xs, w, strides, padding, dilations=dilations)
  np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
  assert _args.grouped_filter(w, x[3]).shape == grouped.shape


def test_unknown_sizes_stay_unknown():
  problem = ConvProblem.conv2d(2, "SAME").bind((None, None, 13, None), (3, 3, 3, 5))
  assert problem.static_output_shape() == (None, None, 7, 5)
  with pytest.raises(ValueError, match="known shapes"):
    problem.geometry()


def test_workspace_bound_and_attributes():
  default = _loader.core().DEFAULT_WORKSPACE_LIMIT
  assert ConvProblem.conv2d(1, "SAME").workspace_bound == default
  assert ConvProblem.conv2d(1, "SAME", workspace_limit=1 << 20).workspace_bound == 1 << 20
  assert ConvProblem.conv3d([1] * 5, "SAME", workspace_limit=0).workspace_bound == 0
  for problem in (
    ConvProblem.conv2d(
      [1, 2], [[0, 0], [1, 2], [3, 4], [0, 0]], "NHWC", 2, algorithm="fft", workspace_limit=4096
    ),
    ConvProblem.conv2d(1, "VALID", "NCHW", None, algorithm="direct"),
    ConvProblem.conv3d(
      [1, 2, 1, 1, 1], "VALID", "NDHWC", None, algorithm="auto", workspace_limit=123
    ),
  ):
    assert ConvProblem.from_attrs(problem.attrs()) == problem
    assert hash(ConvProblem.from_attrs(problem.attrs())) == hash(problem)
  # The op's attributes, with the generated wrappers' names and forms.
  # The op's attributes, with the generated wrappers' names and forms: TensorFlow's, then
  # one per option (each at its default but the one given).
  attrs = ConvProblem.conv2d([2, 3], "SAME", algorithm="DIRECT").attrs()
  options = {o.name: o.clean(o.default) for o in OPTIONS}
  assert attrs == dict(
    data_format="NHWC",
    dilations=[1, 1, 1, 1],
    explicit_paddings=[],
    padding="SAME",
    strides=[1, 2, 3, 1],
    **dict(options, algorithm="direct"),
  )
  assert options["workspace_limit"] == -1
  assert "explicit_paddings" not in ConvProblem.conv3d([1] * 5, "SAME").attrs()


BUILDERS = {
  "conv2d": (ConvProblem.conv2d, dict(strides=1, padding="SAME")),
  "transpose": (ConvProblem.transpose, dict(strides=1, padding="SAME")),
  "depthwise": (ConvProblem.depthwise, dict(strides=1, padding="SAME")),
  "conv1d": (ConvProblem.conv1d, dict(stride=1, padding="SAME")),
  "conv3d": (ConvProblem.conv3d, dict(strides=[1] * 5, padding="SAME")),
}
# (builder, argument, bad value, message)
BAD = [
  ("conv2d", "strides", [1, 1, 1], "strides should be of length 1, 2 or 4"),
  ("conv2d", "strides", 1.5, "strides must be an int or a list"),
  ("conv2d", "dilations", [1, True], "dilations must contain only ints"),
  ("conv2d", "padding", "FULL", "padding must be 'SAME', 'VALID' or a list"),
  ("conv2d", "padding", [[0, 0], [1, 1]], "When padding is a list, it must be of size 4"),
  ("conv2d", "data_format", "HWCN", "data_format must be 'NHWC' or 'NCHW'"),
  ("transpose", "padding", [[0, 0], [1], [1, 1], [0, 0]], "list/tuple of size 2"),
  ("depthwise", "dilations", [1, 2, 3], "dilations should be of length 1, 2 or 4"),
  ("conv1d", "stride", [1, 2], "stride should be of length 1 or 3"),
  ("conv1d", "padding", [[1, 1], [0, 0]], "one \\[before, after\\] pair for the width"),
  ("conv1d", "data_format", "NHC", "data_format must be 'NWC' or 'NCW'"),
  ("conv3d", "strides", [1, 1, 1, 1], "strides must have 5 entries"),
  ("conv3d", "padding", [[0, 0]] * 5, "tf.nn.conv3d has no explicit padding"),
  ("conv3d", "data_format", "NHWC", "data_format must be 'NDHWC' or 'NCDHW'"),
] + [
  (kind, arg, value, message)
  for kind, (arg, value, message) in itertools.product(
    BUILDERS,
    [
      ("algorithm", "winograd", "algorithm must be one of"),
      ("workspace_limit", -2, "workspace_limit must be None or a non-negative number"),
    ],
  )
]


@pytest.mark.parametrize("kind, arg, value, message", BAD)
def test_bad_arguments_name_themselves(kind, arg, value, message):
  build, kwargs = BUILDERS[kind]
  with pytest.raises(ValueError, match=message) as e:
    build(**dict(kwargs, **{arg: value}))
  assert f"{arg}=" in str(e.value) or arg in str(e.value)


def test_bad_dtypes_name_the_input():
  with pytest.raises(TypeError, match="input must have dtype float16.*got int32"):
    ConvProblem.depthwise(1, "SAME", dtype=tf.int32)
  with pytest.raises(TypeError, match="input must have dtype.*got uint8"):
    ConvProblem.conv2d(1, "SAME", dtype=tf.uint8)
  with pytest.raises(ValueError, match="algorithm='fft' cannot compute int32"):
    ConvProblem.conv1d(1, "SAME", algorithm="fft", dtype="int32")
  assert ConvProblem.conv2d(1, "SAME", algorithm="direct", dtype="int32").dtype == tf.int32
  # tf.nn.conv3d, which 'tf' runs, checks its own dtypes.
  assert ConvProblem.conv3d([1] * 5, "SAME", algorithm="tf", dtype="int32").dtype == tf.int32


def test_bad_shapes_name_themselves():
  with pytest.raises(ValueError, match="conv1d needs an input shape"):
    ConvProblem.conv1d(1, "SAME").bind((8, 3), (3, 3, 1))
  with pytest.raises(ValueError, match="filter_shape must be a list of ints"):
    ConvProblem.conv2d(1, "SAME").bind((1, 8, 8, 3), 3)
  with pytest.raises(ValueError, match="filter in_channels \\(dimension 2\\) 3 must equal"):
    _args.grouped_filter(np.zeros((3, 3, 3, 1)), 4)
  with pytest.raises(ValueError, match="filter must be 4-D"):
    _args.grouped_filter(np.zeros((3, 3, 3)), 3)
  with pytest.raises(ValueError, match="bind"):
    ConvProblem.conv2d(1, "SAME").geometry()
