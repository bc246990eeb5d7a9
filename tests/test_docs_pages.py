"""The documentation's claims about the code stay true: the messages the troubleshooting
page quotes occur in the package's source, every command the docs name exists, the
Limitations boxes of the README and the docs home agree, and the pictures show the geometry
the package computes today."""

import importlib.util
import json
import pathlib
import re
import subprocess
import sys
import tokenize

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
TROUBLESHOOTING = ROOT / "docs" / "guide" / "troubleshooting.md"
TEXT_BLOCK = re.compile(r"^([ \t]*)```text[ \t]*\n(.*?)^\1```", re.M | re.S)
PLACEHOLDER = "…"


def _python_literals(path):
  """The string literals of a Python file, adjacent ones joined (implicit concatenation),
  an f-string's replacement fields as PLACEHOLDER."""
  out, run = [], []
  with open(path, encoding="utf-8") as f:
    for tok in tokenize.generate_tokens(f.readline):
      if tok.type in (tokenize.NL, tokenize.COMMENT):
        continue
      if tok.type == tokenize.STRING:
        prefix, quote = re.match(r"^([A-Za-z]*)('\'\'|\"\"\"|'|\")", tok.string).groups()
        body = tok.string[len(prefix) + len(quote) : -len(quote)]
        if "f" in prefix.lower():
          body = re.sub(r"\{[^{}]*\}", PLACEHOLDER, body)
        run.append(body.replace("\\'", "'").replace('\\"', '"'))
        continue
      if run:
        out.append("".join(run))
        run = []
  return out


CPP_LITERAL = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def _cpp_literals(path):
  """The string literals of a C++ file: adjacent ones joined, `+ expression +` between two
  as PLACEHOLDER."""
  text = path.read_text(encoding="utf-8")
  out, prev = [], None
  for m in CPP_LITERAL.finditer(text):
    gap = text[prev.end() : m.start()] if prev else None
    if gap is not None and not gap.strip():
      out[-1] += m.group(1)
    elif gap is not None and re.fullmatch(r"\s*\+[^;\"{}]*\+\s*", gap):
      out[-1] += PLACEHOLDER + m.group(1)
    else:
      out.append(m.group(1))
    prev = m
  return out


def source_messages():
  python = sorted((ROOT / "tf_largeconv").rglob("*.py"))
  cpp = sorted(p for ext in ("*.cc", "*.h") for p in (ROOT / "cc").rglob(ext))
  return [s for p in python for s in _python_literals(p)] + [
    s for p in cpp for s in _cpp_literals(p)
  ]


def occurs(message, literals):
  """Whether `message` (PLACEHOLDER for what varies) is what one of `literals` prints: its
  fixed parts in order, anything in place of each PLACEHOLDER."""
  parts = [re.escape(p) for p in message.split(PLACEHOLDER)]
  pattern = re.compile(".*?".join(parts), re.S)
  return any(pattern.search(s) for s in literals)


def quoted_messages(text):
  return [" ".join(m.group(2).split()) for m in TEXT_BLOCK.finditer(text)]


def test_troubleshooting_quotes_the_packages_messages():
  messages = quoted_messages(TROUBLESHOOTING.read_text(encoding="utf-8"))
  assert len(messages) >= 10, messages
  literals = source_messages()
  missing = [m for m in messages if not occurs(m, literals)]
  assert not missing, f"quoted in {TROUBLESHOOTING.name} but not in the source: {missing}"


def test_a_changed_message_is_noticed():
  literals = ["memory_limit: " + PLACEHOLDER + " bytes is less than one output pixel's"]
  assert occurs("memory_limit: … bytes is less than one output pixel's", literals)
  assert not occurs("memory_limit: … bytes is more than one output pixel's", literals)
  assert not occurs("bytes is less than … memory_limit:", literals)  # the parts in order


def test_joined_literals(tmp_path):
  py = tmp_path / "m.py"
  py.write_text('x = 1\nraise ValueError(\n  f"a {x!r} b "  # note\n  "c\'d"\n)\n')
  assert _python_literals(py) == ["a … b c'd"]
  cc = tmp_path / "m.cc"
  cc.write_text('return E("limit " + std::to_string(n) +\n  " bytes " "too small");\n"x";\n')
  assert _cpp_literals(cc) == ["limit … bytes too small", "x"]


