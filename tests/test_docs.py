"""The documentation's code examples run: every ```python block of README.md and of the pages
under docs/, the blocks of one page in order in one namespace, in a temporary directory.

Examples that are not meant to run use another fence (```sh, ```text). A block that imports
an optional extra (tf_largeconv.dask, tf_keras) skips the rest of its page only where that
extra is not installed.
"""

import pathlib
import re
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))

# A fenced block opened by ```python (any indentation) and closed by ``` at the same one.
FENCE = re.compile(
  r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
# What a block needs beyond the test dependencies: the modules whose absence skips it.
EXTRAS = {
  "tf_largeconv.dask": ("dask.array", "distributed", "zarr", "tifffile", "ngff_zarr"),
  "dask": ("dask.array",),
  "zarr": ("zarr",),
  "tf_keras": ("tf_keras",),
  "tf_largeconv.tf_keras": ("tf_keras",),
}
IMPORT = re.compile(
  r"^[ \t]*(?:import[ \t]+([\w.]+)|from[ \t]+([\w.]+)[ \t]+import[ \t]+([\w, \t]+))", re.M
)


def code_blocks(text):
  """[(line, source)] of the ```python blocks of a Markdown text, line 1-based."""
  blocks = []
  for m in FENCE.finditer(text):
    line = text.count("\n", 0, m.start("body")) + 1
    blocks.append((line, textwrap.dedent(m.group("body"))))
  return blocks


def needed_modules(source):
  """The optional modules a block imports (see EXTRAS)."""
  needed = []
  for module, package, names in IMPORT.findall(source):
    # `from tf_largeconv import tf_keras` imports the module tf_largeconv.tf_keras.
    imported = (
      [module]
      if module
      else [package] + [f"{package}.{n.split()[0]}" for n in names.split(",") if n.strip()]
    )
    for name, (prefix, modules) in ((n, e) for n in imported for e in EXTRAS.items()):
      if name == prefix or name.startswith(prefix + "."):
        needed.extend(modules)
  return needed


def run_page(path, text):
  """Runs a page's blocks in order in one namespace; a failure names the page and line."""
  namespace = {"__name__": "__docs__"}
  for line, source in code_blocks(text):
    for module in needed_modules(source):
      pytest.importorskip(module, reason=f"{path}:{line} needs {module}")
    code = compile(source, f"{path}:{line}", "exec")
    try:
      exec(code, namespace)  # noqa: S102 (the examples are this repository's own)
    except Exception as e:
      raise AssertionError(f"the example at {path}:{line} failed: {type(e).__name__}: {e}") from e


def _page_id(path):
  return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", PAGES, ids=_page_id)
def test_page_examples_run(path, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  run_page(path.relative_to(ROOT), path.read_text(encoding="utf-8"))


def test_a_broken_example_fails_with_its_location():
  page = textwrap.dedent("""\
      # A page

      ```python
      x = 1
      ```

      Text.

        ```python
        assert x == 2, "x is not 2"
        ```
      """)
  assert [line for line, _ in code_blocks(page)] == [4, 10]
  with pytest.raises(AssertionError, match=r"page\.md:10 failed: AssertionError: x is not 2"):
    run_page("page.md", page)


def test_optional_extras_are_recognised():
  assert needed_modules("from tf_largeconv import tf_keras as k\n") == ["tf_keras"]
  assert "zarr" in needed_modules("import numpy as np\nimport tf_largeconv.dask as ldask\n")
  assert needed_modules("import tf_largeconv as lc\nfrom tf_largeconv.keras import fold\n") == []


def test_other_fences_do_not_run():
  page = "```sh\nexit 1\n```\n\n```text\nnot python\n```\n\n```pycon\n>>> 1/0\n```\n"
  assert code_blocks(page) == []


def test_pages_have_examples():
  """The guide's pages all carry runnable examples, so a change of fence is noticed."""
  with_examples = {_page_id(p) for p in PAGES if code_blocks(p.read_text(encoding="utf-8"))}
  guide = {_page_id(p) for p in (ROOT / "docs" / "guide").glob("*.md")}
  assert guide and guide <= with_examples
  assert "README.md" in with_examples


def test_readme_is_short():
  lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
  assert lines <= 200, f"README.md has {lines} lines; the rest belongs in docs/"


def test_docs_pins_are_one_list():
  """The Makefile's DOCS_DEPS is the `docs` extra of pyproject.toml, pin for pin."""
  tomllib = pytest.importorskip("tomllib")
  project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
  extra = project["optional-dependencies"]["docs"]
  makefile = (ROOT / "Makefile").read_text()
  m = re.search(r"^DOCS_DEPS\s*\?=\s*(.*)$", makefile, re.M)
  assert m, "the Makefile has no DOCS_DEPS"
  assert sorted(m.group(1).replace('"', "").split()) == sorted(extra)
