"""Bad input raises a clear error naming the argument, in eager and tf.function alike;
nothing crashes the process."""

import numpy as np
import pytest
import subproc
import tensorflow as tf

import tf_largeconv as lc
from tf_largeconv import _loader

OpError = tf.errors.InvalidArgumentError
# Strides or dilations in the batch or depth dimension: what TensorFlow's kernels raise.
Unimplemented = tf.errors.UnimplementedError
X = np.zeros((1, 8, 8, 3), np.float32)
W = np.zeros((3, 3, 3, 4), np.float32)

# (id, kwargs overriding the defaults, eager exception, traced exception, message regex)
BAD = [
  (
    "rank3_input",
    dict(input=np.zeros((8, 8, 3), np.float32)),
    OpError,
    ValueError,
    "input must be a 4-D tensor",
  ),
  (
    "rank2_filter",
    dict(filters=np.zeros((3, 3), np.float32)),
    OpError,
    ValueError,
    "filter must be a 4-D tensor",
  ),
  (
    "channel_mismatch",
    dict(input=np.zeros((1, 8, 8, 5), np.float32)),
    OpError,
    ValueError,
    "input depth 5 must be a positive multiple of filters in-depth",
  ),
  (
    "groups_do_not_divide_out",
    dict(input=np.zeros((1, 8, 8, 6), np.float32), filters=np.zeros((3, 3, 3, 5), np.float32)),
    OpError,
    ValueError,
    "out-depth.*5.*divisible by the number of groups 2",
  ),
  ("zero_stride", dict(strides=[1, 0, 1, 1]), OpError, ValueError, "strides must be positive"),
  ("negative_stride", dict(strides=-1), OpError, ValueError, "strides must be positive"),
  (
    "stride_length_3",
    dict(strides=[1, 1, 1]),
    ValueError,
    ValueError,
    "strides should be of length 1, 2 or 4",
  ),
  (
    "batch_stride",
    dict(strides=[2, 1, 1, 1]),
    Unimplemented,
    Unimplemented,
    "strides must be 1 in the batch and depth",
  ),
  ("float_stride", dict(strides=1.5), ValueError, ValueError, "strides must"),
  # Equal to 1 but not ints: they must not find the kernel of strides=1 (ops._dispatch.eager_key).
  ("float_one_stride", dict(strides=1.0), ValueError, ValueError, "strides must"),
  ("bool_stride", dict(strides=True), ValueError, ValueError, "strides must contain only"),
  (
    "bool_dilations",
    dict(dilations=[True, 1]),
    ValueError,
    ValueError,
    "dilations must contain only",
  ),
  ("zero_dilation", dict(dilations=[1, 0]), OpError, ValueError, "dilations must be positive"),
  (
    "depth_dilation",
    dict(dilations=[1, 1, 1, 2]),
    Unimplemented,
    Unimplemented,
    "dilations must be 1 in the batch and depth",
  ),
  ("bad_padding_string", dict(padding="FULL"), ValueError, ValueError, "padding must be"),
  (
    "explicit_string",
    dict(padding="EXPLICIT"),
    ValueError,
    ValueError,
    "'EXPLICIT' is not a valid value for `padding`",
  ),
  (
    "explicit_three_pairs",
    dict(padding=[[0, 0], [1, 1], [1, 1]]),
    ValueError,
    ValueError,
    "When padding is a list, it must be of size 4",
  ),
  (
    "explicit_not_pairs",
    dict(padding=[0, 1, 1, 0]),
    ValueError,
    ValueError,
    "each element of `padding` must be a list/tuple of size 2",
  ),
  (
    "explicit_negative",
    dict(padding=[[0, 0], [-1, 1], [1, 1], [0, 0]]),
    OpError,
    ValueError,
    "explicit_paddings must be non-negative",
  ),
  (
    "explicit_batch",
    dict(padding=[[1, 0], [1, 1], [1, 1], [0, 0]]),
    OpError,
    ValueError,
    "explicit_paddings must be 0 in the batch and depth",
  ),
  ("bad_data_format", dict(data_format="NCWH"), ValueError, ValueError, "data_format"),
  (
    "filter_too_large_valid",
    dict(filters=np.zeros((9, 3, 3, 4), np.float32)),
    OpError,
    ValueError,
    "filters height 9 is larger than the padded input height 8",
  ),
  (
    "dilated_filter_too_large",
    dict(dilations=4),
    OpError,
    ValueError,
    r"filters height 3 \(dilated to 9\) is larger than the padded input height 8",
  ),
  (
    "zero_size_filter",
    dict(filters=np.zeros((0, 3, 3, 4), np.float32)),
    OpError,
    ValueError,
    "filters height must be positive",
  ),
  (
    "mixed_dtypes",
    dict(filters=tf.zeros((3, 3, 3, 4), tf.float64)),
    TypeError,
    TypeError,
    "filters must have the same dtype as input",
  ),
  (
    "int8_dtype",
    dict(input=np.zeros((1, 8, 8, 3), np.int8), filters=np.zeros((3, 3, 3, 4), np.int8)),
    TypeError,
    TypeError,
    "input must have dtype",
  ),
]


