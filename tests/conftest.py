"""Shared test set-up: quiet TF logging, make tests/ importable, seeded generators."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng(request):
  """A generator seeded from the test's name, so every test has fixed, distinct data."""
  seed = sum(ord(c) * (i + 1) for i, c in enumerate(request.node.nodeid)) % (2**32)
  return np.random.default_rng(seed)
