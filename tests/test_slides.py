"""Scanners' slides through OpenSlide (the `slides` extra): files written by tifffile as an
Aperio SVS and as a generic tiled TIFF pyramid, read window by window at each level by
`tf_largeconv.dask.open_slide`, against the arrays that were written; the two readers
(OpenSlide and tifffile) against each other; a convolution over a slide against the op on
the array in memory; and files that cannot be read. Skipped only where the `slides` or
`dask` extra is absent."""

import os
import pickle

import numpy as np
import pytest

pytest.importorskip("dask")
tifffile = pytest.importorskip("tifffile")
openslide = pytest.importorskip("openslide")

import tf_largeconv as lc  # noqa: E402
import tf_largeconv.dask as ldask  # noqa: E402
from tf_largeconv.dask import _slides  # noqa: E402

APERIO = "Aperio Image Library v12.0.15\n{w}x{h} [0,0 {w}x{h}] (128x128) RGB|AppMag = 20|MPP = 0.5"


def _pyramid(rng, height=300, width=410):
  """Level 0 and level 1 (every second pixel) of an RGB slide."""
  level0 = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
  return level0, np.ascontiguousarray(level0[::2, ::2])


def _write(path, levels, description=None):
  """A tiled TIFF with one page per level, as OpenSlide reads pyramids: with an Aperio
  description on every page, an SVS; without, a generic tiled TIFF."""
  with tifffile.TiffWriter(path) as tif:
    for i, level in enumerate(levels):
      h, w = level.shape[:2]
      text = description.format(w=w, h=h) if description else None
      tif.write(
        level,
        tile=(128, 128),
        photometric="rgb",
        compression="zlib",
        subfiletype=1 if i else 0,
        description=text,
        metadata=None,
      )


@pytest.fixture
def svs(rng, tmp_path):
  levels = _pyramid(rng)
  path = str(tmp_path / "slide.svs")
  _write(path, levels, APERIO)
  assert openslide.OpenSlide.detect_format(path) == "aperio"
  return path, levels


def test_svs_levels_and_windows_through_openslide(svs):
  path, levels = svs
  for level, want in enumerate(levels):
    x = ldask.open_slide(path, chunk=96, level=level)
    assert x.shape == want.shape and x.dtype == np.uint8 and x.chunks[0][0] == 96
    np.testing.assert_array_equal(x.compute(), want)
  x = ldask.open_slide(path, chunk=64)
  # windows that start and end inside tiles, a stepped one, and a single channel
  np.testing.assert_array_equal(x[37:211, 55:300].compute(), levels[0][37:211, 55:300])
  np.testing.assert_array_equal(x[5:120:3, 7:9, 1].compute(), levels[0][5:120:3, 7:9, 1])
  source = _slides.OpenSlideLevel(path, level=1)
  np.testing.assert_array_equal(source[10:20, 3], levels[1][10:20, 3])
  assert source[4:4, 0:10].shape == (0, 10, 3)


def test_openslide_and_tifffile_agree_on_a_generic_tiled_tiff(rng, tmp_path):
  levels = _pyramid(rng, 260, 333)
  path = str(tmp_path / "slide.tif")
  _write(path, levels)
  assert openslide.OpenSlide.detect_format(path) == "generic-tiff"
  for level, want in enumerate(levels):
    # open_slide reads a generic TIFF through tifffile (its dtype and channels kept) ...
    through_tifffile = ldask.open_slide(path, chunk=100, level=level).compute()
    # ... and OpenSlide reads the same file to the same pixels
    through_openslide = np.asarray(_slides.OpenSlideLevel(path, level=level)[:, :])
    np.testing.assert_array_equal(through_tifffile, want)
    np.testing.assert_array_equal(through_openslide, want)


def test_a_slide_source_pickles_as_its_path(svs):
  path, levels = svs
  source = _slides.OpenSlideLevel(path, level=0)
  source[0:1, 0:1]  # opened here ...
  again = pickle.loads(pickle.dumps(source))  # ... and reopened where it is read
  assert len(pickle.dumps(source)) < 1000
  np.testing.assert_array_equal(again[100:140, 200:260], levels[0][100:140, 200:260])
  graph = dict(ldask.open_slide(path, chunk=64).__dask_graph__())
  assert len(pickle.dumps(graph)) < levels[0].nbytes // 10


