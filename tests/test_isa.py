"""The CPU kernels' instruction-set levels (cc/core/cpu/isa.h): which level runs, how
LARGECONV_ISA forces a lower one, and that every level this machine has computes the same
results: bit for bit across thread counts within a level, and within float rounding of the
AVX level's (whose bits tests/test_core_results.py pins) across levels. A level is chosen
once per process, so each runs in a child of its own."""

import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import subproc
from cpuinfo import cpu_flags

from tf_largeconv import _core

LEVELS = _core.CPU_ISAS
AVAILABLE = tuple(_core.cpu_isa()["available"])
CORE_RESULTS = os.path.join(subproc.REPO_ROOT, "tools", "core_results.py")


@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="reads Linux's /proc/cpuinfo")
def test_the_detected_levels_are_what_the_cpu_reports():
  flags = cpu_flags()
  want = ["avx"]
  if {"avx2", "fma"} <= flags:
    want.append("avx2")
    if {"avx512f", "avx512dq", "avx512bw", "avx512vl"} <= flags:
      want.append("avx512")
  assert list(AVAILABLE) == want
  assert LEVELS == ("avx", "avx2", "avx512")


def test_avx_runs_unless_a_wider_level_is_asked_for():
  everything = ["avx", "avx2", "avx512"]
  assert _core._choose_cpu_isa(everything, None) == {
    "level": "avx",
    "available": everything,
    "requested": None,
    "problem": "",
  }
  assert _core._choose_cpu_isa(everything, "")["level"] == "avx"
  assert _core._choose_cpu_isa(everything, "avx512")["level"] == "avx512"
  got = _core._choose_cpu_isa(everything, " AVX2 ")
  assert (got["level"], got["requested"], got["problem"]) == ("avx2", " AVX2 ", "")
  assert _core._choose_cpu_isa(["avx"], "avx")["level"] == "avx"


def test_a_level_the_cpu_lacks_runs_avx_and_says_why():
  got = _core._choose_cpu_isa(["avx", "avx2"], "avx512")
  assert got["level"] == "avx"
  assert got["problem"] == (
    "LARGECONV_ISA='avx512' asks for a level this CPU lacks: it runs avx, avx2 (the "
    "variable takes avx, avx2, avx512); running avx instead"
  )
  got = _core._choose_cpu_isa(["avx", "avx2", "avx512"], "sse4")
  assert got["level"] == "avx"
  assert got["problem"] == (
    "LARGECONV_ISA='sse4' is not an instruction-set level: it takes avx, avx2, avx512, or "
    "is unset for avx; running avx instead"
  )
  with pytest.raises(ValueError, match="available: no level named 'sse'"):
    _core._choose_cpu_isa(["avx", "sse"], None)


REPORT = """
import json, warnings
with warnings.catch_warnings(record=True) as caught:
  warnings.simplefilter("always")
  import tf_largeconv
report = tf_largeconv.info()["cpu_isa"]
report["core"] = tf_largeconv._loader.core().cpu_isa()["level"]
report["warnings"] = [str(w.message) for w in caught if "LARGECONV_ISA" in str(w.message)]
print(json.dumps(report))
"""