def _call(overrides):
  kw = dict(input=X, filters=W, strides=1, padding="VALID", data_format="NHWC", dilations=None)
  kw.update(overrides)
  return kw


@pytest.mark.parametrize(
  "overrides,eager_exc,traced_exc,msg", [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_eager_errors(overrides, eager_exc, traced_exc, msg):
  with pytest.raises(eager_exc, match=msg):
    lc.conv2d(**_call(overrides))


@pytest.mark.parametrize(
  "overrides,eager_exc,traced_exc,msg", [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_eager_errors_after_a_good_call_of_the_same_tensors(overrides, eager_exc, traced_exc, msg):
  # Eager calls of tensors look their kernel up (ops._dispatch.eager_key); a good call of tensors of
  # the same shapes first leaves its kernel there, which the bad one must not find.
  kw = {k: tf.constant(v) if isinstance(v, np.ndarray) else v for k, v in _call(overrides).items()}
  lc.conv2d(**{k: tf.constant(v) if isinstance(v, np.ndarray) else v for k, v in _call({}).items()})
  with pytest.raises(eager_exc, match=msg):
    lc.conv2d(**kw)


@pytest.mark.parametrize(
  "overrides,eager_exc,traced_exc,msg", [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_traced_errors(overrides, eager_exc, traced_exc, msg):
  kw = _call(overrides)
  x, w = kw.pop("input"), kw.pop("filters")
  fn = tf.function(lambda a, b: lc.conv2d(a, b, **kw))
  with pytest.raises(traced_exc, match=msg):
    fn(tf.constant(x), tf.constant(w))


@pytest.mark.parametrize(
  "overrides,eager_exc,traced_exc,msg", [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_gradient_call_errors(overrides, eager_exc, traced_exc, msg):
  kw = _call(overrides)
  x, w = tf.Variable(kw.pop("input")), tf.Variable(kw.pop("filters"))
  with pytest.raises(eager_exc, match=msg):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(lc.conv2d(x, w, **kw))
    tape.gradient(loss, [x, w])


def test_raw_op_attr_errors_name_the_attr():
  ops = _loader.ops()
  with pytest.raises(OpError, match="strides must have 4 entries"):
    ops.large_conv_conv2d(X, W, strides=[1, 1, 1], padding="SAME")
  with pytest.raises(OpError, match="explicit_paddings must have 8 entries"):
    ops.large_conv_conv2d(X, W, strides=[1, 1, 1, 1], padding="EXPLICIT", explicit_paddings=[1, 1])
  with pytest.raises(OpError, match="explicit_paddings must be empty unless"):
    ops.large_conv_conv2d(X, W, strides=[1, 1, 1, 1], padding="SAME", explicit_paddings=[0] * 8)
  with pytest.raises((OpError, ValueError), match="padding"):
    ops.large_conv_conv2d(X, W, strides=[1, 1, 1, 1], padding="FULL")


def test_backprop_op_errors():
  dy = np.zeros((1, 6, 6, 4), np.float32)
  with pytest.raises(OpError, match="input_sizes must be a vector of 4"):
    lc.conv2d_backprop_input([8, 8, 3], W, dy, 1, "VALID")
  with pytest.raises(OpError, match="input_sizes must be non-negative"):
    lc.conv2d_backprop_input([1, -8, 8, 3], W, dy, 1, "VALID")
  with pytest.raises(OpError, match="out_backprop has shape"):
    lc.conv2d_backprop_input([1, 8, 8, 3], W, np.zeros((1, 5, 6, 4), np.float32), 1, "VALID")
  with pytest.raises(OpError, match="filter_sizes must be a vector of 4"):
    lc.conv2d_backprop_filter(X, [3, 3, 3], dy, 1, "VALID")
  with pytest.raises(OpError, match="out_backprop has shape"):
    lc.conv2d_backprop_filter(X, [3, 3, 3, 4], np.zeros((1, 6, 6, 5), np.float32), 1, "VALID")


def test_rank3_input_does_not_kill_the_process():
  # tf.nn.conv2d's oneDNN kernel aborts the process on this input; ours must raise. A child
  # process, so that an abort fails this test instead of ending the run; it imports the
  # package under test (subproc), whatever the working directory.
  code = (
    "import numpy as np, tensorflow as tf, tf_largeconv as lc\n"
    "try:\n"
    "  lc.conv2d(np.zeros((8, 8, 3), np.float32), np.zeros((3, 3, 3, 4), np.float32),"
    " 1, 'SAME')\n"
    "except tf.errors.InvalidArgumentError as e:\n"
    "  print('raised:', e.message)\n"
  )
  out = subproc.run(code, timeout=120)
  assert "raised:" in out.stdout and "input must be a 4-D tensor" in out.stdout, subproc.describe(
    out, out.stdout, out.stderr
  )


def test_missing_library_names_path_and_rebuild_command():
  with pytest.raises(ImportError, match=r"_no_such_lib\*\.so.*not found in .*make build"):
    _loader._library_path("_no_such_lib")


def test_stale_build_names_versions_and_rebuild_command(monkeypatch):
  from tf_largeconv import _build_info

  monkeypatch.setattr(_build_info, "TF_VERSION", "1.0.0")
  with pytest.raises(
    ImportError,
    match=r"built against TensorFlow 1\.0\.0 but TensorFlow "
    r"2\.\d+\.\d+ is installed.*make build",
  ):
    _loader._check_build_version()


def test_build_version_check_is_per_minor_release(monkeypatch):
  # A wheel is built per TensorFlow minor release: another patch release of it passes the
  # check, another minor release does not, and the message names what to install.
  import tensorflow as tf

  from tf_largeconv import _build_info

  major, minor = tf.__version__.split(".")[:2]
  monkeypatch.setattr(_build_info, "TF_VERSION", f"{major}.{minor}.97")
  _loader._check_build_version()
  monkeypatch.setattr(_build_info, "TF_VERSION", f"{major}.{int(minor) - 1}.0")
  with pytest.raises(ImportError) as raised:
    _loader._check_build_version()
  message = str(raised.value)
  assert f"loads into TensorFlow {major}.{int(minor) - 1}.x only" in message, message
  assert f"'tensorflow-cpu=={major}.{int(minor) - 1}.*'" in message, message
  assert f"wheel built for TensorFlow {major}.{minor}" in message, message


@pytest.mark.parametrize(
  "kind,exception",
  [
    ("invalid_argument", ValueError),
    ("unimplemented", NotImplementedError),
    ("resource_exhausted", MemoryError),
    ("internal", RuntimeError),
  ],
)
def test_core_error_kinds_become_their_python_classes(kind, exception):
  """The one mapping both pybind modules raise through (cc/py/args.h ThrowIfError): only an
  invalid argument is a ValueError; a missing capability, memory and internal failures are
  not, whatever their message."""
  with pytest.raises(exception, match=f"^{kind} happened$") as info:
    _loader.core()._raise_status(kind, f"{kind} happened")
  assert info.type is exception  # not a subclass standing in for it
  assert (info.type is ValueError) == (kind == "invalid_argument")
  _loader.core()._raise_status("ok", "nothing")  # success raises nothing


@pytest.mark.parametrize(
  "overrides,eager_exc,traced_exc,msg", [b[1:] for b in BAD], ids=[b[0] for b in BAD]
)
def test_portable_errors_are_the_ops(overrides, eager_exc, traced_exc, msg):
  """algorithm='portable' (stock TF ops, routed in Python) raises what the op raises,
  eager and traced."""
  kw = dict(_call(overrides), algorithm="portable")
  with pytest.raises(eager_exc, match=msg):
    lc.conv2d(**kw)
  x, w = kw.pop("input"), kw.pop("filters")
  fn = tf.function(lambda a, b: lc.conv2d(a, b, **kw))
  with pytest.raises(traced_exc, match=msg):
    fn(tf.constant(x), tf.constant(w))


def test_portable_backprop_errors_are_the_ops():
  dy = np.zeros((1, 6, 6, 4), np.float32)
  kw = dict(algorithm="portable")
  with pytest.raises(OpError, match="input_sizes must be a vector of 4"):
    lc.conv2d_backprop_input([8, 8, 3], W, dy, 1, "VALID", **kw)
  with pytest.raises(OpError, match="input_sizes must be non-negative"):
    lc.conv2d_backprop_input([1, -8, 8, 3], W, dy, 1, "VALID", **kw)
  with pytest.raises(
    OpError,
    match=r"out_backprop has shape \[1, 5, 6, 4\] but the "
    r"convolution produces \[1, 6, 6, 4\]",
  ):
    lc.conv2d_backprop_input([1, 8, 8, 3], W, np.zeros((1, 5, 6, 4), np.float32), 1, "VALID", **kw)
  with pytest.raises(OpError, match="filter_sizes must be a vector of 4"):
    lc.conv2d_backprop_filter(X, [3, 3, 3], dy, 1, "VALID", **kw)
  with pytest.raises(OpError, match="out_backprop has shape"):
    lc.conv2d_backprop_filter(X, [3, 3, 3, 4], np.zeros((1, 6, 6, 5), np.float32), 1, "VALID", **kw)
