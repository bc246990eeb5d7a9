"""docs/ARCHITECTURE.md, the maintainers' map, names only files and symbols that exist.

Every `code span` of the page that looks like a file path must be a file (or folder) of
the checkout, matched by its trailing path components (`conv.cc`, `cuda/fft_plan.cc`); one
that looks like a name or a dotted name must have each of its parts among the words of
the sources (Python, C++, CUDA, shell, Makefile)."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "ARCHITECTURE.md")
SKIP_DIRS = {"__pycache__", "build", "site", "node_modules", ".venv"}
SOURCES = (".py", ".cc", ".h", ".cu", ".sh")
FILE = re.compile(r"[\w./<>-]+\.(py|cc|h|cu|md|sh|json|toml)|[\w./-]+/")
NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(\(\))?")


def _files():
  found = []
  for folder, dirs, files in os.walk(ROOT):
    dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS]
    found.extend(os.path.relpath(os.path.join(folder, f), ROOT) for f in files)
  return found


def missing(text, files, words):
  """The code spans of `text` naming a file not in `files` or a name not in `words`."""
  bad = []
  for span in re.findall(r"`([^`\n]+)`", text):
    span = span.strip()
    if FILE.fullmatch(span):
      tail = "/" + span.rstrip("/")
      if not any(("/" + f).endswith(tail) or ("/" + f).find(tail + "/") >= 0 for f in files):
        bad.append(span)
    elif NAME.fullmatch(span):
      if any(part not in words for part in span.rstrip("()").split(".")):
        bad.append(span)
  return bad


def test_every_file_and_symbol_named_exists():
  files = _files()
  words = {"tf_largeconv"}
  for f in files:
    if f.endswith(SOURCES) or os.path.basename(f) == "Makefile":
      with open(os.path.join(ROOT, f), errors="ignore") as src:
        words.update(re.findall(r"[A-Za-z_]\w*", src.read()))
  with open(PAGE) as page:
    text = page.read()
  assert len(re.findall(r"`([^`\n]+)`", text)) > 100  # the page is read, not skipped
  assert missing(text, files, words) == []


def test_a_stale_name_is_found():
  files = ["cc/core/plan.cc", "tf_largeconv/ops/_dispatch.py"]
  words = {"planning", "routing", "schedule", "kCpuAlgorithms"}
  text = (
    "`planning.routing.schedule` in `plan.cc` and `ops/_dispatch.py`; gone: "
    "`planning.use_tf_kernel`, `kCpu3dAlgorithms`, `_gradients.py`, `cuda/plan.cc`"
  )
  assert missing(text, files, words) == [
    "planning.use_tf_kernel",
    "kCpu3dAlgorithms",
    "_gradients.py",
    "cuda/plan.cc",
  ]
