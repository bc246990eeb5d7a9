"""tf_largeconv.stream is exact on any network of the layers it streams: random networks (a
seeded generator per example) of random kernels, strides, dilations, paddings, zero padding
and cropping, upsampling and transposed convolutions, and merges of branches across
resolutions, over random image sizes and small tiles, streamed in float64 against the
untiled model.

The tolerance is 1e-9 of the output's magnitude; with bilinear upsampling, which TensorFlow
computes in float32 whatever the input's dtype, it is float32's 2e-5. FUZZ_EXAMPLES sets
the number of networks (`make fuzz`: thousands); a failure names its seed and prints the
network.
"""

import os

import keras
import numpy as np
import pytest
from test_stream import _randomize
from test_stream import floatx

from tf_largeconv import stream

L = keras.layers
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "30"))
MAX_TILES = 48  # tiles per streamed run, to bound the time of one example
MAX_SIDE = 90  # no upsampling past this many pixels per axis


def _compare(model, image, tiles, tol, what=""):
  """Streams `model` over `image` with each tile side and compares with the untiled call."""
  ref = model(image, training=False).numpy()
  scale = float(np.abs(ref).max())
  for tile in tiles:
    got = stream.predict(model, image, tile=tile)
    assert got.shape == ref.shape, (tile, got.shape, ref.shape, what)
    err = float(np.abs(got - ref).max())
    assert err <= tol * scale, f"tile {tile}: error {err:.3g} of a magnitude {scale:.3g} {what}"


# --- The windows of tiles that lie wholly or partly inside a padding --------------------------


def _padding_after_stride():
  inp = keras.Input((None, None, 1), dtype="float64")
  x = L.DepthwiseConv2D(4, strides=2, padding="same")(inp)
  return keras.Model(inp, L.ZeroPadding2D(((3, 2), (0, 3)))(x))


def _padding_of_a_merge():
  inp = keras.Input((None, None, 2), dtype="float64")
  x = L.Dense(3)(L.ZeroPadding2D(((0, 0), (1, 3)))(inp))
  x = L.Add()([x, L.Conv2D(3, 1)(x)])
  return keras.Model(inp, L.ZeroPadding2D(((2, 1), (3, 2)))(x))


@pytest.mark.parametrize(
  "make, shape, tiles",
  [
    # The last tile column reads none of the strided convolution's output: all padding.
    (_padding_after_stride, (2, 40, 56, 1), (13, 14, 16, 32)),
    # A tile whose window lies wholly inside the first padding, past the image's end.
    (_padding_of_a_merge, (2, 21, 99, 2), (8, 16)),
  ],
)
def test_tiles_inside_a_padding(make, shape, tiles):
  with floatx("float64"):
    model = _randomize(make(), seed=3)
  _compare(model, np.random.default_rng(4).standard_normal(shape), tiles, 1e-9)


def test_tile_inside_a_padding_to_dask():
  da = pytest.importorskip("dask.array")
  with floatx("float64"):
    model = _randomize(_padding_after_stride(), seed=3)
  image = np.random.default_rng(4).standard_normal((104, 56, 1))
  ref = model(image[None]).numpy()[0]
  lazy = stream.to_dask(model, da.from_array(image, chunks=(30, 20, 1)), tile=13)
  got = lazy.compute(scheduler="sync")
  assert np.abs(got - ref).max() <= 1e-9 * np.abs(ref).max()


# --- Random networks --------------------------------------------------------------------------


