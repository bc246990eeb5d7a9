"""The documentation's pictures, drawn from the package's own geometry.

  python docs/figures.py [--check]

`geometry()` asks the package for the numbers each picture shows: the planner's overlap-save
tiling of a convolution (`tf_largeconv.plan`), the windows of a streamed model's layers for
one tile (`tf_largeconv.stream.plan`), and the input chunks and halo strips of one output
chunk of `tf_largeconv.dask.conv2d`'s graph. `draw()` turns them into PNGs under
docs/figures/, and the numbers go beside them in docs/figures/geometry.json.

Asking needs TensorFlow, the built package and dask; drawing needs matplotlib (the `docs`
extra). `make docs` runs this script first: where the package cannot be imported it keeps
the committed pictures and says so. `--check` redraws nothing and fails if the package's
geometry differs from the committed geometry.json (tests/test_docs.py runs it).
"""

import argparse
import json
import os
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE / "figures"
GEOMETRY = OUT / "geometry.json"

# The cases drawn.
CONV = dict(input_shape=(1, 240, 320, 1), filter_shape=(41, 41, 1, 1), padding="VALID")
CONV_LIMIT = 256 << 10  # a tight workspace_limit, so that the image is cut into several tiles
STREAM_IMAGE, STREAM_TILE = (1, 256, 256, 3), 64
DASK_IMAGE, DASK_CHUNK, DASK_FILTER = (1, 96, 128, 1), 32, (15, 15, 1, 1)


def _stream_model():
  """A small network: convolutions, a pooling and a dilated convolution."""
  import keras

  L = keras.layers
  inp = keras.Input((None, None, 3))
  x = L.Conv2D(8, 3, padding="same", name="conv3x3")(inp)
  x = L.Conv2D(8, 7, padding="same", name="conv7x7")(x)
  x = L.MaxPooling2D(2, name="pool2")(x)
  x = L.Conv2D(8, 5, padding="same", dilation_rate=2, name="conv5x5_dil2")(x)
  x = L.Conv2D(8, 9, padding="same", name="conv9x9")(x)
  x = L.Conv2D(4, 1, name="conv1x1")(x)
  return keras.Model(inp, x)


def conv_geometry():
  """The forward pass's plan: transform size, outputs per tile, tiles, workspace."""
  import tf_largeconv as lc

  # The FFT on 2 threads, whatever this machine has: the picture is of the FFT's tiling.
  p = lc.plan(
    CONV["input_shape"],
    CONV["filter_shape"],
    1,
    CONV["padding"],
    algorithm="fft",
    workspace_limit=CONV_LIMIT,
    num_threads=2,
  )
  fwd = p.passes[0]
  return dict(
    input=list(CONV["input_shape"][1:3]),
    filter=list(CONV["filter_shape"][:2]),
    output=list(p.output_shape[1:3]),
    algorithm=fwd.algorithm,
    fft_size=list(fwd.fft_size),
    tile=list(fwd.tile),
    tiles=list(fwd.tiles),
    slots=int(fwd.slots),
    workspace_bytes=int(fwd.workspace_bytes),
    workspace_limit=CONV_LIMIT,
  )


def stream_geometry():
  """Along the first axis, for the middle tile: each layer's computed range, in input
  pixels, and the tile's own share of it."""
  from tf_largeconv import stream
  from tf_largeconv.stream import _plan

  p = stream.plan(_stream_model(), STREAM_IMAGE, tile=STREAM_TILE)
  tiling = p.tiling
  g = tiling.geometry
  middle = _plan.middle_tile(tiling)
  share = tiling.bounds[0][middle[0]]
  sink = g.sink_scale[0]
  layers = [("input", tiling.window(middle, 0)[0], 1.0)]
  for step in g.spatial_steps:
    spans = tiling.window(middle, step.output)
    if spans is not None:
      layers.append((step.name, spans[0], float(g.scales[step.output][0])))
  return dict(
    image=list(STREAM_IMAGE[1:3]),
    tile_in=list(p.tile_in),
    share=[float(share[0] / sink), float(share[1] / sink)],
    layers=[
      dict(name=name, start=float(a / scale), stop=float(b / scale), scale=scale)
      for name, (a, b), scale in layers
    ],
    halo={k: list(v) for k, v in p.halo.items()},
  )


