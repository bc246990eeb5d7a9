"""Property-based tests over conv2d's whole argument space (hypothesis): valid draws match
the float64 oracle, forward and both gradients, for both algorithms; invalid draws raise
InvalidArgumentError / ValueError / TypeError naming the argument, in eager, tf.function
and gradient calls. FUZZ_EXAMPLES sets the number of draws (`make fuzz`: thousands)."""

import os

import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck
from hypothesis import assume
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from reference import Conv
from reference import planned_fft

import tf_largeconv as lc

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
SETTINGS = settings(
  max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


@st.composite
def valid_case(draw):
  fmt = draw(st.sampled_from(["NHWC", "NCHW"]))
  groups = draw(st.integers(1, 3))
  cin_g = draw(st.integers(1, 3))
  cout = groups * draw(st.integers(1, 3))
  kh, kw = draw(st.integers(1, 9)), draw(st.integers(1, 9))
  sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
  dh, dw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
  n = draw(st.integers(0, 2))
  h, w = draw(st.integers(1, 24)), draw(st.integers(1, 24))
  kind = draw(st.sampled_from(["SAME", "VALID", "EXPLICIT"]))
  pads = ((0, 0), (0, 0))
  if kind == "EXPLICIT":
    pads = tuple((draw(st.integers(0, 4)), draw(st.integers(0, 4))) for _ in range(2))
  if kind != "SAME":
    assume(h + sum(pads[0]) >= (kh - 1) * dh + 1 and w + sum(pads[1]) >= (kw - 1) * dw + 1)
  x_shape = (n, h, w, groups * cin_g) if fmt == "NHWC" else (n, groups * cin_g, h, w)
  return dict(
    x_shape=x_shape,
    w_shape=(kh, kw, cin_g, cout),
    strides=(sh, sw),
    dilations=(dh, dw),
    kind=kind,
    pads=pads,
    fmt=fmt,
    algorithm=draw(st.sampled_from(["direct", "fft"])),
    seed=draw(st.integers(0, 99)),
  )


def _padding_arg(case):
  if case["kind"] != "EXPLICIT":
    return case["kind"]
  (t, b), (l, r) = case["pads"]
  return (
    [[0, 0], [t, b], [l, r], [0, 0]] if case["fmt"] == "NHWC" else [[0, 0], [0, 0], [t, b], [l, r]]
  )


@SETTINGS
@given(valid_case())
def test_valid_draws_match_the_oracle(case):
  rng = np.random.default_rng(case["seed"])
  x = tf.constant(rng.standard_normal(case["x_shape"]))
  w = tf.constant(rng.standard_normal(case["w_shape"]))
  ref = Conv(
    case["x_shape"],
    case["w_shape"],
    case["strides"],
    case["kind"] if case["kind"] != "EXPLICIT" else case["pads"],
    case["dilations"],
    case["fmt"],
  )
  dy = tf.constant(rng.standard_normal(ref.output_shape()))
  with tf.GradientTape() as tape:
    tape.watch([x, w])
    y = lc.conv2d(
      x,
      w,
      list(case["strides"]),
      _padding_arg(case),
      data_format=case["fmt"],
      dilations=list(case["dilations"]),
      algorithm=case["algorithm"],
    )
  dx, dw = tape.gradient(y, [x, w], output_gradients=dy)
  fft = planned_fft(
    lc.plan(
      case["x_shape"],
      case["w_shape"],
      list(case["strides"]),
      _padding_arg(case),
      data_format=case["fmt"],
      dilations=list(case["dilations"]),
      dtype=tf.float64,
      algorithm=case["algorithm"],
    ).passes
  )
  ref.check_passes("float64", fft, x.numpy(), w.numpy(), dy.numpy(), y, dx, dw)


# Each mutation of a valid call: (kwargs override, exception types, message fragment).
OpError = tf.errors.InvalidArgumentError
Unimplemented = tf.errors.UnimplementedError  # batch/depth strides, as TF's kernels raise
MUTATIONS = [
  (
    lambda c: dict(input=np.zeros(c["x"].shape[1:], np.float32)),
    (OpError, ValueError),
    "input must be a 4-D tensor",
  ),
  (
    lambda c: dict(filters=np.zeros(c["w"].shape[:3], np.float32)),
    (OpError, ValueError),
    "filter must be a 4-D tensor",
  ),
  # An input depth that is no multiple of the filters' in-depth (one deeper than the
  # input: a deeper input would be a grouped convolution where the filters' is 1).
  (
    lambda c: dict(
      filters=np.zeros(c["w"].shape[:2] + (c["x"].shape[3] + 1,) + c["w"].shape[3:], np.float32)
    ),
    (OpError, ValueError),
    "input depth",
  ),
  (lambda c: dict(strides=[1, 0]), (OpError, ValueError), "strides must be positive"),
  (lambda c: dict(strides=[1, -2, 1, 1]), (OpError, ValueError), "strides must be positive"),
  (lambda c: dict(strides=[1, 1, 1]), (ValueError,), "strides should be of length"),
  (lambda c: dict(strides=[2, 1, 1, 1]), (Unimplemented,), "strides must be 1 in the"),
  (lambda c: dict(dilations=[0, 1]), (OpError, ValueError), "dilations must be positive"),
  (lambda c: dict(dilations=(1, 1, 1, 3)), (Unimplemented,), "dilations must be 1 in"),
  (lambda c: dict(padding="HALF"), (ValueError,), "padding must be"),
  (
    lambda c: dict(padding=[[0, 0], [-1, 0], [0, 0], [0, 0]]),
    (OpError, ValueError),
    "explicit_paddings must be non-negative",
  ),
  (
    lambda c: dict(padding=[[0, 1], [0, 0], [0, 0], [0, 0]]),
    (OpError, ValueError),
    "explicit_paddings must be 0 in the batch",
  ),
  (
    lambda c: dict(padding=[[0, 0], [1, 1]]),
    (ValueError,),
    "When padding is a list, it must be of size 4",
  ),
  (lambda c: dict(data_format="HWNC"), (ValueError,), "data_format"),
  (lambda c: dict(filters=tf.zeros(c["w"].shape, tf.float64)), (TypeError,), "filters must"),
  (
    lambda c: dict(
      input=np.zeros(c["x"].shape, np.int64), filters=np.zeros(c["w"].shape, np.int64)
    ),
    (TypeError,),
    "input must",
  ),
  (
    lambda c: dict(
      filters=np.zeros((c["x"].shape[1] + 5,) + c["w"].shape[1:], np.float32), padding="VALID"
    ),
    (OpError, ValueError),
    "larger than the padded input",
  ),
  (lambda c: dict(algorithm="winograd"), (ValueError,), "algorithm must be"),
  (lambda c: dict(workspace_limit=-3), (ValueError,), "workspace_limit must be"),
]


@st.composite
def invalid_call(draw):
  h, w = draw(st.integers(3, 12)), draw(st.integers(3, 12))
  c = draw(st.integers(1, 3))
  base = dict(
    x=np.ones((draw(st.integers(1, 2)), h, w, c), np.float32),
    w=np.ones(
      (draw(st.integers(1, 3)), draw(st.integers(1, 3)), c, draw(st.integers(1, 3))), np.float32
    ),
  )
  mutate, excs, message = draw(st.sampled_from(MUTATIONS))
  kw = dict(
    input=base["x"],
    filters=base["w"],
    strides=1,
    padding="SAME",
    data_format="NHWC",
    dilations=None,
  )
  kw.update(mutate(base))
  return kw, excs, message, draw(st.sampled_from(["eager", "function", "gradient"]))


@SETTINGS
@given(invalid_call())
def test_invalid_draws_raise_clear_errors(call):
  kw, excs, message, mode = call
  try:
    if mode == "eager":
      lc.conv2d(**kw)
    elif mode == "function":
      x, w = kw.pop("input"), kw.pop("filters")
      tf.function(lambda a, b: lc.conv2d(a, b, **kw))(tf.constant(x), tf.constant(w))
    else:
      x, w = tf.Variable(kw.pop("input")), tf.Variable(kw.pop("filters"))
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(lc.conv2d(x, w, **kw))
      tape.gradient(loss, [x, w])
  except excs as e:
    assert message in str(e), (message, str(e)[:500])
    return
  raise AssertionError(f"no error for {message!r} in {mode} mode")
