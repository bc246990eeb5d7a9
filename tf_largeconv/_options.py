"""The package's own options (beyond TensorFlow's and Keras's arguments), each declared once.

`OPTIONS` is the one list: a row per option, with its keyword, default, cleaning and doc
line. Every public function takes them as keyword-only arguments through `takes_options`
(which writes them into its signature and docstring), every layer through `Settings`
(kept, serialised by `get_config`, passed to the op), and `ConvProblem`'s constructors
clean them (`clean_options`) into fields of the same name, from which they reach the ops'
attributes.
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
from collections.abc import Callable
from typing import Any
from typing import TypeVar

from tf_largeconv import _args


@dataclasses.dataclass(frozen=True)
class Option:
  """One option: its keyword, its default in the public functions and layers, `clean` (a
  public value to the op attribute's, raising ValueError that names the option), `public`
  (an attribute's value back to the public form), the annotation the signatures show, and
  its line in the docstrings' Args."""

  name: str
  default: Any
  clean: Callable[[Any], Any]
  public: Callable[[Any], Any]
  annotation: str
  doc: str


OPTIONS = (
  Option(
    "algorithm",
    "auto",
    _args.normalize_algorithm,
    lambda value: value,
    "str | None",
    "'auto' (the planner's choice per pass), 'direct', 'fft', 'tf' or 'portable'; see "
    "`tf_largeconv.conv2d`.",
  ),
  Option(
    "workspace_limit",
    None,
    _args.normalize_workspace_limit,
    lambda value: None if value < 0 else value,
    "int | None",
    "hard bound in bytes on the temporary memory of each pass; None means 64 MiB.",
  ),
  Option(
    "keep_memory",
    True,
    _args.normalize_keep_memory,
    lambda value: value,
    "bool",
    "whether a call may keep memory for later calls on the CPU: its workspace in the pool of "
    "idle workspaces (up to LARGECONV_WORKSPACE_POOL_MIB) and its filter spectra (up to "
    "LARGECONV_SPECTRUM_CACHE_MIB); False frees both when the call returns.",
  ),
)
NAMES = tuple(o.name for o in OPTIONS)


def clean_options(options: dict[str, Any]) -> dict[str, Any]:
  """The op attributes' values of the options given by keyword (the others at their
  defaults); TypeError for a keyword that is no option, ValueError for a bad value."""
  unknown = sorted(set(options) - set(NAMES))
  if unknown:
    raise TypeError(
      f"unexpected keyword argument {unknown[0]!r} (the options are {', '.join(NAMES)})"
    )
  return {o.name: o.clean(options.get(o.name, o.default)) for o in OPTIONS}


def public_options(options: dict[str, Any]) -> dict[str, Any]:
  """Every option, cleaned, in its public form (as the layers keep and serialise them):
  those given by keyword, the others at their defaults."""
  return {o.name: o.public(v) for o, v in zip(OPTIONS, clean_options(options).values())}


def with_options(signature: inspect.Signature) -> inspect.Signature:
  """`signature` with the options as keyword-only parameters in place of a final
  `**options`, or before a final `**kwargs` (a layer's, which Keras's layer takes)."""
  params = list(signature.parameters.values())
  var = params[-1:] if params and params[-1].kind is inspect.Parameter.VAR_KEYWORD else []
  head, tail = params[: len(params) - len(var)], [p for p in var if p.name != "options"]
  kind = inspect.Parameter.KEYWORD_ONLY
  ours = [
    inspect.Parameter(o.name, kind, default=o.default, annotation=o.annotation) for o in OPTIONS
  ]
  return signature.replace(parameters=head + ours + tail)


class ClassSignature:
  """`inspect.signature` of a layer class whose `__init__` ends with `**kwargs`: that
  `__init__`'s, the options keyword-only before `**kwargs`. Instances have none (their
  signature is their `__call__`'s)."""

  def __get__(self, instance: Any, owner: type) -> inspect.Signature:
    if instance is not None:
      raise AttributeError("__signature__")
    layer: Any = owner
    init = inspect.signature(layer.__init__)
    return with_options(init.replace(parameters=list(init.parameters.values())[1:]))


F = TypeVar("F", bound=Callable[..., Any])


def takes_options(func: F) -> F:
  """Marks a public function whose last parameter, `**options`, takes the `OPTIONS`: its
  `__signature__` names each option (keyword-only, with its default) in place of
  `**options`, and its docstring's Args gets the table's line for each option it does not
  describe itself. The function passes `options` on (to a ConvProblem constructor or a
  layer), which cleans them and refuses other keywords."""
  signature = inspect.signature(func)
  last = list(signature.parameters.values())[-1:]
  if not last or last[0].kind is not inspect.Parameter.VAR_KEYWORD:
    raise TypeError(f"{func.__qualname__} must end with **options to take the options")
  func.__signature__ = with_options(signature)  # type: ignore[attr-defined]
  func.__doc__ = documented(func.__doc__ or "")
  return func


def documented(doc: str) -> str:
  """`doc` with a line in its Args section for each option the section does not name (an
  entry "a, b: ..." names a and b)."""
  lines = doc.split("\n")
  start = next((i for i, line in enumerate(lines) if line.strip() == "Args:"), None)
  if start is None:
    return doc
  indent = len(lines[start]) - len(lines[start].lstrip()) + 2
  end, named = start + 1, set[str]()
  while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) >= indent):
    if _indent(lines[end]) == indent and ":" in lines[end]:
      named.update(n.strip() for n in lines[end].split(":")[0].split(","))
    end += 1
  while not lines[end - 1].strip():  # the blank lines after the section stay after it
    end -= 1
  pad = " " * indent
  added = [
    textwrap.fill(f"{o.name}: {o.doc}", 90, initial_indent=pad, subsequent_indent=pad + "  ")
    for o in OPTIONS
    if o.name not in named
  ]
  return "\n".join(lines[:end] + added + lines[end:])


def _indent(line: str) -> int:
  return len(line) - len(line.lstrip()) if line.strip() else -1


class Settings:
  """The options a layer keeps (attributes of their names, in public form), cleaned when it
  is made, serialised by `get_config` and passed to its op (`settings()`). Mixed in before
  the Keras layer."""

  def __init_subclass__(cls, **kwargs: Any) -> None:
    """A layer class's own docstring gets its Args lines for the options (`documented`)."""
    super().__init_subclass__(**kwargs)
    if "__doc__" in vars(cls) and cls.__doc__:
      cls.__doc__ = documented(cls.__doc__)

  def _init_settings(self, kwargs: dict[str, Any]) -> None:
    """Takes the options out of a layer's keyword arguments `kwargs`."""
    given = {name: kwargs.pop(name) for name in NAMES if name in kwargs}
    for name, value in public_options(given).items():
      setattr(self, name, value)

  def settings(self) -> dict[str, Any]:
    """The layer's options by keyword, as the public functions take them."""
    return {name: getattr(self, name) for name in NAMES}

  def get_config(self) -> dict[str, Any]:
    config = super().get_config()  # type: ignore[misc]
    config.update(self.settings())
    return config
