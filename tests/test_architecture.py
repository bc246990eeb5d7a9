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


CORE = os.path.join(ROOT, "cc", "core")
# The core's layers, lowest first (docs/ARCHITECTURE.md, "Rules the layers keep"): a file
# includes files of its own layer or below. Files not named here belong to their folder's.
LAYERS = {
  "common": 0,
  "plan/tiling": 1,
  "plan/search": 1,
  "cpu": 2,
  "cuda": 2,
  "plan": 3,
  "conv": 3,
}


def _layer(path):
  """The layer of a file under cc/core/ (its path relative to cc/core/, without suffix)."""
  stem = os.path.splitext(path)[0]
  return LAYERS.get(stem, LAYERS.get(stem.split("/")[0]))


def _core_files():
  for folder, _, files in os.walk(CORE):
    for f in files:
      if f.endswith((".h", ".cc", ".cu")):
        yield os.path.relpath(os.path.join(folder, f), CORE)


def test_core_includes_run_downward():
  """No file of the core includes one of a higher layer, and the CPU's and the GPU's
  kernels do not include each other."""
  upward = []
  for path in _core_files():
    with open(os.path.join(CORE, path)) as src:
      included = re.findall(r'#include "cc/core/([^"]+)"', src.read())
    for inc in included:
      sideways = {path.split("/")[0], inc.split("/")[0]} == {"cpu", "cuda"}
      if _layer(inc) > _layer(path) or sideways:
        upward.append(f"{path} -> {inc}")
  assert upward == []
  assert _layer("plan/cpu_fft.h") == 3 and _layer("plan/tiling.h") == 1  # the table is read


def test_core_files_are_short():
  """No file of the core over 700 lines: a file holds one idea (the FFT kernels are split by
  stage, the planner into its cost model, descriptors and choice)."""
  long = {}
  for path in _core_files():
    with open(os.path.join(CORE, path)) as src:
      n = sum(1 for _ in src)
    if n > 700:
      long[path] = n
  assert long == {}


def test_core_structs_are_short():
  """No struct of the core over 250 lines (from `struct Name ... {` to the `};` at its
  indentation): a kernel is cut into stages (cpu/fft_correlation.h, fft_products.h,
  fft_outputs.h) rather than grown into one."""
  long = {}
  for path in _core_files():
    with open(os.path.join(CORE, path)) as src:
      lines = src.read().split("\n")
    for i, line in enumerate(lines):
      head = re.match(r"^( *)struct (\w+)[^;]*\{$", line)
      if head:
        end = next((j for j in range(i + 1, len(lines)) if lines[j] == head.group(1) + "};"), i)
        if end - i + 1 > 250:
          long[f"{path}:{head.group(2)}"] = end - i + 1
  assert long == {}


def test_algorithms_are_named_once():
  """The project's algorithms are the CPU's descriptors (ARCHITECTURE.md, "An algorithm"):
  each names itself in its own header, the bindings export exactly those names, in the
  list's order, and no other file of the core spells one, but the GPU's constants."""
  from tf_largeconv import _core

  plan = os.path.join(CORE, "plan")
  with open(os.path.join(plan, "cpu_algorithms.h")) as src:
    listed = re.search(r"CpuAlgorithms = AlgorithmList<([^>]*)>", src.read()).group(1)
  named, descriptors = {}, set()
  for f in sorted(os.listdir(plan)):
    with open(os.path.join(plan, f)) as src:
      found = re.findall(
        r'struct (\w+) \{\s*static constexpr Algorithm kAlgorithm\{"(\w+)"\}', src.read()
      )
    named.update(found)
    if found:
      descriptors.add("plan/" + f)
  order = [named[s.strip()] for s in listed.split(",")]
  assert tuple(_core.ALGORITHMS) == ("auto", *order)
  assert order[0] == "direct" and len(order) >= 3
  assert len(descriptors) == len(order)  # a header each

  spelled = re.compile('"(' + "|".join(order) + ')"')
  elsewhere = {}
  for path in _core_files():
    if path in descriptors or path == "cuda/fft_plan.h":
      continue
    with open(os.path.join(CORE, path)) as src:
      names = spelled.findall(src.read())
    if names:
      elsewhere[path] = names
  assert elsewhere == {}
  with open(os.path.join(CORE, "cuda", "fft_plan.h")) as src:
    gpu = re.findall(r'\bk\w+\{"(\w+)"\}', src.read())
  assert gpu and set(gpu) <= set(order)


CC = os.path.join(ROOT, "cc")
MAX_FUNCTION_LINES = 80
# Functions of cc/ allowed over MAX_FUNCTION_LINES, each a kernel's inner loop that splitting
# would slow down or obscure, keyed "path under cc/:Name" with the reason. Empty: every
# function fits today.
LONG_FUNCTIONS: dict[str, str] = {}


def _blank(text):
  """`text` with its comments, string and character literals and preprocessor lines blanked,
  newlines kept (so that an offset keeps its line)."""
  literal = r'"(?:\\.|[^"\\\n])*"|' + r"'(?:\\.|[^'\\\n])*'"
  pattern = r"//[^\n]*|/\*.*?\*/|" + literal + r"|^[ \t]*#(?:\\\n|[^\n])*"
  return re.sub(pattern, lambda m: re.sub(r"[^\n]", " ", m.group()), text, flags=re.S | re.M)