class Net:
  """A random network as data (printed when an example fails): `ops` are
  (layer class name, its arguments, the indices of the values it reads; value 0 is the
  input), built by `model()`. The spatial size and channels of every value are tracked
  with the layers' own `compute_output_shape` while drawing."""

  def __init__(self, rank, sizes, channels, batch):
    self.rank, self.sizes, self.channels, self.batch = rank, sizes, channels, batch
    self.ops = []
    self.shapes = [(tuple(sizes), channels)]
    self.bilinear = False
    self.tile = 1

  def __repr__(self):
    ops = "".join(f"\n  {op}" for op in self.ops)
    image = (self.batch, *self.sizes, self.channels)
    return f"Net(rank={self.rank}, image={image}, tile={self.tile}){ops}"

  def arg(self, values):
    return values[0] if self.rank == 1 else tuple(values)

  def add(self, name, kwargs, inputs):
    if name in MERGES:
      sizes = self.shapes[inputs[0]][0]
      cs = [self.shapes[i][1] for i in inputs]
      channels = sum(cs) if name == "Concatenate" else cs[0]
    else:
      shape = getattr(L, name)(**kwargs).compute_output_shape((1, *self.shapes[inputs[0]][0], 1))
      sizes, channels = tuple(int(n) for n in shape[1:-1]), kwargs.get("filters")
      channels = channels or kwargs.get("units") or self.shapes[inputs[0]][1]
      channels *= kwargs.get("depth_multiplier", 1)
    self.ops.append((name, kwargs, inputs))
    self.shapes.append((sizes, channels))
    return len(self.shapes) - 1

  def model(self):
    inp = keras.Input((None,) * self.rank + (self.channels,), dtype="float64")
    values = [inp]
    for name, kwargs, inputs in self.ops:
      layer = getattr(L, name)(**kwargs)
      args = [values[i] for i in inputs]
      values.append(layer(args if name in MERGES else args[0]))
    return keras.Model(inp, values[-1])


MERGES = ("Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum", "Concatenate")


def _per_axis(r, net, lo, hi):
  return [r.int(lo, hi) for _ in range(net.rank)]


def _conv(r, net, src):
  sizes = net.shapes[src][0]
  kind = r.pick(["Conv", "DepthwiseConv", "SeparableConv"])
  kernel = _per_axis(r, net, 1, 5)
  strides, dilations = [1] * net.rank, [1] * net.rank
  if r.bool():
    strides = _per_axis(r, net, 1, 3)
    if kind != "Conv":  # TensorFlow's depthwise convolution takes one stride for all axes
      strides = [strides[0]] * net.rank
  else:
    dilations = _per_axis(r, net, 1, 3)
  causal = net.rank == 1 and kind == "Conv"
  padding = r.pick(["valid", "same"] + ["causal"] * causal)
  if padding == "valid" and any((k - 1) * d + 1 > n for k, d, n in zip(kernel, dilations, sizes)):
    padding = "same"
  kwargs = dict(kernel_size=net.arg(kernel), strides=net.arg(strides), padding=padding)
  kwargs["dilation_rate"] = net.arg(dilations)
  if kind == "DepthwiseConv":
    kwargs["depth_multiplier"] = r.int(1, 2)
  else:
    kwargs["filters"] = r.int(1, 4)
  return net.add(f"{kind}{net.rank}D", kwargs, [src])


def _pool(r, net, src):
  sizes = net.shapes[src][0]
  pool, strides = _per_axis(r, net, 1, 3), _per_axis(r, net, 1, 3)
  padding = r.pick(["valid", "same"])
  if any(p > n for p, n in zip(pool, sizes)):
    padding = "same"
  kind = r.pick(["Max", "Average"])
  kwargs = dict(pool_size=net.arg(pool), strides=net.arg(strides), padding=padding)
  return net.add(f"{kind}Pooling{net.rank}D", kwargs, [src])


def _transpose(r, net, src):
  strides = _per_axis(r, net, 1, 3)
  if any(n * s > MAX_SIDE for n, s in zip(net.shapes[src][0], strides)):
    return _pool(r, net, src)
  kwargs = dict(
    filters=r.int(1, 3),
    kernel_size=net.arg(_per_axis(r, net, 1, 4)),
    strides=net.arg(strides),
    padding=r.pick(["valid", "same"]),
  )
  return net.add(f"Conv{net.rank}DTranspose", kwargs, [src])


def _upsample(r, net, src, factors=None):
  factors = factors or _per_axis(r, net, 1, 3)
  if any(n * f > MAX_SIDE for n, f in zip(net.shapes[src][0], factors)):
    return src
  kwargs = dict(size=net.arg(factors))
  if net.rank == 2 and r.int(0, 3) == 0:
    kwargs["interpolation"] = "bilinear"
    net.bilinear = True
  return net.add(f"UpSampling{net.rank}D", kwargs, [src])