def dask_geometry():
  """The input chunks, and what the middle output chunk's task reads: whole chunks and halo
  strips, in input pixels [row0, row1, col0, col1]."""
  import dask.array as da
  import numpy as np

  from tf_largeconv._problem import ConvProblem
  from tf_largeconv.dask import _graph

  x = da.zeros(DASK_IMAGE, np.float32, chunks=(1, DASK_CHUNK, DASK_CHUNK, 1))
  problem = ConvProblem.conv2d(1, "SAME", "NHWC", 1)
  f = _graph.Forward(x, np.ones(DASK_FILTER, np.float32), problem)
  edges = [list(_graph._edges(c)) for c in x.chunks]
  blocks = f.blocks.blocks
  idx, _, keys = blocks[len(blocks) // 2]
  pieces = []
  for key in keys:
    strip = f.blocks.strips.get(key)
    chunk, src = (strip[1], strip[2]) if strip else (key, None)
    rows = (edges[1][chunk[2]], edges[1][chunk[2] + 1])
    cols = (edges[2][chunk[3]], edges[2][chunk[3] + 1])
    if src is not None:
      rows = (rows[0] + src[1].start, rows[0] + src[1].stop)
      cols = (cols[0] + src[2].start, cols[0] + src[2].stop)
    pieces.append(dict(kind="strip" if strip else "chunk", box=[*rows, *cols]))
  return dict(
    image=list(DASK_IMAGE[1:3]),
    filter=list(DASK_FILTER[:2]),
    row_edges=edges[1],
    col_edges=edges[2],
    block=[int(i) for i in idx[1:3]],
    pieces=pieces,
    strips=len(f.blocks.strips),
  )


def geometry():
  return dict(conv=conv_geometry(), stream=stream_geometry(), dask=dask_geometry())


def _rect(ax, x0, y0, w, h, **kw):
  import matplotlib.patches as patches

  ax.add_patch(patches.Rectangle((x0, y0), w, h, **kw))


def draw_conv(c, path):
  import matplotlib.pyplot as plt

  (h, w), (kh, kw) = c["input"], c["filter"]
  (th, tw), (nh, nw), (fh, fw) = c["tile"], c["tiles"], c["fft_size"]
  fig, ax = plt.subplots(figsize=(7.5, 5.6))
  _rect(ax, 0, 0, w, h, fill=False, lw=1.5, ec="black")
  oy, ox = (kh - 1) / 2, (kw - 1) / 2  # output pixel (i, j) sits at the centre of its window
  for i in range(nh):
    for j in range(nw):
      y0, x0 = i * th, j * tw
      hh, ww = min(th, c["output"][0] - y0), min(tw, c["output"][1] - x0)
      _rect(ax, ox + x0, oy + y0, ww, hh, fc="tab:blue", alpha=0.25, ec="tab:blue", lw=1)
  i, j = nh // 2, nw // 2
  y0, x0 = i * th, j * tw
  _rect(ax, ox + x0, oy + y0, tw, th, fc="tab:blue", alpha=0.6, ec="tab:blue")
  _rect(ax, x0, y0, tw + kw - 1, th + kh - 1, fill=False, ec="tab:red", lw=2, ls="--")
  _rect(ax, x0, y0, fw, fh, fill=False, ec="tab:green", lw=1.5, ls=":")
  ax.set_xlim(-5, w + 5)
  ax.set_ylim(h + 5, -5)
  ax.set_aspect("equal")
  ax.set_title(
    f"overlap-save: {h}x{w} input * {kh}x{kw} filter, VALID: "
    f"{nh} x {nw} tiles of {th}x{tw} outputs",
    fontsize=10,
  )
  ax.legend(
    handles=[
      plt.Rectangle((0, 0), 1, 1, fc="tab:blue", alpha=0.4),
      plt.Rectangle((0, 0), 1, 1, fill=False, ec="tab:red", ls="--"),
      plt.Rectangle((0, 0), 1, 1, fill=False, ec="tab:green", ls=":"),
    ],
    labels=[
      "output tiles (one transform each)",
      f"one tile's input: {th + kh - 1}x{tw + kw - 1} (tile + filter - 1)",
      f"its transform: {fh}x{fw}",
    ],
    loc="upper center",
    bbox_to_anchor=(0.5, -0.04),
    fontsize=9,
    ncol=1,
  )
  mib = 1 << 20
  ax.text(
    w + 12,
    h / 2,
    f"workspace\n{c['workspace_bytes'] / mib:.2f} MiB\nof a {c['workspace_limit'] / mib:.2f} MiB"
    f"\nlimit;\n{c['slots']} tile(s)\nat a time",
    va="center",
    fontsize=9,
  )
  fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
  plt.close(fig)


def draw_stream(s, path):
  import matplotlib.pyplot as plt

  layers = s["layers"]
  fig, ax = plt.subplots(figsize=(7.5, 0.45 * len(layers) + 1.6))
  a, b = s["share"]
  for k, layer in enumerate(layers):
    y = len(layers) - 1 - k
    ax.barh(y, layer["stop"] - layer["start"], left=layer["start"], color="tab:orange", alpha=0.5)
    ax.barh(y, b - a, left=a, color="tab:blue", alpha=0.6, height=0.4)
    ax.text(
      layer["stop"] + 2, y, f"{layer['start']:g} - {layer['stop']:g}", va="center", fontsize=8
    )
  ax.set_yticks(range(len(layers)))
  ax.set_yticklabels([layer["name"] for layer in reversed(layers)], fontsize=9)
  ax.axvline(a, color="tab:blue", lw=0.8, ls=":")
  ax.axvline(b, color="tab:blue", lw=0.8, ls=":")
  ax.set_xlim(min(layer["start"] for layer in layers) - 5, max(lay["stop"] for lay in layers) + 40)
  ax.set_xlabel("input pixels along the first axis")
  ax.set_title(
    f"stream: the middle tile of {s['image'][0]}x{s['image'][1]}, tiles of {s['tile_in'][0]} "
    "px;\neach layer computes its share (blue) plus a halo (orange) for the layers after it",
    fontsize=10,
  )
  fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
  plt.close(fig)


def draw_dask(d, path):
  import matplotlib.pyplot as plt

  h, w = d["image"]
  fig, ax = plt.subplots(figsize=(7.0, 5.6))
  for piece in d["pieces"]:
    r0, r1, c0, c1 = piece["box"]
    color = "tab:blue" if piece["kind"] == "chunk" else "tab:orange"
    _rect(ax, c0, r0, c1 - c0, r1 - r0, fc=color, alpha=0.55, ec=color)
  for e in d["row_edges"]:
    ax.axhline(e, color="black", lw=0.8)
  for e in d["col_edges"]:
    ax.axvline(e, color="black", lw=0.8)
  ax.set_xlim(-2, w + 2)
  ax.set_ylim(h + 2, -2)
  ax.set_aspect("equal")
  strips = sum(p["kind"] == "strip" for p in d["pieces"])
  ax.set_title(
    f"dask: {h}x{w} input in chunks of {d['row_edges'][1]}, {d['filter'][0]}x{d['filter'][1]} "
    f"filter, SAME;\nthe task of output chunk {tuple(d['block'])} reads its chunk (blue) and "
    f"{strips} halo strips (orange); the graph has {d['strips']} strips in all",
    fontsize=10,
  )
  fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
  plt.close(fig)


# The "which path when" chart (docs/guide/paths.md): a question per row, its answer to the
# right, the next question below when the answer is no.
PATHS = [
  ("Train a whole Keras model on images\ntoo large for one step's memory?", "StreamingModel"),
  ("Run a whole Keras model over an image\nlarger than memory (a slide)?", "tf_largeconv.stream"),
  ("One convolution over an array larger\nthan memory (zarr, TIFF, .npy)?", "tf_largeconv.dask"),
  ("A trained model with a chain of linear\nlayers (convolutions, no activation)?", "fold"),
  ("An existing Keras model with large\nconvolutions?", "convert"),
  ("A new Keras model?", "layers (LargeConv2D, ...)"),
  ("TensorFlow code calling tf.nn?", "ops (lc.conv2d, ...)"),
]


def draw_paths(path):
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(8, 0.95 * len(PATHS) + 0.3))
  box = dict(boxstyle="round,pad=0.4", fc="#eef3fb", ec="tab:blue")
  answer = dict(boxstyle="round,pad=0.4", fc="#fdf0e2", ec="tab:orange")
  arrow = dict(arrowstyle="->", color="gray")
  n = len(PATHS)
  for k, (question, target) in enumerate(PATHS):
    y = n - k
    ax.text(0.25, y, question, ha="center", va="center", fontsize=9, bbox=box)
    ax.text(0.8, y, target, ha="center", va="center", fontsize=9, family="monospace", bbox=answer)
    ax.annotate("", xy=(0.6, y), xytext=(0.5, y), arrowprops=arrow)
    ax.text(0.55, y + 0.12, "yes", ha="center", fontsize=8, color="gray")
    if k + 1 < n:
      ax.annotate("", xy=(0.25, y - 0.62), xytext=(0.25, y - 0.38), arrowprops=arrow)
      ax.text(0.27, y - 0.5, "no", va="center", fontsize=8, color="gray")
  ax.set_xlim(0, 1)
  ax.set_ylim(0.4, n + 0.6)
  ax.axis("off")
  fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
  plt.close(fig)


