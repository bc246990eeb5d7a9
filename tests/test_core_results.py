"""The CPU kernels' results, bit for bit: every result tools/core_results.py computes (the
problems of tests/cases.py and a few larger ones, every algorithm, dtype, format and pass,
on one thread and two) has the digest tests/data/core_results.json records. A change to
the kernels' arithmetic shows here; one that is meant rewrites the file with
`LARGECONV_ISA=avx python tools/core_results.py digest tests/data/core_results.json`.
The digests are those of the AVX level (cc/core/cpu/isa.h), which the results are computed
at in a child process; tests/test_isa.py holds the other levels to them within rounding."""

import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))

import core_results  # noqa: E402
import subproc  # noqa: E402


def test_results_match_the_recorded_digests(tmp_path):
  with open(os.path.join(ROOT, "tests", "data", "core_results.json")) as f:
    want = json.load(f)
  out = tmp_path / "digests.json"
  script = os.path.join(ROOT, "tools", "core_results.py")
  subproc.run(script, "digest", out, timeout=1800, env=subproc.child_env(LARGECONV_ISA="avx"))
  with open(out) as f:
    got = json.load(f)
  assert len(got) > 2000  # every problem ran
  assert sorted(k for k in got if got[k] != want.get(k)) == []
  assert sorted(set(want) - set(got)) == []
  # One thread or two, the same bits (docs/guide/semantics.md), small workspace limits too.
  pairs = [(k, k.replace("-t1", "-t2", 1)) for k in got if "-t1" in k]
  assert len(pairs) > 1000
  assert [a for a, b in pairs if got[a] != got[b]] == []


def test_differences_are_found():
  import numpy as np

  a = {"x": np.zeros(3, np.float32), "y": np.ones(2)}
  b = {"x": np.array([0, 0, -0.0], np.float32), "z": np.ones(2)}
  assert core_results.differences(a, b) == ["y", "z", "x"]
