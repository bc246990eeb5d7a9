"""DICOM whole-slide images for the tests, written by wsidicom (a DICOM WSI writer from
PyPI): each level of a pyramid held as numpy arrays becomes one DICOM instance of tiles
stored uncompressed (Explicit VR Little Endian, lossless), so what a reader returns can be
compared pixel for pixel with the arrays."""

import copy

import numpy as np
from pydicom.uid import ExplicitVRLittleEndian
from pydicom.uid import generate_uid
from wsidicom import WsiDicom
from wsidicom.codec import Encoder
from wsidicom.geometry import Point
from wsidicom.geometry import Size
from wsidicom.geometry import SizeMm
from wsidicom.instance import ImageData
from wsidicom.instance import WsiDataset
from wsidicom.instance import WsiInstance
from wsidicom.metadata import Equipment
from wsidicom.metadata import Image
from wsidicom.metadata import Label
from wsidicom.metadata import OpticalPath
from wsidicom.metadata import Patient
from wsidicom.metadata import Pyramid
from wsidicom.metadata import Series
from wsidicom.metadata import Slide
from wsidicom.metadata import Study
from wsidicom.metadata import WsiMetadata
from wsidicom.metadata.image import ImageType
from wsidicom.metadata.sample import SlideSample
from wsidicom.metadata.schema.dicom.wsi import WsiMetadataDicomSchema
from wsidicom.source import Source

# Level 0's pixel spacing in millimetres (0.5 um); level i's is 2**i times as large.
SPACING_MM = 0.0005


class _ArrayTiles(ImageData):
  """One level, an H x W x 3 uint8 array, served as square tiles (edge tiles padded with
  white, as a scanner pads them)."""

  def __init__(self, pixels: np.ndarray, tile: int, spacing_mm: float) -> None:
    self._pixels, self._tile, self._spacing = pixels, tile, spacing_mm
    super().__init__(Encoder.create(ExplicitVRLittleEndian, 8, "RGB"))

  transfer_syntax = property(lambda self: ExplicitVRLittleEndian)
  image_size = property(lambda self: Size(self._pixels.shape[1], self._pixels.shape[0]))
  tile_size = property(lambda self: Size(self._tile, self._tile))
  pixel_spacing = property(lambda self: SizeMm(self._spacing, self._spacing))
  imaged_size = property(lambda self: None)
  samples_per_pixel = property(lambda self: 3)
  photometric_interpretation = property(lambda self: "RGB")
  bits = property(lambda self: 8)
  image_coordinate_system = property(lambda self: None)
  thread_safe = property(lambda self: True)
  lossy_compression = property(lambda self: None)  # never lossy compressed
  transcoder = property(lambda self: None)

  def get_decoded_tile(self, tile_point: Point, z: float, path: str, cache: bool = True):
    t = self._tile
    tile = np.full((t, t, 3), 255, np.uint8)
    part = self._pixels[
      tile_point.y * t : (tile_point.y + 1) * t, tile_point.x * t : (tile_point.x + 1) * t
    ]
    tile[: part.shape[0], : part.shape[1]] = part
    return tile

  def get_encoded_tile(self, tile: Point, z: float, path: str) -> bytes:
    return self.encoder.encode(self.get_decoded_tile(tile, z, path))


class _ArraySource(Source):
  """A pyramid of arrays as wsidicom's source of volume instances, with the least metadata
  a DICOM WSI must carry (study, series, slide with one sample, frame of reference)."""

  def __init__(self, levels, tile: int) -> None:
    super().__init__()
    metadata = WsiMetadata(
      Study(uid=generate_uid()),
      Series(uid=generate_uid(), number=1),
      Patient(),
      Equipment(),
      Slide(identifier="slide", samples=[SlideSample(identifier="sample", uid=generate_uid())]),
      Pyramid(Image(), [OpticalPath()], uid=generate_uid()),
      Label(),
      frame_of_reference_uid=generate_uid(),
      dimension_organization_uids=[generate_uid()],
    )
    base = WsiMetadataDicomSchema().dump(metadata, ImageType.VOLUME)
    self._base = WsiDataset(base)
    # Each instance gets its own copy: wsidicom writes the instance's UIDs into it.
    self._levels = [
      WsiInstance.create_instance(
        _ArrayTiles(pixels, tile, SPACING_MM * 2**i), copy.deepcopy(base), ImageType.VOLUME, 0
      )
      for i, pixels in enumerate(levels)
    ]

  base_dataset = property(lambda self: self._base)
  level_instances = property(lambda self: self._levels)
  label_instances = property(lambda self: [])
  overview_instances = property(lambda self: [])
  thumbnail_instances = property(lambda self: [])
  annotation_instances = property(lambda self: [])

  def close(self) -> None:
    pass


def write(folder, levels, tile=128):
  """Writes the pyramid `levels` (level 0 first, each H x W x 3 uint8, each level half the
  one before) as a DICOM WSI series into `folder`; returns the paths of its files."""
  with WsiDicom(_ArraySource(levels, tile)) as slide:
    slide.save(str(folder))
  return sorted(str(p) for p in folder.glob("*.dcm"))
