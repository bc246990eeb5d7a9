"""Checks a repaired tf_largeconv wheel and prints what it is: its tag and size, the libraries
it leaves to the system and to TensorFlow, the TensorFlow it was built against and the
pins of its extras, and the CUDA fat binaries of its libraries.

Run by `make wheel` with the wheel tools' Python (auditwheel, and pyelftools through it):
    python tools/wheel_report.py dist/tf_largeconv-...whl [--json]

Exits non-zero, saying why, when the wheel lacks a compiled module, vendors or links a
library other than the system's and TensorFlow's, has a platform tag other than the one its
symbol versions allow, or pins a TensorFlow minor release other than the one it was built
against.
"""

import argparse
import fnmatch
import io
import json
import os
import re
import subprocess
import sys
import zipfile

from elftools.elf.elffile import ELFFile

# The libraries the op library links that the installed TensorFlow provides; never vendored.
TF_LIBS = ("libtensorflow_framework.so.*", "libtensorflow_cc.so.*")
PKG = "tf_largeconv"
# The extras that pin TensorFlow's minor release, and the package each pins.
PINNED_EXTRAS = {"cpu": "tensorflow-cpu", "tensorflow": "tensorflow", "keras2": "tf-keras"}


def build_info(archive):
  """TF_VERSION and WITH_CUDA from the wheel's generated _build_info.py."""
  values = {}
  exec(archive.read(f"{PKG}/_build_info.py").decode(), values)  # noqa: S102 (our own file)
  return values["TF_VERSION"], bool(values.get("WITH_CUDA", False))


def extra_pins(metadata):
  """{extra: [requirement, ...]} of the wheel's METADATA."""
  pins = {}
  for line in metadata.splitlines():
    m = re.match(r"Requires-Dist: (.+?)\s*;\s*extra == \"([\w-]+)\"", line)
    if m:
      pins.setdefault(m.group(2), []).append(m.group(1))
  return pins


def fatbin_bytes(data):
  """Size of the .nv_fatbin section (the CUDA kernels' device code) of an ELF file, or 0."""
  section = ELFFile(io.BytesIO(data)).get_section_by_name(".nv_fatbin")
  return section.data_size if section is not None else 0


def auditwheel_show(path):
  out = subprocess.run(
    [os.path.join(os.path.dirname(sys.executable), "auditwheel"), "show", "--json", path],
    check=True,
    capture_output=True,
    text=True,
  )
  return json.loads(out.stdout)


def report(path):
  """The wheel's description, and the list of what is wrong with it."""
  problems = []
  with zipfile.ZipFile(path) as archive:
    names = archive.namelist()
    built, with_cuda = build_info(archive)
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    (wheel_file,) = [n for n in names if n.endswith(".dist-info/WHEEL")]
    pins = extra_pins(archive.read(metadata).decode())
    tags = re.findall(r"^Tag: (.+)$", archive.read(wheel_file).decode(), re.M)
    libs = {n: archive.getinfo(n).file_size for n in names if n.endswith(".so")}
    fatbins = {n: fatbin_bytes(archive.read(n)) for n in libs}
  vendored = [n for n in names if n.startswith(f"{PKG}.libs/")]
  wanted = ["_large_conv_ops", "_core"] + (["_cuda"] if with_cuda else [])
  for stem in wanted:
    if not any(re.fullmatch(rf"{PKG}/{stem}\..*\.so", n) for n in libs):
      problems.append(f"the wheel has no {PKG}/{stem}*.so")
  if with_cuda:
    for lib in (n for n in libs if "/_core." not in n):
      if not fatbins[lib]:
        problems.append(f"{lib} has no .nv_fatbin section though the build had nvcc")
  if vendored:
    problems.append(f"auditwheel vendored libraries: {vendored}")

  show = auditwheel_show(path)
  external = sorted(show["external_libs"])
  foreign = [lib for lib in external if not any(fnmatch.fnmatch(lib, p) for p in TF_LIBS)]
  if foreign:
    problems.append(f"links libraries neither the system nor TensorFlow provides: {foreign}")
  platforms = sorted({t.split("-")[-1] for t in tags})
  if platforms != [show["sym_tag"]]:
    problems.append(f"tagged {platforms}, but its symbol versions allow {show['sym_tag']}")

  minor = ".".join(built.split(".")[:2])
  for extra, dist in PINNED_EXTRAS.items():
    want = f"{dist}=={minor}.*"
    got = [r for r in pins.get(extra, []) if re.split(r"[=<>~! ]", r)[0] == dist]
    if got != [want]:
      problems.append(
        f"the '{extra}' extra pins {got or 'nothing'}, not {want} (the TensorFlow the "
        "wheel was built against): set it in pyproject.toml's [project.optional-dependencies]"
      )
  described = {
    "wheel": os.path.basename(path),
    "tags": tags,
    "bytes": os.path.getsize(path),
    "tensorflow_built": built,
    "cuda": with_cuda,
    "libraries": libs,
    "nv_fatbin_bytes": {n: b for n, b in fatbins.items() if b},
    "external_libs": external,
    "symbol_tag": show["sym_tag"],
    "extras": sorted(pins),
    "tensorflow_pins": {e: pins.get(e) for e in PINNED_EXTRAS},
  }
  return described, problems


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("wheel")
  parser.add_argument("--json", action="store_true", help="print the description as JSON")
  args = parser.parse_args()
  described, problems = report(args.wheel)
  if args.json:
    print(json.dumps(described, indent=1))
  else:
    mib = described["bytes"] / 2**20
    print(f"wheel:      {described['wheel']} ({mib:.2f} MiB)")
    print(
      f"tag:        {', '.join(described['tags'])} (symbol versions allow "
      f"{described['symbol_tag']})"
    )
    print(
      f"TensorFlow: built against {described['tensorflow_built']}; extras pin "
      + ", ".join(f"{e}: {p}" for e, p in described["tensorflow_pins"].items())
    )
    print(
      f"links:      {', '.join(described['external_libs'])} (from the installed "
      "TensorFlow), and the system's libc, libm, libgcc_s, libstdc++"
    )
    for lib, size in described["libraries"].items():
      fatbin = described["nv_fatbin_bytes"].get(lib)
      cuda = f", .nv_fatbin {fatbin / 2**20:.1f} MiB" if fatbin else ""
      print(f"  {lib}: {size / 2**20:.1f} MiB{cuda}")
    print(f"extras:     {', '.join(described['extras'])}")
  for problem in problems:
    print(f"wheel_report: {problem}", file=sys.stderr)
  return 1 if problems else 0


if __name__ == "__main__":
  sys.exit(main())
