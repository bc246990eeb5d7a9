"""Builds the op library and the pybind11 modules (_core; _cuda where nvcc is found)
through the Makefile, so that `make build` and `pip install --no-build-isolation .` compile
exactly the same way."""

import os
import shutil
import subprocess
import sys

from setuptools import Extension
from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
PKG = "tf_largeconv"


class MakeBuildExt(build_ext):
  """Runs `make build` with this interpreter, then places the products where setuptools
  expects the extensions (and the generated _build_info.py next to them)."""

  def run(self):
    subprocess.check_call(["make", "build", f"PY={sys.executable}"], cwd=ROOT)
    for ext in self.extensions:
      stem = ext.name.split(".")[-1]
      suffix = os.path.basename(self.get_ext_filename(ext.name)).split(stem, 1)[1]
      built = os.path.join(ROOT, PKG, stem + suffix)
      self._place(built, self.get_ext_fullpath(ext.name))
    info = os.path.join(ROOT, PKG, "_build_info.py")
    self._place(info, os.path.join(os.path.dirname(self.get_ext_fullpath(f"{PKG}._core")),
                                   "_build_info.py"))

  @staticmethod
  def _place(src, dst):
    if os.path.abspath(src) == os.path.abspath(dst):
      return
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copyfile(src, dst)


EXTENSIONS = [Extension(f"{PKG}._large_conv_ops", sources=[]),
              Extension(f"{PKG}._core", sources=[])]
if shutil.which(os.environ.get("NVCC", "nvcc")):  # the Makefile builds _cuda when it finds nvcc
  EXTENSIONS.append(Extension(f"{PKG}._cuda", sources=[]))

setup(
    ext_modules=EXTENSIONS,
    cmdclass={"build_ext": MakeBuildExt},
)