def test_a_convolution_over_an_svs_equals_the_op_in_memory(svs, rng):
  path, levels = svs
  w = rng.standard_normal((9, 9, 3, 2)).astype(np.float32)
  x = ldask.open_slide(path, chunk=64).astype(np.float32)
  got = ldask.conv2d(x[None], w, 1, "SAME", algorithm="direct").compute()
  want = lc.conv2d(levels[0][None].astype(np.float32), w, 1, "SAME", algorithm="direct")
  np.testing.assert_array_equal(got, want.numpy())


def test_a_missing_level_names_the_slide_and_its_levels(svs):
  path, _ = svs
  with pytest.raises(ValueError, match=r"slide .*slide\.svs has levels 0 to 1"):
    ldask.open_slide(path, level=2)


def test_a_truncated_slide_names_the_file(svs, tmp_path):
  path, _ = svs
  cut = str(tmp_path / "cut.svs")
  with open(path, "rb") as src, open(cut, "wb") as dst:
    dst.write(src.read()[: os.path.getsize(path) // 2])
  # the tiles past the cut are missing: the error comes when they are read, naming the file
  with pytest.raises(ValueError, match=r"cut\.svs"):
    ldask.open_slide(cut, chunk=64).compute()


def test_an_unknown_format_names_the_file(tmp_path):
  bad = tmp_path / "scan.mrxs"
  bad.write_bytes(b"not a slide")
  with pytest.raises(ValueError, match=r"cannot read the slide .*scan\.mrxs through OpenSlide"):
    ldask.open_slide(str(bad))


def test_a_scanners_slide_is_channels_last(svs):
  with pytest.raises(ValueError, match=r"slide\.svs is a scanner's slide.*channels_first"):
    ldask.open_slide(svs[0], channels_first=True)


def test_transparent_pixels_lie_over_the_background(rng, tmp_path):
  rgba = rng.integers(0, 256, (130, 140, 4), dtype=np.uint8)
  rgba[..., 3] = rng.choice([0, 128, 255], (130, 140)).astype(np.uint8)
  path = str(tmp_path / "alpha.tif")
  with tifffile.TiffWriter(path) as tif:
    tif.write(rgba, tile=(128, 128), photometric="rgb", extrasamples=["unassalpha"], metadata=None)
  got = _slides.OpenSlideLevel(path)[:, :].astype(np.float64)
  alpha = rgba[..., 3:] / 255.0
  # straight alpha over white (the slide names no background colour); OpenSlide keeps the
  # colours premultiplied inside, so a half-transparent pixel may be off by one
  want = rgba[..., :3] * alpha + 255.0 * (1.0 - alpha)
  assert np.abs(got - want).max() <= 1.5
  assert (got[rgba[..., 3] == 0] == 255).all()


@pytest.fixture
def dicom(rng, tmp_path):
  """A DICOM WSI series written by wsidicom (the `slides-test` extra): one uncompressed
  instance per level, in a folder of its own."""
  pytest.importorskip("wsidicom")
  import dicom_wsi

  levels = _pyramid(rng, 300, 410)
  folder = tmp_path / "dicom"
  folder.mkdir()
  paths = dicom_wsi.write(folder, levels)
  assert len(paths) == 2
  return paths, levels


def test_dicom_wsi_levels_and_windows_through_openslide(dicom):
  paths, levels = dicom
  for path in paths:  # any file of the series opens the whole pyramid
    assert openslide.OpenSlide.detect_format(path) == "dicom"
    for level, want in enumerate(levels):
      x = ldask.open_slide(path, chunk=96, level=level)
      assert x.shape == want.shape and x.dtype == np.uint8
      np.testing.assert_array_equal(x.compute(), want)
  x = ldask.open_slide(paths[0], chunk=64)
  np.testing.assert_array_equal(x[37:211, 55:300].compute(), levels[0][37:211, 55:300])
  with pytest.raises(ValueError, match=r"slide .*\.dcm has levels 0 to 1"):
    ldask.open_slide(paths[0], level=2)


def test_a_truncated_dicom_wsi_names_the_file(dicom, tmp_path):
  paths, _ = dicom
  cut = tmp_path / "cut"
  cut.mkdir()
  for path in paths:
    with open(path, "rb") as src:
      data = src.read()
    with open(cut / os.path.basename(path), "wb") as dst:
      dst.write(data[: len(data) // 2])
  bad = str(cut / os.path.basename(paths[0]))
  with pytest.raises(ValueError, match=r"cut/.*\.dcm"):
    ldask.open_slide(bad, chunk=64).compute()