def _shift(r, net, src, name, pairs):
  if not any(a or b for a, b in pairs):
    return src
  key = "padding" if name == "ZeroPadding" else "cropping"
  return net.add(f"{name}{net.rank}D", {key: net.arg([tuple(p) for p in pairs])}, [src])


def _zero_padding(r, net, src):
  pairs = [(r.int(0, 3), r.int(0, 3)) for _ in range(net.rank)]
  return _shift(r, net, src, "ZeroPadding", pairs)


def _cropping(r, net, src):
  pairs = []
  for n in net.shapes[src][0]:
    a = r.int(0, min(3, n - 1))
    pairs.append((a, r.int(0, min(3, n - 1 - a))))
  return _shift(r, net, src, "Cropping", pairs)


def _pointwise(r, net, src):
  name = r.pick(["Dense", "BatchNormalization", "LayerNormalization", "tanh"])
  if name == "Dense":
    return net.add(name, dict(units=r.int(1, 4)), [src])
  if name == "tanh":
    return net.add("Activation", dict(activation="tanh"), [src])
  return net.add(name, {}, [src])


def _merge(r, net, src):
  """Merges `src` with an earlier value, brought to its size by pooling, upsampling, zero
  padding and cropping (and to its channels by a Dense layer), as a U-Net's skips are."""
  if src == 0:
    return _pointwise(r, net, src)
  other = r.int(0, src - 1)
  if r.bool():  # a branch of its own before it joins
    other = r.pick(LAYERS)(r, net, other)
  target, channels = net.shapes[src]
  sizes = net.shapes[other][0]
  down = [max(n // t, 1) for n, t in zip(sizes, target)]
  if max(down) > 1:
    kind = r.pick(["Max", "Average"])
    kwargs = dict(pool_size=net.arg(down), strides=net.arg(down))
    other = net.add(f"{kind}Pooling{net.rank}D", kwargs, [other])
  up = [max(t // n, 1) for n, t in zip(net.shapes[other][0], target)]
  if max(up) > 1:
    other = _upsample(r, net, other, up)
  gaps = [t - n for n, t in zip(net.shapes[other][0], target)]
  splits = [r.int(0, abs(g)) for g in gaps]
  other = _shift(
    r, net, other, "ZeroPadding", [(s, g - s) if g > 0 else (0, 0) for g, s in zip(gaps, splits)]
  )
  other = _shift(
    r, net, other, "Cropping", [(s, -g - s) if g < 0 else (0, 0) for g, s in zip(gaps, splits)]
  )
  name = r.pick(MERGES)
  if name != "Concatenate" and net.shapes[other][1] != channels:
    other = net.add("Dense", dict(units=channels), [other])
  order = [src, other] if r.bool() else [other, src]
  return net.add(name, {}, order)


LAYERS = [_conv, _pool, _transpose, _upsample, _zero_padding, _cropping, _pointwise]


class Draws:
  """Random choices from one seed."""

  def __init__(self, seed):
    self.rng = np.random.default_rng(seed)

  def int(self, lo, hi):
    return int(self.rng.integers(lo, hi + 1))

  def pick(self, options):
    return options[self.rng.integers(len(options))]

  def bool(self):
    return bool(self.rng.integers(2))


def network(seed):
  """A random chain of layers with merges, on a random image, with a small tile."""
  r = Draws(seed)
  rank = r.pick([1, 2, 2, 2])
  sizes = tuple(r.int(4, 150 if rank == 1 else 40) for _ in range(rank))
  net = Net(rank, sizes, r.int(1, 3), r.int(1, 2))
  value = 0
  for _ in range(r.int(1, 7)):
    value = r.pick(LAYERS + [_merge] * 2)(r, net, value)
  if value == 0:
    _pointwise(r, net, value)
  net.tile = r.int(1, 16)
  return net


@pytest.mark.parametrize("seed", range(EXAMPLES))
def test_random_networks_stream_exactly(seed):
  net = network(seed)
  with floatx("float64"):
    model = _randomize(net.model(), seed=seed)
  image = np.random.default_rng(seed).standard_normal((net.batch, *net.sizes, net.channels))
  tile = net.tile
  while stream.plan(model, image, tile=tile).tiles > MAX_TILES:
    tile *= 2
  _compare(model, image, (tile,), 2e-5 if net.bilinear else 1e-9, net)
