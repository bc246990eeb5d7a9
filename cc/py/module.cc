// pybind11 bindings over the framework-free core: geometry and the CPU direct kernels on
// numpy arrays. No TensorFlow here, so kernels can be tested (and, later, driven on a GPU
// machine) without it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "cc/core/common/geometry.h"
#include "cc/core/common/memory.h"
#include "cc/core/conv.h"
#include "cc/core/cpu/fft.h"
#include "cc/core/cpu/isa.h"
#include "cc/core/cpu/spectrum_cache.h"
#include "cc/core/cuda/emulate.h"
#include "cc/core/plan/plan.h"
#include "cc/py/args.h"

namespace largeconv {
namespace {

// An instruction-set choice (cpu/isa.h) as the dict cpu_isa() returns.
py::dict CpuIsaDict(const CpuIsaChoice& c) {
  py::list available;
  for (CpuIsa l : c.available) available.append(CpuIsaName(l));
  py::dict d;
  d["level"] = CpuIsaName(c.level);
  d["available"] = available;
  d["requested"] = c.requested.empty() ? py::object(py::none()) : py::str(c.requested);
  d["problem"] = c.problem;
  return d;
}

// The choice ChooseCpuIsa makes for a CPU that runs the levels named in `available`.
py::dict ChooseCpuIsaFor(const std::vector<std::string>& available, py::object requested) {
  std::vector<CpuIsa> levels;
  for (const std::string& name : available) {
    const auto* it = std::find_if(std::begin(kCpuIsas), std::end(kCpuIsas),
                                  [&](CpuIsa l) { return name == CpuIsaName(l); });
    if (it == std::end(kCpuIsas)) throw py::value_error("available: no level named '" + name + "'");
    levels.push_back(*it);
  }
  const std::string want = requested.is_none() ? "" : requested.cast<std::string>();
  return CpuIsaDict(ChooseCpuIsa(levels, requested.is_none() ? nullptr : want.c_str()));
}

// Splits [0, total) into near-equal contiguous chunks, one std::thread each.
ParallelFor ThreadFor(int n) {
  return [n](int64_t total, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
    if (total <= 0) return;
    const int64_t parts = std::min<int64_t>(n, total);
    std::vector<std::thread> threads;
    for (int64_t p = 1; p < parts; ++p) {
      threads.emplace_back(fn, total * p / parts, total * (p + 1) / parts);
    }
    fn(0, total / parts);
    for (auto& t : threads) t.join();
  };
}

int ThreadCount(int num_threads) {
  const int n =
      num_threads > 0 ? num_threads : static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, n);
}

PlanRequest Request(const std::string& algorithm, int64_t workspace_limit, int threads,
                    DtypeInfo dtype, bool allow_tf = false) {
  PlanRequest r;
  r.allow_tf = allow_tf;
  ThrowIfError(ParseAlgorithm(algorithm, &r.algorithm));
  r.workspace_limit = workspace_limit;
  r.threads = threads;
  r.real_bytes = dtype.real_bytes;
  r.direct_only = dtype.is_int;
  return r;
}

// The plan of a pass of either geometry (PassPlan, or Pass3dPlan for a Conv3dGeometry).
template <class G>
using PlanFor = std::conditional_t<std::is_same_v<G, Conv3dGeometry>, Pass3dPlan, PassPlan>;

template <class G>
PlanFor<G> Plan(const G& g, ConvPass pass, const PlanRequest& r) {
  PlanFor<G> p;
  ThrowIfError(PlanPass(g, pass, r, &p));
  return p;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Workspace of the plan's exact size, 64-byte aligned.
template <class P>
std::unique_ptr<void, FreeDeleter> Workspace(const P& p) {
  if (p.workspace_bytes == 0) return nullptr;
  const size_t bytes = (static_cast<size_t>(p.workspace_bytes) + 63) / 64 * 64;
  void* mem = std::aligned_alloc(64, bytes);
  if (mem == nullptr) throw std::bad_alloc();
  AdviseHugePages(mem, p.workspace_bytes);
  return std::unique_ptr<void, FreeDeleter>(mem);
}

// One pass on the host: planned and run as the op runs it, or (kEmulate, the functions of
// the cuda_emulation submodule) planned as the GPU plans it and run by the CUDA kernels'
// host emulation (cc/core/cuda/emulate.h): the tests' check of the device index arithmetic.
template <typename T, bool kEmulate, class G>
void RunOnHost(const G& g, ConvPass pass, const T* a, int64_t a_size, const T* b, int64_t b_size,
               T* out, const std::string& algorithm, int64_t workspace_limit, int num_threads) {
  if constexpr (kEmulate) {
    const Algorithm requested = AlgorithmFrom(algorithm);
    Status status;
    {
      py::gil_scoped_release release;
      status = cuda::EmulateCudaPass(g, pass, requested, a, b, out, workspace_limit);
    }
    ThrowIfError(status);
    return;
  }
  const int threads = ThreadCount(num_threads);
  const auto plan =
      Plan(g, pass, Request(algorithm, workspace_limit, threads, {kComputeBytes<T>, kIsInt<T>}));
  auto ws = Workspace(plan);
  py::gil_scoped_release release;
  RunPass(g, plan, a, a_size, b, b_size, out, ws.get(), ThreadFor(threads));
}

template <typename T>
using Array = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
std::vector<int64_t> ShapeOf(const Array<T>& a, const char* name, int rank = 4) {
  if (a.ndim() != rank) {
    throw py::value_error(std::string(name) + " must be a " + std::to_string(rank) + "-D array");
  }
  return std::vector<int64_t>(a.shape(), a.shape() + rank);
}

// The shapes of a pass's tensors: of its operands (a, b) as given, of the tensor it writes
// by `sizes` (the backprop ops' input_shape / filter_shape).
template <typename T>
struct Operands {
  const PassRoles roles;
  const Array<T>& a;
  const Array<T>& b;
  const std::vector<int64_t>& sizes;
  int rank;
  std::vector<int64_t> shape(ConvTensor t) const {
    if (t == roles.a) return ShapeOf(a, t == ConvTensor::kInput ? "input" : "filter", rank);
    if (t == roles.b) return ShapeOf(b, t == ConvTensor::kFilter ? "filter" : "out_backprop", rank);
    return sizes;
  }
};

// The attribute parameters every kernel entry point takes, in LARGECONV_ARGS' order.
#define LARGECONV_ARG_TYPES                                                                        \
  const std::vector<int64_t>&strides, const std::string &padding,                                  \
      const std::vector<int64_t>&explicit_paddings, const std::string &data_format,                \
      const std::vector<int64_t>&dilations, const std::string &algorithm, int64_t workspace_limit, \
      int num_threads
#define LARGECONV_ARG_NAMES                                                                \
  strides, padding, explicit_paddings, data_format, dilations, algorithm, workspace_limit, \
      num_threads

// One pass on host arrays: operands (a, b) in the pass's order (see RolesOf), the shape of
// whichever tensor is given by its sizes instead (the backprop ops' input_shape /
// filter_shape), the result allocated in the shape of the tensor the pass writes.
template <typename T, bool kEmulate>
Array<T> RunArrays(ConvPass pass, const Array<T>& a, const Array<T>& b,
                   const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                   const std::string& padding, const std::vector<int64_t>& explicit_paddings,
                   const std::string& data_format, const std::vector<int64_t>& dilations,
                   const std::string& algorithm, int64_t workspace_limit, int num_threads) {
  const PassRoles roles = RolesOf(pass);
  const Operands<T> operands{roles, a, b, sizes, 4};
  const ConvAttrs attrs = AttrsFrom(strides, padding, explicit_paddings, data_format, dilations);
  const ConvGeometry g = Geometry(operands.shape(ConvTensor::kInput),
                                  operands.shape(ConvTensor::kFilter), attrs, WindowRuleOf(pass));
  if (roles.b == ConvTensor::kOutput) CheckOutBackprop(operands.shape(ConvTensor::kOutput), g);
  Array<T> out(ToVec(g.shape(roles.out)));
  RunOnHost<T, kEmulate>(g, pass, a.data(), a.size(), b.data(), b.size(), out.mutable_data(),
                         algorithm, workspace_limit, num_threads);
  return out;
}

template <typename T, bool kEmulate>
Array<T> Forward(const Array<T>& x, const Array<T>& w, LARGECONV_ARG_TYPES) {
  return RunArrays<T, kEmulate>(ConvPass::kForward, x, w, {}, LARGECONV_ARG_NAMES);
}

template <typename T, bool kEmulate>
Array<T> BackpropInput(const std::vector<int64_t>& input_shape, const Array<T>& w,
                       const Array<T>& dy, LARGECONV_ARG_TYPES) {
  return RunArrays<T, kEmulate>(ConvPass::kBackpropInput, w, dy, input_shape, LARGECONV_ARG_NAMES);
}

template <typename T, bool kEmulate>
Array<T> BackpropFilter(const Array<T>& x, const std::vector<int64_t>& filter_shape,
                        const Array<T>& dy, LARGECONV_ARG_TYPES) {
  return RunArrays<T, kEmulate>(ConvPass::kBackpropFilter, x, dy, filter_shape,
                                LARGECONV_ARG_NAMES);
}

// The plans of a geometry's passes as dicts: describe(plan)'s fields, the estimated flops,
// and for FFT plans what fft_fields(plan, dict) adds.
template <class G, class Describe, class FftFields>
py::list PlansOf(const G& g, const PlanRequest& req, const Describe& describe,
                 const FftFields& fft_fields) {
  py::list out;
  for (ConvPass pass : kPasses) {
    const auto p = Plan(g, pass, req);
    py::dict d = describe(p);
    d["flops"] = p.flops;
    if (p.algorithm == FftAlgorithm::kAlgorithm) fft_fields(p, d);
    out.append(d);
  }
  return out;
}

// --- Three spatial dimensions ------------------------------------------------------------

#define LARGECONV_ARG3D_TYPES                                                                      \
  const std::vector<int64_t>&strides, const std::string &padding, const std::string &data_format,  \
      const std::vector<int64_t>&dilations, const std::string &algorithm, int64_t workspace_limit, \
      int num_threads
#define LARGECONV_ARG3D_NAMES \
  strides, padding, data_format, dilations, algorithm, workspace_limit, num_threads
// One 3-D pass on host arrays, as RunArrays runs a 2-D one.
template <typename T, bool kEmulate>
Array<T> RunArrays3d(ConvPass pass, const Array<T>& a, const Array<T>& b,
                     const std::vector<int64_t>& sizes, LARGECONV_ARG3D_TYPES) {
  const PassRoles roles = RolesOf(pass);
  const Operands<T> operands{roles, a, b, sizes, 5};
  const Conv3dGeometry g =
      Geometry3d(operands.shape(ConvTensor::kInput), operands.shape(ConvTensor::kFilter), strides,
                 padding, data_format, dilations, WindowRuleOf(pass));
  if (roles.b == ConvTensor::kOutput) {
    ThrowIfError(
        CheckOutBackprop(g, ShapeOf5(operands.shape(ConvTensor::kOutput), "out_backprop")));
  }
  Array<T> out(ToVec(g.shape(roles.out)));
  RunOnHost<T, kEmulate>(g, pass, a.data(), a.size(), b.data(), b.size(), out.mutable_data(),
                         algorithm, workspace_limit, num_threads);
  return out;
}

template <typename T, bool kEmulate>
Array<T> Forward3d(const Array<T>& x, const Array<T>& w, LARGECONV_ARG3D_TYPES) {
  return RunArrays3d<T, kEmulate>(ConvPass::kForward, x, w, {}, LARGECONV_ARG3D_NAMES);
}

template <typename T, bool kEmulate>
Array<T> BackpropInput3d(const std::vector<int64_t>& input_shape, const Array<T>& w,
                         const Array<T>& dy, LARGECONV_ARG3D_TYPES) {
  return RunArrays3d<T, kEmulate>(ConvPass::kBackpropInput, w, dy, input_shape,
                                  LARGECONV_ARG3D_NAMES);
}

template <typename T, bool kEmulate>
Array<T> BackpropFilter3d(const Array<T>& x, const std::vector<int64_t>& filter_shape,
                          const Array<T>& dy, LARGECONV_ARG3D_TYPES) {
  return RunArrays3d<T, kEmulate>(ConvPass::kBackpropFilter, x, dy, filter_shape,
                                  LARGECONV_ARG3D_NAMES);
}

py::dict Geometry3dDict(const std::vector<int64_t>& input_shape,
                        const std::vector<int64_t>& filter_shape,
                        const std::vector<int64_t>& strides, const std::string& padding,
                        const std::string& data_format, const std::vector<int64_t>& dilations) {
  const Conv3dGeometry g =
      Geometry3d(input_shape, filter_shape, strides, padding, data_format, dilations);
  py::dict d;
  d["groups"] = g.groups;
  d["out"] = py::tuple(py::cast(ToVec(g.out)));
  d["pad_before"] = py::tuple(py::cast(ToVec(g.pad_before)));
  d["pad_after"] = py::tuple(py::cast(ToVec(g.pad_after)));
  d["output_shape"] = py::tuple(py::cast(ToVec(g.shape(ConvTensor::kOutput))));
  d["macs"] = g.macs();
  return d;
}

py::list Plan3dList(const std::vector<int64_t>& input_shape,
                    const std::vector<int64_t>& filter_shape, LARGECONV_ARG3D_TYPES,
                    const std::string& dtype, bool allow_tf) {
  const Conv3dGeometry g =
      Geometry3d(input_shape, filter_shape, strides, padding, data_format, dilations);
  const PlanRequest req =
      Request(algorithm, workspace_limit, ThreadCount(num_threads), InfoOf(dtype), allow_tf);
  return PlansOf(g, req, PlanFields<Pass3dPlan>, [](const Pass3dPlan& p, py::dict& d) {
    d["fft"] = py::tuple(py::cast(ToVec(p.fft.fft)));
    d["tile"] = py::tuple(py::cast(ToVec(p.fft.tiling.tile)));
    d["tiles"] = py::tuple(py::cast(ToVec(p.fft.tiling.tiles)));
    d["in_block"] = p.fft.in_block;
    d["out_block"] = p.fft.out_block;
    d["slots"] = p.fft.slots;
    d["transforms"] = p.fft_work.transforms;
  });
}

template <typename T, bool kEmulate>
void DefKernels3d(py::module_& m) {
  m.def("conv3d", &Forward3d<T, kEmulate>, py::arg("input"), py::arg("filter"), LARGECONV_ARGS3D,
        py::arg("num_threads") = 0,
        "Forward 3-D convolution (TF Conv3D semantics), planned as the op plans it.");
  m.def("conv3d_backprop_input", &BackpropInput3d<T, kEmulate>, py::arg("input_shape"),
        py::arg("filter"), py::arg("out_backprop"), LARGECONV_ARGS3D, py::arg("num_threads") = 0,
        "Gradient of conv3d with respect to its input.");
  m.def("conv3d_backprop_filter", &BackpropFilter3d<T, kEmulate>, py::arg("input"),
        py::arg("filter_shape"), py::arg("out_backprop"), LARGECONV_ARGS3D,
        py::arg("num_threads") = 0, "Gradient of conv3d with respect to its filter.");
}

py::dict GeometryDict(const std::vector<int64_t>& input_shape,
                      const std::vector<int64_t>& filter_shape, const std::vector<int64_t>& strides,
                      const std::string& padding, const std::vector<int64_t>& explicit_paddings,
                      const std::string& data_format, const std::vector<int64_t>& dilations) {
  const ConvGeometry g =
      Geometry(input_shape, filter_shape,
               AttrsFrom(strides, padding, explicit_paddings, data_format, dilations));
  py::dict d;
  d["batch"] = g.batch;
  d["in_h"] = g.in_h;
  d["in_w"] = g.in_w;
  d["in_c"] = g.in_c;
  d["filter_h"] = g.filter_h;
  d["filter_w"] = g.filter_w;
  d["filter_in_c"] = g.filter_in_c;
  d["out_c"] = g.out_c;
  d["groups"] = g.groups;
  d["stride_h"] = g.stride_h;
  d["stride_w"] = g.stride_w;
  d["dilation_h"] = g.dilation_h;
  d["dilation_w"] = g.dilation_w;
  d["pad_top"] = g.pad_top;
  d["pad_bottom"] = g.pad_bottom;
  d["pad_left"] = g.pad_left;
  d["pad_right"] = g.pad_right;
  d["out_h"] = g.out_h;
  d["out_w"] = g.out_w;
  d["output_shape"] = py::tuple(py::cast(ToVec(g.output_shape())));
  d["macs"] = g.macs();
  return d;
}

py::list PlanList(const std::vector<int64_t>& input_shape, const std::vector<int64_t>& filter_shape,
                  const std::vector<int64_t>& strides, const std::string& padding,
                  const std::vector<int64_t>& explicit_paddings, const std::string& data_format,
                  const std::vector<int64_t>& dilations, const std::string& algorithm,
                  int64_t workspace_limit, int num_threads, const std::string& dtype,
                  bool allow_tf) {
  const ConvGeometry g =
      Geometry(input_shape, filter_shape,
               AttrsFrom(strides, padding, explicit_paddings, data_format, dilations));
  const PlanRequest req =
      Request(algorithm, workspace_limit, ThreadCount(num_threads), InfoOf(dtype), allow_tf);
  const auto describe = [](const PassPlan& p) {
    py::dict d = PlanDict(p);
    d["cost_fft_kept"] = p.fft_kept_seconds;  // whatever was chosen, as the other costs
    d["kept_spectra_bytes"] = p.kept_spectra_bytes;
    return d;
  };
  return PlansOf(g, req, describe, [&g](const PassPlan& p, py::dict& d) {
    d["in_block"] = p.fft.in_block;
    d["out_block"] = p.fft.out_block;
    d["group_block"] = p.fft.group_block;
    d["vec_block"] = p.fft.vec_block;
    d["fft_gemm"] = UsesGemm(g, p.pass, p.fft);  // the products as matrix products
    d["fft_work"] = py::dict(py::arg("transforms") = p.fft_work.transforms,
                             py::arg("transform_points") = p.fft_work.transform_points,
                             py::arg("complex_macs") = p.fft_work.complex_macs,
                             py::arg("filter_reads") = p.fft_work.filter_reads,
                             py::arg("seconds") = p.fft_work.seconds);
    d["slots"] = p.fft.slots;
  });
}

// Raises the exception a core error of `kind` becomes: the tests' check of ThrowIfError,
// whose internal and resource-exhausted paths no CPU-only call reaches.
void RaiseStatus(const std::string& kind, const std::string& message) {
  static const std::pair<const char*, ErrorKind> kKinds[] = {
      {"ok", ErrorKind::kOk},
      {"invalid_argument", ErrorKind::kInvalidArgument},
      {"unimplemented", ErrorKind::kUnimplemented},
      {"resource_exhausted", ErrorKind::kResourceExhausted},
      {"internal", ErrorKind::kInternal}};
  for (const auto& [name, k] : kKinds) {
    if (kind == name) return ThrowIfError(Status(k, message));
  }
  throw py::value_error("kind must name an ErrorKind, got '" + kind + "'");
}

// Test hook: a Python function (fft_h, fft_w, batch, inverse, real_bytes) -> bytes that
// stands for cuFFT's work area in the emulated GPU planner; None: no work area.
py::object& EmulatedWorkArea() {
  static py::object* fn = new py::object(py::none());
  return *fn;
}

// The GPU planner as the host emulation runs it (no cuFFT work areas, unless a test set
// one; a 3-D transform's depth multiplies its batch there).
struct HostCudaPlanner {
  template <class Geometry>
  Status operator()(const Geometry& g, ConvPass pass, Algorithm a, int real_bytes, int64_t limit,
                    cuda::CudaPlan* plan) const {
    const py::object& fn = EmulatedWorkArea();
    if (fn.is_none()) return cuda::PlanEmulatedPass(g, pass, a, real_bytes, limit, plan);
    const cuda::WorkBytesFn work = [&fn](const cuda::TransformShape& s, Status*) {
      return fn(s.fft_h, s.fft_w, s.fft_d * s.batch, s.inverse, s.real_bytes).cast<int64_t>();
    };
    return cuda::PlanEmulatedPass(g, pass, a, real_bytes, limit, plan, &work);
  }
};

template <typename T, bool kEmulate>
void DefKernels(py::module_& m) {
  m.def("conv2d", &Forward<T, kEmulate>, py::arg("input"), py::arg("filter"), LARGECONV_ARGS,
        py::arg("num_threads") = 0,
        "Forward convolution (TF Conv2D semantics), planned as the op plans it.");
  m.def("conv2d_backprop_input", &BackpropInput<T, kEmulate>, py::arg("input_shape"),
        py::arg("filter"), py::arg("out_backprop"), LARGECONV_ARGS, py::arg("num_threads") = 0,
        "Gradient of conv2d with respect to its input.");
  m.def("conv2d_backprop_filter", &BackpropFilter<T, kEmulate>, py::arg("input"),
        py::arg("filter_shape"), py::arg("out_backprop"), LARGECONV_ARGS,
        py::arg("num_threads") = 0, "Gradient of conv2d with respect to its filter.");
}

// The names of a list of instruction-set levels, lowest first.
template <size_t N>
py::tuple LevelNames(const CpuIsa (&levels)[N]) {
  std::vector<std::string> names;
  for (CpuIsa l : levels) names.push_back(CpuIsaName(l));
  return py::tuple(py::cast(names));
}

}  // namespace
}  // namespace largeconv

