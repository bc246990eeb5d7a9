"""The options the slide commands share (one parent parser, each option with one meaning),
sizes with units, and the old spellings of `python -m tf_largeconv.dask`."""

from __future__ import annotations

import argparse
import re
from typing import Any

# Units of a size: powers of 1000 (B, KB, MB, ...; K, M, G, T alone too, as dask reads
# them) and of 1024 (KiB, MiB, ...; Ki, Mi, ...). A plain number is MiB.
_UNITS = {"": 2**20, "b": 1}
for _k, _p in zip("kmgt", range(1, 5)):
  _UNITS.update({_k: 1000**_p, _k + "b": 1000**_p, _k + "i": 1024**_p, _k + "ib": 1024**_p})
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?\s*([a-z]*)\s*$", re.I)
SIZE_FORMS = (
  "a number of MiB (256), or a number with a unit: KiB, MiB, GiB, TiB (powers of 1024: "
  "256MiB, 1GiB, 1.5Gi) or B, KB, MB, GB, TB (powers of 1000: 512M, 2GB)"
)


def parse_size(text: str, option: str) -> int:
  """Bytes of a size given as `text` (see SIZE_FORMS).

  Raises:
    ValueError: `text` is not a positive size; the message names `option` and the forms.
  """
  m = _SIZE.match(str(text))
  unit = m.group(3).lower() if m else None
  if m is None or unit not in _UNITS:
    raise ValueError(f"{option}: {text!r} is not a size: give {SIZE_FORMS}")
  value = float(m.group(1)) * 10 ** int(m.group(2) or 0) * _UNITS[unit]
  if not value >= 1:
    raise ValueError(f"{option}: {text!r} must be at least one byte: give {SIZE_FORMS}")
  return int(value)


def mib(n: float) -> str:
  return f"{n / 2**20:.1f} MiB"


class Size:
  """argparse type of a size option: bytes, or a usage error naming the option."""

  def __init__(self, option: str) -> None:
    self.option = option
    self.__name__ = "size"

  def __call__(self, text: str) -> int:
    try:
      return parse_size(text, self.option)
    except ValueError as e:
      raise argparse.ArgumentTypeError(str(e).partition(": ")[2]) from None


def positive(text: str) -> int:
  try:
    value = int(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be a positive whole number, got {value}")
  return value


class Refused(argparse.Action):
  """An option that means something else here: a usage error that says what to use."""

  def __call__(self, parser, namespace, values, option_string=None):
    parser.error(f"{option_string}: {self.help}")


def add_command(
  subparsers: Any, name: str, prog: str | None, parents: list
) -> argparse.ArgumentParser:
  """Subcommand `name`'s parser, with its texts (`_text.COMMANDS`); `prog` names it
  otherwise (the alias)."""
  from tf_largeconv.cli import _text

  return subparsers.add_parser(
    name,
    parents=parents,
    formatter_class=argparse.RawDescriptionHelpFormatter,
    **({"prog": prog} if prog else {}),
    **_text.COMMANDS[name],
  )


def add_slide_paths(p: argparse.ArgumentParser) -> None:
  p.add_argument("input", metavar="INPUT", help="slide to read: TIFF, OME-Zarr, zarr or .npy")
  p.add_argument("output", metavar="OUTPUT", help="zarr or OME-Zarr directory to write")


def slide_options() -> argparse.ArgumentParser:
  """The parent parser of both slide commands (conv and model)."""
  p = argparse.ArgumentParser(add_help=False)
  g = p.add_argument_group("slide and output (both commands)")
  g.add_argument("--level", type=int, default=0, help="TIFF or OME-Zarr level to read (0)")
  g.add_argument(
    "--channels-first", action="store_true", help="a 3-D slide is C x H x W (default H x W x C)"
  )
  g.add_argument(
    "--tile", type=positive, metavar="N", help="input rows and columns each task computes"
  )
  g.add_argument(
    "--format",
    choices=("zarr", "ome-zarr"),
    help="OUTPUT's format (default: ome-zarr if OUTPUT ends in .ome.zarr, else zarr)",
  )
  g.add_argument(
    "--levels",
    type=positive,
    metavar="N",
    help="OME-Zarr pyramid levels, each half the size of the one before (default: until "
    "the longer side is at most 1024)",
  )
  g.add_argument(
    "--ngff-version",
    choices=("0.4", "0.5"),
    default="0.5",
    help="OME-Zarr version to write (default 0.5, zarr v3; 0.4 is zarr v2)",
  )
  _memory_options(p)
  _run_options(p)
  return p


def _memory_options(p: argparse.ArgumentParser) -> None:
  g = p.add_argument_group("memory (SIZE: 256MiB, 1GiB, 512M, ...; a plain number is MiB)")
  g.add_argument(
    "--memory-limit",
    type=Size("--memory-limit"),
    metavar="SIZE",
    help="memory of all the tasks that run at once, in all: fewer tasks run at once "
    "(dask threads) when the cores' worth would not fit (default: none for conv, 1GiB for "
    "model)",
  )
  g.add_argument(
    "--task-memory",
    "--max-task-memory",
    dest="task_memory",
    type=Size("--task-memory"),
    metavar="SIZE",
    help="the most one task may hold: a larger one is refused before anything runs",
  )


def _run_options(p: argparse.ArgumentParser) -> None:
  g = p.add_argument_group("where it runs, and an earlier run")
  g.add_argument(
    "--scheduler",
    metavar="ADDRESS",
    help="a running dask.distributed scheduler, e.g. tcp://10.0.0.5:8786 (default: run "
    "on this machine's cores)",
  )
  g.add_argument(
    "--timeout",
    type=float,
    default=10.0,
    metavar="SECONDS",
    help="how long to try reaching the scheduler (default 10)",
  )
  again = g.add_mutually_exclusive_group()
  again.add_argument("--overwrite", action="store_true", help="replace OUTPUT if it exists")
  again.add_argument(
    "--resume",
    action="store_true",
    help="finish an interrupted run into OUTPUT: compute only the chunks not recorded",
  )


def legacy_argv(argv: list[str]) -> list[str]:
  """`python -m tf_largeconv.dask`'s arguments as the subcommand's: a first argument
  ending in .keras runs `model` (whose --chunk, the slide's read size, is --read-chunk),
  anything else `conv`."""
  if not argv or not argv[0].lower().endswith(".keras"):
    return ["conv", *argv]
  out = ["model"]
  for a in argv:
    if a == "--chunk" or a.startswith("--chunk="):
      a = "--read-chunk" + a[len("--chunk") :]
    out.append(a)
  return out
