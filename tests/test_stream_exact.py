"""tf_largeconv.stream is exact on any network of the layers it streams: random networks
(hypothesis) of random kernels, strides, dilations, paddings, zero padding and cropping,
upsampling and transposed convolutions, and merges of branches across resolutions, over
random image sizes and small tiles, streamed in float64 against the untiled model.

The tolerance is 1e-9 of the output's magnitude; with bilinear upsampling, which TensorFlow
computes in float32 whatever the input's dtype, it is float32's 2e-5. FUZZ_EXAMPLES sets
the number of networks (`make fuzz`: thousands).
"""

import os

import keras
import numpy as np
import pytest
from hypothesis import HealthCheck
from hypothesis import settings
from test_stream import _randomize
from test_stream import floatx

from tf_largeconv import stream

L = keras.layers
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "30"))
SETTINGS = settings(
  max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
MAX_TILES = 48  # tiles per streamed run, to bound the time of one example
MAX_SIDE = 90  # no upsampling past this many pixels per axis


def _compare(model, image, tiles, tol):
  """Streams `model` over `image` with each tile side and compares with the untiled call."""
  ref = model(image, training=False).numpy()
  scale = float(np.abs(ref).max())
  for tile in tiles:
    got = stream.predict(model, image, tile=tile)
    assert got.shape == ref.shape, (tile, got.shape, ref.shape)
    err = float(np.abs(got - ref).max())
    assert err <= tol * scale, f"tile {tile}: error {err:.3g} of a magnitude {scale:.3g}"


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