# A brace opens a function's body when the text before it, back to the last `;`, `{` or
# `}`, ends in a parameter list (with qualifiers, a trailing return type or a constructor's
# initializers) and is no control statement.
_CONTROL = re.compile(r"\s*(if|for|while|switch|catch|else|do|return)\b")
_BODY = re.compile(
  r"\)\s*(const|override|final|noexcept|mutable|&&?|->\s*[\w:<>,*& ]+?)*\s*$"
  r"|\)\s*(noexcept\s*)?:\s*[\w:]+\s*[({].*\)\s*$",
  re.S,
)


def functions(text):
  """(name, first line, last line) of each function body of a C++ source that no other
  function encloses (lambdas and local classes count with their function); the first line
  is that of the parameter list's opening parenthesis."""
  code = _blank(text)
  found, stack, last = [], [], 0  # stack: "fn", "in" (inside a function) or "other"
  for m in re.finditer(r"[;{}]", code):
    i = m.start()
    if m.group() == "{":
      inside = any(kind != "other" for kind in stack)
      head = code[last:i]
      body = not inside and "(" in head and not _CONTROL.match(head) and _BODY.search(head)
      if body:
        paren = last + head.index("(")
        name = re.search(r"(operator\W*|~?\w+)\s*$", head[: head.index("(")])
        found.append([name.group(1).strip() if name else "?", code.count("\n", 0, paren) + 1, 0])
      stack.append("fn" if body else "in" if inside else "other")
    elif m.group() == "}" and stack and stack.pop() == "fn":
      found[-1][2] = code.count("\n", 0, i) + 1
    last = i + 1
  return [tuple(f) for f in found]


def long_functions(root, limit):
  """{"path:Name": lines} of the functions of the C++ sources under `root` over `limit`
  lines, from the parameter list's line to the closing brace's."""
  long = {}
  for folder, _, files in os.walk(root):
    for f in sorted(files):
      if f.endswith((".h", ".cc", ".cu")):
        path = os.path.join(folder, f)
        with open(path) as src:
          for name, first, end in functions(src.read()):
            if end - first + 1 > limit:
              long[f"{os.path.relpath(path, root)}:{name}"] = end - first + 1
  return long


def test_cc_functions_are_short():
  """No function of cc/ over 80 lines (ARCHITECTURE.md, "Checks that guard the
  structure") but the listed inner loops; the parser sees the sources' functions."""
  with open(os.path.join(CC, "core", "plan", "cpu_fft.cc")) as src:
    seen = {name for name, _, _ in functions(src.read())}
  assert {"FitBlocks", "FftFinish", "LargestFitting"} <= seen
  long = long_functions(CC, MAX_FUNCTION_LINES)
  assert {k: v for k, v in long.items() if k not in LONG_FUNCTIONS} == {}
  assert set(LONG_FUNCTIONS) <= set(long)  # an entry that fits is dropped from the list


def test_a_long_function_is_found(tmp_path):
  body = "\n".join(f"  x += {i};" for i in range(79))
  source = (
    '// void Commented(int a) {\n#define MACRO(a) { a; }\nconst char* s = "f() {";\n'
    "namespace n {\nstruct S {\n  template <typename T>\n  int Long(int x) const {\n"
    f"{body}\n    return x;\n  }}\n  S() : a_(1) {{ if (a_) {{ a_ = 2; }} }}\n  int a_;\n}};\n"
    "int Short(int y) {\n  auto f = [&](int z) { return z; };\n  return f(y);\n}\n"
    "}  // namespace n\n"
  )
  assert [name for name, _, _ in functions(source)] == ["Long", "S", "Short"]
  (tmp_path / "a.h").write_text(source)
  assert long_functions(str(tmp_path), MAX_FUNCTION_LINES) == {"a.h:Long": 82}


# What the core may include in angle brackets beyond the C++ and C libraries, and where:
# Eigen's headers (from TensorFlow's wheel, through a build folder that holds only them:
# the Makefile's EIGEN_INC) in common/eigen.h alone, the CUDA runtime in the CUDA files.
FOREIGN_HEADERS = {
  "Eigen/": {"common/eigen.h"},
  "cuda_runtime": {"cuda/cuda_status.h", "cuda/cufft.cu", "cuda/fft.cu", "cuda/direct.cu"},
}


def test_core_includes_no_tensorflow_header():
  """The core includes no TensorFlow, pybind11 or absl header (docs/ARCHITECTURE.md), and
  Eigen's and the CUDA runtime's only where FOREIGN_HEADERS allows: Eigen's headers ship
  inside TensorFlow's include folder but are not TensorFlow's, and the core's compiles
  reach them through a folder holding nothing else."""
  bad = []
  for path in _core_files():
    with open(os.path.join(CORE, path)) as src:
      text = src.read()
    for inc in re.findall(r'#include [<"]([^>"]+)[>"]', text):
      if inc.startswith(("tensorflow/", "third_party/", "absl/", "pybind11", "unsupported/")):
        bad.append(f"{path} -> {inc}")
      for prefix, allowed in FOREIGN_HEADERS.items():
        if inc.startswith(prefix) and path not in allowed:
          bad.append(f"{path} -> {inc}")
  assert bad == []
  with open(os.path.join(ROOT, "Makefile")) as f:
    makefile = f.read()
  # The core's own compiles (the _core module and the instruction-set levels) see Eigen's
  # folder alone, never TensorFlow's include folder.
  assert "EIGEN_INC = -I$(BUILD)/eigen" in makefile
  assert "ln -sfn $(EIGEN_DIR) $@" in makefile
