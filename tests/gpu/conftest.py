"""GPU test set-up. These tests need a CUDA device, torch and the built tf_largeconv/_cuda
extension (`make cuda`), and no TensorFlow: the extensions are loaded from their files, not
through the tf_largeconv package. Everything here is skipped, test by test with the reason,
on machines without a GPU; with LARGECONV_REQUIRE_GPU=1 (`make gpu-check`) a missing GPU,
torch or extension fails every test instead."""

import glob
import importlib.util
import os

import pytest
from cases import gpu_required

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_extension(name):
  """tf_largeconv/<name>*.so as a module, or None when it has not been built."""
  paths = glob.glob(os.path.join(ROOT, "tf_largeconv", name + ".*so"))
  if not paths:
    return None
  spec = importlib.util.spec_from_file_location(name, paths[0])
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _skip_reason():
  try:
    import torch
  except ImportError:
    return "torch is not installed"
  if not torch.cuda.is_available():
    return "no CUDA device"
  if load_extension("_cuda") is None:
    return "tf_largeconv/_cuda is not built (run `make cuda` where nvcc is installed)"
  return None


def pytest_collection_modifyitems(config, items):
  reason = _skip_reason()
  if reason is None:
    return
  here = os.path.dirname(os.path.abspath(__file__))
  for item in items:
    if str(item.fspath).startswith(here):
      if gpu_required():
        item.add_marker(pytest.mark.usefixtures("_gpu_missing"))
      else:
        item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def _gpu_missing():
  pytest.fail(f"LARGECONV_REQUIRE_GPU is set but {_skip_reason()}")


@pytest.fixture(scope="session")
def cuda_ext():
  return load_extension("_cuda")


@pytest.fixture(scope="session")
def core_ext():
  """The host module, which needs TensorFlow's DUCC headers to build: absent on GPU
  machines without TensorFlow, where the tests that compare with it are skipped."""
  ext = load_extension("_core")
  if ext is None:
    # Not a GPU failure: GPU machines have no TensorFlow to build it with.
    pytest.skip("tf_largeconv/_core is not built (it needs TensorFlow's headers)")
  return ext


@pytest.fixture(scope="session", autouse=True)
def exact_torch():
  """Full-precision float32 in torch (no TF32), so it is a fair oracle."""
  try:
    import torch
  except ImportError:
    yield
    return
  torch.backends.cuda.matmul.allow_tf32 = False
  torch.backends.cudnn.allow_tf32 = False
  yield