DRAW = {"conv": draw_conv, "stream": draw_stream, "dask": draw_dask}


def write(geom):
  """Draws every picture; those of the package's geometry only where `geom` is given."""
  import matplotlib

  matplotlib.use("Agg")
  OUT.mkdir(exist_ok=True)
  draw_paths(OUT / "paths.png")
  if geom is None:
    return
  for name, draw in DRAW.items():
    draw(geom[name], OUT / f"{name}.png")
  GEOMETRY.write_text(json.dumps(geom, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="compare, do not draw")
  args = parser.parse_args(argv)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
  sys.path.insert(0, str(HERE.parent))
  try:
    geom = json.loads(json.dumps(geometry()))
  except Exception as e:  # no TensorFlow, no build or no dask: the committed pictures stay
    if args.check:
      raise
    print(
      f"docs/figures.py: {type(e).__name__}: {e}; "
      f"keeping the committed pictures of its geometry in {OUT}"
    )
    geom = None
  if args.check and geom is not None:
    committed = json.loads(GEOMETRY.read_text(encoding="utf-8"))
    if committed != geom:
      print("docs/figures.py: the package's geometry differs from docs/figures/geometry.json;")
      print("run `python docs/figures.py` and commit docs/figures/")
      return 1
    return 0
  try:
    write(geom)
  except ImportError as e:
    print(f"docs/figures.py: {e}; keeping the committed pictures in {OUT}")
    return 0
  drawn = ["paths"] + (sorted(DRAW) + ["geometry.json"] if geom is not None else [])
  print(f"docs/figures.py: wrote {', '.join(drawn)} in {OUT}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
