"""The command line's help texts, for someone who does not program."""

TOP = """\
tf_largeconv's command line: slides (whole-slide images, mosaics: images larger than
memory) through a large convolution or a whole Keras model, chunk by chunk into zarr or
OME-Zarr, resumably; the planner's plans; what this installation runs.

  tf-largeconv conv INPUT OUTPUT --filter FILTER.npy [options]
  tf-largeconv model MODEL.keras INPUT OUTPUT [options]
  tf-largeconv plan --input-shape 1,4096,4096,3 --filter-shape 101,101,3,8
  tf-largeconv plan --model MODEL.keras --image-shape 4096,4096,3
  tf-largeconv info

(`python -m tf_largeconv` is the same.) `tf-largeconv COMMAND --help` explains each.
"""

EXIT_CODES = """
Exit status: 0 done; 1 the run failed (a write failed, e.g. the disk is full; a task
failed; the scheduler could not be reached): fix the cause and run the same command with
--resume; 2 bad arguments or input, nothing written; 3 --resume refused (OUTPUT was written
by a run with another input, filter, model or options, or has no record).
"""

INPUT = """\
  INPUT   the slide: a TIFF file (.tif .tiff .svs .ndpi ...; the full-resolution level
          unless --level), an OME-Zarr image (NGFF 0.4 or 0.5: level --level, its axes
          and channel axis from its metadata), a zarr array (a directory) or a numpy .npy
          file.
            2-D array, H x W:      a grayscale slide (one channel).
            3-D array, H x W x C:  C channels, e.g. RGB (C x H x W with --channels-first).
"""

OUTPUT = """\
          An OUTPUT ending in .ome.zarr (or --format ome-zarr) is an OME-Zarr image with
          axes c, y, x (y, x for one channel from a 2-D filter), a pyramid of --levels
          levels and the pixel size of the input's metadata times the output's stride;
          napari, QuPath and OMERO open it.
          Inside OUTPUT, .largeconv-record/ records the chunks written and what the run
          was. An existing OUTPUT is an error unless --overwrite (start again) or --resume
          (compute only the chunks not recorded; refused if the input or options differ
          from the run that wrote it).
"""

MEMORY = """
Memory: SIZE is a number of MiB (256) or a number with a unit: KiB, MiB, GiB, TiB
(powers of 1024: 256MiB, 1GiB) or B, KB, MB, GB, TB, K, M, G, T (powers of 1000: 512M).
--task-memory bounds one task; --memory-limit bounds all the tasks that run at once
together: the line printed before the run says how many run at once and how much each may
hold, and when fewer than this machine's cores run, that it lowered them to fit. Each
process running tasks also pays about 0.5 GiB once for TensorFlow, outside both limits.

Without --scheduler the work runs on this machine. With --scheduler it runs on a
dask.distributed cluster (start one with `dask scheduler` and `dask worker ADDRESS`); the
workers must see INPUT and OUTPUT at the same paths. The command does not change a
cluster's threads: a --memory-limit they would exceed is refused.

Progress: chunks done / total, rate and time left, then a summary: chunks computed,
already done (resumed), computed again (in flight when an earlier run stopped), retried
(their worker was lost); wall time; output megapixels per second.
"""

FILTER_HELP = "filter weights, h x w or h x w x C x OUT (numpy .npy)"

CONV = (
  """\
Convolve a slide with a filter, and write the result as a zarr array or an OME-Zarr image.
The slide is read and convolved piece by piece (tiles of --tile x --tile pixels), so it
never has to fit in memory; the result is exactly what convolving the whole image at once
would give. Each output chunk is recorded when it is written, so a run that was stopped
(killed, a machine gone) continues with --resume where it stopped.

What goes in:
"""
  + INPUT
  + """\
          Integer pixels (e.g. 8-bit RGB) are converted to float32 (see --dtype); other
          pixel types (complex, text, ...) are refused.
  FILTER  a numpy .npy file (numpy.save) holding the filter weights:
            2-D, h x w:               applied to each channel separately; the output has
                                      as many channels as the slide.
            4-D, h x w x C x OUT:     a full convolution: C must be the slide's channels,
                                      OUT is the number of output channels.
          Each output pixel is the sum of filter x the h x w pixels around it (a
          correlation, as in TensorFlow: the filter is not flipped).

What comes out:
  OUTPUT  a zarr directory holding an array of float32 (or --dtype): H' x W' for a
          grayscale slide and a 2-D filter, otherwise H' x W' x OUT (OUT x H' x W' with
          --channels-first), chunked by tile. With --padding same, H' = ceil(H / stride),
          W' likewise; with valid, H' = floor((H - h) / stride) + 1.
"""
  + OUTPUT
  + """
Internally a slide is a 4-D array in TensorFlow's NHWC layout: H x W becomes
1 x H x W x 1, H x W x C becomes 1 x H x W x C (C x H x W: NCHW, 1 x C x H x W).

Examples:
  tf-largeconv conv slide.svs blurred.zarr --filter gauss101.npy
  tf-largeconv conv slide.tif out.zarr --filter f.npy --strides 4 --memory-limit 4GiB
  tf-largeconv conv slide.ome.zarr out.ome.zarr --filter f.npy --resume
"""
)

