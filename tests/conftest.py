"""Shared test set-up: quiet TF logging, TF's Eigen kernels, make tests/ and benchmarks/
importable, seeded generators."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TF's Eigen kernels, on every machine: they are the oracle of the contract tests, whose
# errors TF's oneDNN kernels (on by default on CPUs with AVX512_VNNI, AVX512_BF16, AVX_VNNI
# or AMX) do not raise: some return a result, some abort the process. Tests of the
# planner's pricing of either set start children with the setting they need.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
# The CPU kernels' AVX level (cc/core/cpu/isa.h), on every machine: the level whose bits
# tests/test_core_results.py pins and whose cost model tests/test_planner.py's choices
# follow. tests/test_isa.py runs every other level this machine has in children of its own.
os.environ.setdefault("LARGECONV_ISA", "avx")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# The repository root, for `benchmarks` (measurement helpers, and the benchmarks' own code
# under test): last, so that it never puts the checkout's tf_largeconv before the one
# under test.
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import pytest


@pytest.fixture
def rng(request):
  """A generator seeded from the test's name, so every test has fixed, distinct data."""
  seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.nodeid)) % (2**32)
  return np.random.default_rng(seed)