def _report(requested):
  env = subproc.child_env(LARGECONV_ISA=requested)
  return json.loads(subproc.run(REPORT, timeout=300, env=env).stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("level", AVAILABLE)
def test_info_names_the_level_that_runs_and_the_variable_forces_it(level):
  report = _report(level)
  assert (report["level"], report["core"]) == (level, level)
  assert report["requested"] == level and report["problem"] == "" and report["warnings"] == []
  assert report["available"] == list(AVAILABLE)


def test_a_request_of_no_level_warns_at_import_and_runs_avx():
  report = _report("avx1024")
  assert (report["level"], report["core"]) == ("avx", "avx")
  assert report["problem"].startswith("LARGECONV_ISA='avx1024' is not an instruction-set level")
  assert report["warnings"] == ["tf_largeconv: " + report["problem"]]


def _dump(level, tmp_path_factory):
  """Every result of tools/core_results.py, computed at `level` in a child."""
  out = tmp_path_factory.mktemp(f"isa_{level}") / "results.npz"
  env = subproc.child_env(LARGECONV_ISA=level)
  subproc.run(CORE_RESULTS, "dump", out, timeout=1800, env=env)
  with np.load(out) as f:
    return dict(f)


@pytest.fixture(scope="module")
def avx_results(tmp_path_factory):
  return _dump("avx", tmp_path_factory)


# How far a float result of another level may be from the AVX level's: 16 units of the
# type's rounding, relative to the result's largest magnitude (each output is a sum of
# products, FFT or direct, whose rounding is of the order of eps times the largest terms;
# fused multiply-adds round them differently, never more coarsely). Measured here: at
# most 6 units in float32 and 4 in float64.
ROUNDING = {name: 16 * float(np.finfo(name).eps) for name in ("float32", "float64")}


def _rounding_differences(got, want):
  """Names whose results differ by more than rounding, with the relative difference."""
  bad = {}
  for k, w in want.items():
    g = got[k]
    if w.dtype.kind != "f" or k.endswith("-error"):
      if g.dtype != w.dtype or g.tobytes() != w.tobytes():
        bad[k] = "bits"
      continue
    scale = max(float(np.max(np.abs(w), initial=0.0)), np.finfo(w.dtype).tiny)
    diff = float(np.max(np.abs(g.astype(np.float64) - w), initial=0.0)) / scale
    if g.shape != w.shape or not diff <= ROUNDING[w.dtype.name]:
      bad[k] = diff
  return bad


@pytest.fixture(scope="module")
def wider_results(tmp_path_factory):
  return {level: _dump(level, tmp_path_factory) for level in AVAILABLE if level != "avx"}


WIDER_LEVELS = [level for level in AVAILABLE if level != "avx"]


@pytest.mark.parametrize("level", WIDER_LEVELS)
def test_every_level_agrees_with_the_avx_level_to_rounding(level, avx_results, wider_results):
  got = wider_results[level]
  assert sorted(got) == sorted(avx_results)
  assert _rounding_differences(got, avx_results) == {}
  # Not the same build twice: the wider level's arithmetic differs somewhere.
  assert any(got[k].tobytes() != v.tobytes() for k, v in avx_results.items())


# Every level gives the same bits whatever the thread count: its FFT files are built with
# nothing fused (the Makefile's ISA_EXACT_FLAGS).
@pytest.mark.parametrize("level", WIDER_LEVELS)
def test_every_level_gives_the_same_bits_on_one_thread_and_two(level, wider_results):
  got = wider_results[level]
  pairs = [(k, k.replace("-t1", "-t2", 1)) for k in got if "-t1" in k]
  assert len(pairs) > 1000
  assert [a for a, b in pairs if got[a].tobytes() != got[b].tobytes()] == []


def test_rounding_differences_are_found():
  want = {"a": np.array([1.0, -2.0], np.float32), "b-error": np.frombuffer(b"no", np.uint8)}
  close = {"a": np.array([1.0, -2.0 + 2.4e-6], np.float32), "b-error": want["b-error"]}
  assert _rounding_differences(close, want) == {}
  far = {"a": np.array([1.0, -2.0 + 1e-4], np.float32), "b-error": np.frombuffer(b"on", np.uint8)}
  bad = _rounding_differences(far, want)
  assert sorted(bad) == ["a", "b-error"] and bad["a"] == pytest.approx(5e-5, rel=0.1)


# The oracle tests of the kernels (float64 references, TensorFlow's kernels), each level
# running them whole: forward, both gradients, dtypes, depthwise, 3-D, non-finite inputs,
# many channels' matrix products (Eigen's kernels with the level's FMA, one thread or two).
ORACLE_TESTS = [
  "test_ops.py::test_forward_float64_matches_oracle",
  "test_ops.py::test_fft_runs_of_tiles_match_oracle",
  "test_ops.py::test_forward_dtypes",
  "test_ops.py::test_nan_and_inf_propagate_like_tf",
  "test_gradients.py::test_backprop_ops_match_oracle",
  "test_depthwise.py::test_depthwise_forward_and_gradients_match_oracle",
  "test_conv3d.py::test_passes_match_oracle",
  "test_fft_gemm.py::test_gemm_passes_match_the_oracle_on_any_thread_count",
]


@pytest.mark.parametrize("level", [level for level in AVAILABLE if level != "avx"])
def test_the_oracle_tests_pass_at_every_level(level):
  env = subproc.child_env(LARGECONV_ISA=level)
  args = ["-q", "-x", "-p", "no:cacheprovider", *ORACLE_TESTS]
  out = subproc.run("-m pytest", *args, timeout=3600, env=env).stdout
  assert " passed" in out and "failed" not in out, out[-2000:]


# Instructions beyond AVX in objdump's AT&T syntax: AVX-512's registers and broadcasts,
# FMA, and AVX2's 256-bit integer operations (AVX has none but these four).
WIDER = {
  "avx512": re.compile(r"%zmm|%k[0-7]|\{1to"),
  "fma": re.compile(r"\bvfn?m(add|sub)"),
  "avx2": re.compile(r"\b(?!vpermilp[sd]\b|vperm2f128\b|vptest\b)(vp\w+|v\w+i128)\b.*%ymm"),
}
ORDER = ("avx", "avx2", "avx512")


def wider_than_their_level(disassembly):
  """Functions of objdump -d -C output whose code uses instructions beyond their level:
  the level in their name (isa_avx2, isa_avx512, or DUCC's namespace of that level), or
  AVX for every other function."""
  bad, name = {}, None
  for line in disassembly.splitlines():
    head = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
    if head:
      name = head.group(1)
      level = next((lv for lv in ORDER[::-1] if f"isa_{lv}" in name), "avx")
      continue
    if name is None or "\t" not in line:
      continue
    op = line.split("\t", 1)[1]
    for kind, pattern in WIDER.items():
      needs = "avx512" if kind == "avx512" else "avx2"
      if ORDER.index(needs) > ORDER.index(level) and pattern.search(op):
        bad.setdefault(name, set()).add(kind)
  return bad


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils' objdump")
@pytest.mark.parametrize("library", ["_core", "_large_conv_ops"])
def test_no_code_runs_wider_than_its_level(library):
  """What a level's objects emit from shared headers (inline functions, the C++ library's
  templates) must not be the copy the rest of the library calls: the build links the levels
  lowest first, so the linker keeps the lowest copy."""
  from tf_largeconv import _loader

  path = _loader._library_path(library)
  out = subprocess.run(
    ["objdump", "-d", "-C", "--no-show-raw-insn", path], capture_output=True, text=True, check=True
  ).stdout
  assert "isa_avx512" in out and "vfmadd" in out  # the levels are there to be checked
  assert wider_than_their_level(out) == {}


def test_wider_code_outside_its_level_is_found():
  text = (
    "0000 <largeconv::isa_avx2::Mac(float*)>:\n  10:\tvfmadd231ps %ymm1,%ymm2,%ymm3\n"
    "0020 <std::vector<long>::push(long)>:\n  30:\tvpaddq %ymm1,%ymm2,%ymm3\n"
    "  34:\tvpermilps $0xb1,%ymm1,%ymm2\n"
    "0040 <largeconv::isa_avx2::Sum(float*)>:\n  50:\tvaddps %zmm1,%zmm2,%zmm3\n"
    "0060 <tf_largeconv_ducc0_isa_avx512::pass(float*)>:\n  70:\tvaddps %zmm1,%zmm2,%zmm3\n"
  )
  assert wider_than_their_level(text) == {
    "std::vector<long>::push(long)": {"avx2"},
    "largeconv::isa_avx2::Sum(float*)": {"avx512"},
  }