CONV_EPILOG = (
  """\
Per task: its window (tile + filter - 1 on each axis, times the channels), its output
chunk, at most --workspace-limit of scratch, plus the input chunks around it. --tile
(default 2048, rounded up to a multiple of --strides; --chunk is its old spelling) sets
it: a smaller tile, less memory per task and more tasks. A task larger than --task-memory
(default: a worker thread's share of the worker's memory limit, or of this machine's
available memory) is refused before anything runs.
"""
  + MEMORY
)

MODEL = (
  """\
Run a Keras model (a .keras file) over a slide too large for the model's activations, and
write its output as a zarr array or an OME-Zarr image. The model runs tile by tile; each
tile reads only the part of the slide it needs, and the result equals running the model
on the whole slide at once (up to float rounding).

What goes in:
  MODEL   a Keras 3 model saved with model.save('MODEL.keras'), channels last, taking
          images of any size: (batch, height, width, channels). Its layers must be ones
          tf_largeconv.stream can run on tiles (convolutions, pooling, upsampling,
          normalization, merges, ...); the error names any that cannot.
"""
  + INPUT
  + """\
          Integer pixels are converted to the model's input type.

What comes out:
  OUTPUT  a zarr directory holding the model's output for the slide, H' x W' x C' (the
          batch axis dropped), chunked by tile.
"""
  + OUTPUT
  + """
Examples:
  tf-largeconv model unet.keras slide.ome.zarr mask.ome.zarr --memory-limit 4GiB
  tf-largeconv model net.keras slide.tif feat.zarr --tile 2048 --scheduler tcp://10.0.0.5:8786
"""
)

MODEL_EPILOG = (
  """\
Per task: the tile's estimated peak (its layers' windows; `tf-largeconv plan --model`
prints it) and the slide's read chunks its window overlaps (--read-chunk). --tile sets the
tile; without it, the tile is the largest whose task fits --task-memory (default:
--memory-limit, default 1GiB, divided by the tasks that run at once).
"""
  + MEMORY
)

PLAN = """\
Print what would run, computing nothing: the op planner's plan for a convolution of the
given shapes (each pass's algorithm, workspace and estimated time), and/or the stream plan
of a Keras model over an image of the given shape (tiles, halo per layer, recomputed share,
estimated peak per tile).

Examples:
  tf-largeconv plan --input-shape 1,4096,4096,3 --filter-shape 101,101,3,8
  tf-largeconv plan --input-shape 1x512x512x8 --filter-shape 31x31x8x8 --strides 2 \\
      --workspace-limit 16MiB
  tf-largeconv plan --model unet.keras --image-shape 4096,4096,3 --task-memory 512MiB
"""

# Per subcommand: its line in the overview, its description and its epilog.
COMMANDS = {
  "conv": dict(
    help="convolve a slide with a filter into zarr or OME-Zarr",
    description=CONV,
    epilog=CONV_EPILOG + EXIT_CODES,
  ),
  "model": dict(
    help="run a saved Keras model over a slide into zarr or OME-Zarr",
    description=MODEL,
    epilog=MODEL_EPILOG + EXIT_CODES,
  ),
  "plan": dict(
    help="print the op planner's plan for shapes, or a model's stream plan",
    description=PLAN,
    epilog=EXIT_CODES,
  ),
  "info": dict(
    help="what this installation runs (tf_largeconv.info())",
    description="Print tf_largeconv.info(): versions, kernels, the op library, fallbacks.",
  ),
}