PYBIND11_MODULE(_core, m) {
  using namespace largeconv;
  m.doc() = "tf_largeconv core kernels (framework-free).";
  m.def("geometry", &GeometryDict, py::arg("input_shape"), py::arg("filter_shape"),
        py::arg("strides"), py::arg("padding"), py::arg("explicit_paddings") = kNone,
        py::arg("data_format") = "NHWC", py::arg("dilations") = kOnes,
        "The ConvGeometry for these shapes and attributes, as a dict.");
  m.def("plan", &PlanList, py::arg("input_shape"), py::arg("filter_shape"), LARGECONV_ARGS,
        py::arg("num_threads") = 0, py::arg("dtype") = "float32", py::arg("allow_tf") = false,
        "The planner's choice for each pass, as a list of dicts.");
  m.def("cuda_plan", &CudaPlanList<HostCudaPlanner>, LARGECONV_PLAN_PYARGS,
        "The GPU planner's choice for each pass (as the host emulation plans it).");
  m.def(
      "_spectrum_cache",
      [] {
        SpectrumCache& c = SpectrumCache::Global();
        return py::make_tuple(c.entries(), c.bytes_held());
      },
      "(entries, bytes) the filter-spectrum cache of this module holds (spectrum_cache.h).");
  m.def("spectrum_cache_budget", &SpectrumCache::BudgetFromEnvironment,
        "The filter-spectrum cache's budget in bytes, from LARGECONV_SPECTRUM_CACHE_MIB as the "
        "op reads it on every call (default 64 MiB; 0: off).");
  m.def(
      "_emulate_cufft_work_area", [](py::object fn) { EmulatedWorkArea() = std::move(fn); },
      py::arg("fn"),
      "Test hook: fn(fft_h, fft_w, batch, inverse, real_bytes) -> bytes stands for cuFFT's "
      "work area in cuda_plan; None: none.");
  m.def("tf_kernels", &TfKernels,
        "Which of TensorFlow's CPU kernels the planner prices TF's passes as: 'onednn' or "
        "'eigen' (plan.h).");
  m.def(
      "cpu_isa", [] { return CpuIsaDict(ActiveCpuIsa()); },
      "The instruction-set level the CPU kernels run at (cpu/isa.h), chosen on first use: "
      "{'level', 'available' (this CPU's levels), 'requested' (LARGECONV_ISA, or None), "
      "'problem' (why a request was not followed, or '')}.");
  m.def("_choose_cpu_isa", &ChooseCpuIsaFor, py::arg("available"), py::arg("requested"),
        "Test hook: the choice cpu_isa() would report on a CPU that runs `available`.");
  m.attr("CPU_ISAS") = LevelNames(kCpuIsas);
  m.def("_raise_status", &RaiseStatus, py::arg("kind"), py::arg("message"),
        "Test hook: raises what a core error of this kind becomes in Python.");
  m.attr("DEFAULT_WORKSPACE_LIMIT") = kDefaultWorkspaceLimit;
  m.attr("DTYPES") = py::tuple(py::cast(DtypeNames()));
  m.attr("ALGORITHMS") = py::tuple(py::cast(AlgorithmNames()));
  m.attr("GPU_ROUTE_BATCH") = cuda::kRouteBatch;
  m.attr("REFERENCE_SLOTS") = kReferenceSlots;
  m.attr("FFT_GEMM_CHANNELS") = kGemmChannels;
  m.attr("FFT_GEMM_SWEEP") = kGemmSweep;
  m.attr("FFT_GEMM_LEVELS") = LevelNames(kGemmLevels);  // the forward passes'
  m.attr("FFT_GEMM_FILTER_LEVELS") = LevelNames(kGemmFilterLevels);
  // float64 first: overload resolution tries in order, and forcecast would otherwise turn
  // double arrays into float32.
  DefKernels<double, false>(m);
  DefKernels<float, false>(m);
  DefKernels<int32_t, false>(m);  // exact: int32 arrays (no forcecast reaches it first)
  m.def("geometry3d", &Geometry3dDict, py::arg("input_shape"), py::arg("filter_shape"),
        py::arg("strides"), py::arg("padding"), py::arg("data_format") = "NDHWC",
        py::arg("dilations") = std::vector<int64_t>{1, 1, 1, 1, 1},
        "The Conv3dGeometry for these shapes and attributes, as a dict.");
  m.def("plan3d", &Plan3dList, py::arg("input_shape"), py::arg("filter_shape"), LARGECONV_ARGS3D,
        py::arg("num_threads") = 0, py::arg("dtype") = "float32", py::arg("allow_tf") = false,
        "The planner's choice for each 3-D pass, as a list of dicts.");
  DefKernels3d<double, false>(m);  // float64 first, as for the 2-D kernels
  DefKernels3d<float, false>(m);
  DefKernels3d<int32_t, false>(m);
  m.def("cuda_plan3d", &CudaPlan3dList<HostCudaPlanner>, LARGECONV_PLAN3D_PYARGS,
        "The GPU planner's choice for each 3-D pass (as the host emulation plans it).");
  py::module_ emulation = m.def_submodule(
      "cuda_emulation",
      "The CUDA kernels run on the host (cc/core/cuda/emulate.h), planned as the GPU plans "
      "them: the same functions as the module's, `algorithm` naming the GPU's ('auto', "
      "'direct' or 'fft').");
  DefKernels<double, true>(emulation);
  DefKernels<float, true>(emulation);
  DefKernels3d<double, true>(emulation);
  DefKernels3d<float, true>(emulation);
}
