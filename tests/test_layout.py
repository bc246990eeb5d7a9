"""The package's layout keeps its promises: the imports between its modules form no circle
(module-level and function-level imports alike), no module is longer than a reader can
hold, and nothing that measures or demonstrates ships inside it."""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "tf_largeconv")
MAX_LINES = 450


def _modules():
  """{dotted name: path} of every Python module of the package in the checkout."""
  found = {}
  for folder, dirs, files in os.walk(PACKAGE):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for name in files:
      if not name.endswith(".py"):
        continue
      path = os.path.join(folder, name)
      parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      found[".".join(parts)] = path
  return found


def _imports(path, name, modules):
  """The package's modules that the module `name` at `path` imports anywhere in its body:
  each as named (`from a.b import c` is a.b.c where that is a module, else a.b), less the
  packages that contain `name`."""
  package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
  found = set()
  for node in ast.walk(ast.parse(open(path).read(), path)):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(
          package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
        )
      targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    else:
      continue
    # A package that contains the importer is initialised before it, so naming it (as in
    # `from tf_largeconv import _core`, a compiled module) closes no circle.
    found.update(t for t in targets if t in modules and t != name and not name.startswith(t + "."))
  return found


def _graph():
  modules = _modules()
  return {name: _imports(path, name, modules) for name, path in modules.items()}


def _cycle(graph):
  """One import circle of `graph` as a list of modules, or None."""
  state = {}

  def visit(node, stack):
    state[node] = "open"
    stack.append(node)
    for nxt in sorted(graph[node]):
      if state.get(nxt) == "open":
        return stack[stack.index(nxt) :] + [nxt]
      if nxt not in state:
        found = visit(nxt, stack)
        if found:
          return found
    stack.pop()
    state[node] = "done"
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node, [])
      if found:
        return found
  return None


def test_the_imports_form_no_circle():
  graph = _graph()
  assert "tf_largeconv.ops" in graph and "tf_largeconv.planning.routing" in graph
  assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_circle_finder_finds_a_circle():
  graph = _graph()
  # A function-level import of the ops from the planner would close a circle.
  graph["tf_largeconv.planning.routing"] = graph["tf_largeconv.planning.routing"] | {
    "tf_largeconv.ops._conv2d"
  }
  found = _cycle(graph)
  assert found is not None and found[0] == found[-1]
  assert _cycle({"a": {"b"}, "b": set()}) is None
  assert _cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_function_level_imports_count(tmp_path):
  pkg = tmp_path / "tf_largeconv"
  pkg.mkdir()
  (pkg / "__init__.py").write_text("")
  (pkg / "a.py").write_text("def f():\n  from tf_largeconv import b\n")
  modules = {"tf_largeconv": "", "tf_largeconv.a": "", "tf_largeconv.b": ""}
  assert _imports(str(pkg / "a.py"), "tf_largeconv.a", modules) == {"tf_largeconv.b"}


@pytest.mark.parametrize("name", sorted(_modules()))
def test_no_module_is_too_long(name):
  with open(_modules()[name]) as f:
    lines = sum(1 for _ in f)
  assert lines <= MAX_LINES, f"{name} has {lines} lines"


def test_nothing_that_measures_ships_in_the_package():
  bad = [
    n
    for n in _modules()
    if any(word in n.rpartition(".")[2] for word in ("bench", "measure", "demo"))
  ]
  assert bad == []


def _in(name, package):
  return name == package or name.startswith(package + ".")


# The command line's entry points: `python -m tf_largeconv` and its alias
# `python -m tf_largeconv.dask`.
ENTRY_POINTS = ("tf_largeconv.__main__", "tf_largeconv.dask.__main__")
# The modules of stream that make `to_dask` (the one place stream uses the dask subpackage).
TO_DASK = ("tf_largeconv.stream", "tf_largeconv.stream._dask")


def broken_import_rules(graph):
  """(importer, imported, rule) for each import against ARCHITECTURE.md's rules: the command
  line (cli) sits on top and only its entry points import it; nothing in the package but
  cli and memory imports stream; nothing imports memory (the package loads it by name on
  first use); stream imports the dask subpackage only to make `to_dask`."""
  broken = []
  for name, targets in graph.items():
    for t in sorted(targets):
      if _in(t, "tf_largeconv.cli") and not _in(name, "tf_largeconv.cli"):
        if name not in ENTRY_POINTS:
          broken.append((name, t, "only the entry points import cli"))
      if _in(t, "tf_largeconv.stream") and not _in(name, "tf_largeconv.stream"):
        if not (_in(name, "tf_largeconv.cli") or _in(name, "tf_largeconv.memory")):
          broken.append((name, t, "nothing in the package but cli and memory imports stream"))
      if _in(t, "tf_largeconv.memory") and not _in(name, "tf_largeconv.memory"):
        broken.append((name, t, "nothing in the package imports memory"))
      if _in(name, "tf_largeconv.stream") and _in(t, "tf_largeconv.dask") and name not in TO_DASK:
        broken.append((name, t, "stream uses dask only in to_dask"))
  return broken


def test_the_subpackages_import_as_the_architecture_says():
  graph = _graph()
  assert "tf_largeconv.cli" in graph and "tf_largeconv.stream._dask" in graph
  assert broken_import_rules(graph) == []


def test_the_import_rules_catch_a_break():
  graph = _graph()
  graph["tf_largeconv.dask._output"] = graph["tf_largeconv.dask._output"] | {
    "tf_largeconv.stream._plan"
  }
  graph["tf_largeconv.stream._run"] = graph["tf_largeconv.stream._run"] | {"tf_largeconv.dask"}
  graph["tf_largeconv.keras"] = graph["tf_largeconv.keras"] | {"tf_largeconv.cli"}
  graph["tf_largeconv.stream._run"] |= {"tf_largeconv.memory._report"}
  rules = sorted(rule for _, _, rule in broken_import_rules(graph))
  assert rules == [
    "nothing in the package but cli and memory imports stream",
    "nothing in the package imports memory",
    "only the entry points import cli",
    "stream uses dask only in to_dask",
  ]


MAX_FUNCTION_LINES = 80


def _long_functions(path):
  """The functions (methods and nested functions too) of the module at `path` over
  MAX_FUNCTION_LINES lines, docstring included, each as 'name (n lines)'."""
  tree = ast.parse(open(path).read(), path)
  return [
    f"{node.name} ({node.end_lineno - node.lineno + 1} lines)"
    for node in ast.walk(tree)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
  ]


@pytest.mark.parametrize("name", sorted(_modules()))
def test_no_function_is_too_long(name):
  assert _long_functions(_modules()[name]) == []


def test_a_long_function_is_found(tmp_path):
  body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
  (tmp_path / "m.py").write_text(f"def short():\n  pass\n\n\nclass C:\n  def long(self):\n{body}")
  assert _long_functions(str(tmp_path / "m.py")) == [f"long ({MAX_FUNCTION_LINES + 1} lines)"]