# `python -m NAME`, `make TARGET ...` and `make -C DIR` named in a page.
PYTHON_M = re.compile(r"python3? -m ([A-Za-z_][\w.]*)")
MAKE = re.compile(r"`make ((?:[a-z][\w-]*)(?: [a-z][\w-]*)*)")


def _make_targets():
  text = (ROOT / "Makefile").read_text(encoding="utf-8")
  return set(re.findall(r"^([a-z][\w-]*):", text, re.M))


def _module_exists(name):
  """A module of this repository (tf_largeconv, benchmarks, tests, tools) as a file or a
  package with __main__; any other as an importable top-level package (pip, pytest)."""
  top = name.split(".")[0]
  if top not in ("tf_largeconv", "benchmarks", "tests", "tools"):
    return importlib.util.find_spec(top) is not None
  path = ROOT.joinpath(*name.split("."))
  return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


def named_commands(text):
  modules = set(PYTHON_M.findall(text))
  targets = {word for m in MAKE.findall(text) for word in m.split()}
  return modules, targets


@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_commands_named_in_the_docs_exist(path):
  text = path.read_text(encoding="utf-8")
  modules, targets = named_commands(text)
  assert not [m for m in modules if not _module_exists(m)], modules
  assert targets <= _make_targets(), sorted(targets - _make_targets())


def test_a_missing_command_is_noticed():
  modules, targets = named_commands(
    "Run `python -m tf_largeconv.bench --cases x` or `make bench-all`; `python -m benchmarks.demo`"
  )
  assert modules == {"tf_largeconv.bench", "benchmarks.demo"} and targets == {"bench-all"}
  assert not _module_exists("tf_largeconv.bench") and _module_exists("benchmarks.demo")
  assert "bench-all" not in _make_targets() and {"wheel", "docs", "bench"} <= _make_targets()


def limitations(text):
  """The bullets between the limitations markers, as plain text: a README blockquote or an
  admonition's indented body both reduce to the same items."""
  m = re.search(r"<!-- limitations:start -->(.*?)<!-- limitations:end -->", text, re.S)
  assert m, "no <!-- limitations:start --> ... <!-- limitations:end --> block"
  lines = [re.sub(r"^(>\s?|\s{4})", "", line) for line in m.group(1).splitlines()]
  body = "\n".join(line for line in lines if not line.startswith(("!!!", "**Limitations")))
  items = re.split(r"^- ", body, flags=re.M)[1:]
  return [" ".join(item.split()) for item in items]


def test_the_limitations_boxes_agree():
  readme = limitations((ROOT / "README.md").read_text(encoding="utf-8"))
  home = limitations((ROOT / "docs" / "index.md").read_text(encoding="utf-8"))
  assert len(readme) >= 5 and readme == home
  text = " ".join(readme)
  for fact in ("glibc 2.34", "Keras 3", "TFLite", "static height and width", "make wheel"):
    assert fact in text, fact


def test_figures_show_the_packages_geometry():
  """docs/figures/geometry.json, from which the committed pictures were drawn, is what the
  package computes now (run `python docs/figures.py` to redraw)."""
  for module in ("dask.array", "keras"):
    pytest.importorskip(module)
  sys.path.insert(0, str(ROOT / "docs"))
  try:
    import figures
  finally:
    sys.path.remove(str(ROOT / "docs"))
  committed = json.loads((ROOT / "docs" / "figures" / "geometry.json").read_text())
  assert json.loads(json.dumps(figures.geometry())) == committed
  for name in ("conv", "stream", "dask", "paths"):
    assert (ROOT / "docs" / "figures" / f"{name}.png").is_file(), name


def test_figures_script_runs_without_the_package(tmp_path):
  """`make docs` needs no TensorFlow: where the package does not import, the script keeps
  the committed pictures and succeeds."""
  code = (
    "import runpy, sys\nsys.modules['tensorflow'] = None\nsys.argv = ['figures.py']\n"
    f"sys.modules['matplotlib'] = None\nrunpy.run_path({str(ROOT / 'docs' / 'figures.py')!r},"
    " run_name='__main__')\n"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
  )
  assert out.returncode == 0, out.stderr
  assert "keeping the committed pictures" in out.stdout, out.stdout
