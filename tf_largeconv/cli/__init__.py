"""tf_largeconv's command line, `tf-largeconv` (or `python -m tf_largeconv`): `conv` (a
slide through a convolution), `model` (a slide through a saved Keras model), `plan` and
`info`. `python -m tf_largeconv.dask` is an alias of `conv` (and of `model` when its first
argument is a .keras file). The command line sits on top of the package: it uses `dask`
and `stream`, and nothing in the package uses it.

Exit status: OK 0, FAILED 1 (the run failed; --resume finishes it), USAGE 2 (bad arguments
or input, nothing written), REFUSED 3 (--resume against an output of another run).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tf_largeconv.cli import _conv
from tf_largeconv.cli import _model
from tf_largeconv.cli import _plan
from tf_largeconv.cli import _text
from tf_largeconv.cli._options import legacy_argv
from tf_largeconv.cli._options import parse_size
from tf_largeconv.cli._options import slide_options
from tf_largeconv.cli._run import FAILED
from tf_largeconv.cli._run import OK
from tf_largeconv.cli._run import REFUSED
from tf_largeconv.cli._run import USAGE
from tf_largeconv.cli._run import UsageError

PROG = "tf-largeconv"


def parser(progs: dict[str, str] | None = None) -> argparse.ArgumentParser:
  """The command line's parser; `progs` names subcommands otherwise (the alias)."""
  progs = progs or {}
  p = argparse.ArgumentParser(
    prog=PROG, description=_text.TOP, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
  parent = slide_options()
  _conv.add(sub, parent, progs.get("conv"))
  _model.add(sub, parent, progs.get("model"))
  _plan.add(sub, progs.get("plan"))
  return p


def main(argv: Sequence[str] | None = None, progs: dict[str, str] | None = None) -> int:
  """Runs the command line on `argv` (default sys.argv[1:]) and returns its exit status
  (messages go to stdout and stderr; it raises no SystemExit)."""
  argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
  try:
    args = parser(progs).parse_args(argv)
    try:
      return args.run(args)
    except (UsageError, ValueError, TypeError, FileNotFoundError, ImportError) as e:
      args.parser.error(str(e))  # prints the usage and the message, exits USAGE
  except SystemExit as e:  # argparse's exits (--help, errors) and the scheduler's
    return e.code if isinstance(e.code, int) else (OK if e.code is None else USAGE)
  return USAGE  # not reached: error() exits


def dask_alias(argv: Sequence[str] | None = None) -> int:
  """`python -m tf_largeconv.dask`: `conv` with today's arguments, or `model` when the first
  argument is a .keras file."""
  argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
  prog = "python -m tf_largeconv.dask"
  return main(legacy_argv(argv), {"conv": prog, "model": f"{prog} MODEL.keras"})


__all__ = ["main", "parser", "parse_size", "OK", "FAILED", "USAGE", "REFUSED"]
