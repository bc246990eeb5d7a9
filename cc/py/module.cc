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
#include <vector>

#include "cc/core/conv.h"
#include "cc/core/cuda/emulate.h"
#include "cc/core/geometry.h"
#include "cc/core/plan.h"
#include "cc/py/args.h"

namespace largeconv {
namespace {

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
  const int n = num_threads > 0 ? num_threads : static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, n);
}

PlanRequest Request(const std::string& algorithm, int64_t workspace_limit, int threads,
                    int real_bytes, bool allow_tf = false) {
  PlanRequest r;
  r.allow_tf = allow_tf;
  std::string err = ParseAlgorithm(algorithm, &r.algorithm);
  if (!err.empty()) throw py::value_error(err);
  r.workspace_limit = workspace_limit;
  r.threads = threads;
  r.real_bytes = real_bytes;
  return r;
}

PassPlan Plan(const ConvGeometry& g, ConvPass pass, const PlanRequest& r) {
  PassPlan p;
  std::string err = PlanPass(g, pass, r, &p);
  if (!err.empty()) throw py::value_error(err);
  return p;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Workspace of the plan's exact size, 64-byte aligned.
std::unique_ptr<void, FreeDeleter> Workspace(const PassPlan& p) {
  if (p.workspace_bytes == 0) return nullptr;
  const size_t bytes = (static_cast<size_t>(p.workspace_bytes) + 63) / 64 * 64;
  void* mem = std::aligned_alloc(64, bytes);
  if (mem == nullptr) throw std::bad_alloc();
  return std::unique_ptr<void, FreeDeleter>(mem);
}

// algorithm="cuda_emulation" runs the CUDA direct tile kernels (cc/core/cuda/tiles.h) on
// the host, phase by phase as a thread block would; "cuda_fft_emulation" the GPU's FFT path
// (cc/core/cuda/fft_pipeline.h, DUCC standing in for cuFFT); "cuda_auto_emulation" whichever
// the GPU planner picks. The tests' check of the device index arithmetic.
bool CudaEmulation(const std::string& algorithm, Algorithm* a) {
  if (algorithm == "cuda_emulation") {
    *a = Algorithm::kDirect;
  } else if (algorithm == "cuda_fft_emulation") {
    *a = Algorithm::kFft;
  } else if (algorithm == "cuda_auto_emulation") {
    *a = Algorithm::kAuto;
  } else {
    return false;
  }
  return true;
}

// One pass on the host: planned and run as the op runs it, or emulated.
template <typename T>
void RunOnHost(const ConvGeometry& g, ConvPass pass, const T* a, int64_t a_size, const T* b,
               int64_t b_size, T* out, const std::string& algorithm, int64_t workspace_limit,
               int num_threads) {
  Algorithm emulated;
  if (CudaEmulation(algorithm, &emulated)) {
    std::string err;
    {
      py::gil_scoped_release release;
      err = cuda::EmulateCudaPass(g, pass, emulated, a, b, out, workspace_limit);
    }
    if (!err.empty()) throw py::value_error(err);
    return;
  }
  const int threads = ThreadCount(num_threads);
  const PassPlan plan = Plan(g, pass, Request(algorithm, workspace_limit, threads, sizeof(T)));
  auto ws = Workspace(plan);
  py::gil_scoped_release release;
  RunPass(g, plan, a, a_size, b, b_size, out, ws.get(), ThreadFor(threads));
}

template <typename T>
using Array = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
std::vector<int64_t> ShapeOf(const Array<T>& a, const char* name) {
  if (a.ndim() != 4) throw py::value_error(std::string(name) + " must be a 4-D array");
  return {a.shape(0), a.shape(1), a.shape(2), a.shape(3)};
}

template <typename T>
Array<T> Forward(const Array<T>& x, const Array<T>& w, const std::vector<int64_t>& strides,
                 const std::string& padding, const std::vector<int64_t>& explicit_paddings,
                 const std::string& data_format, const std::vector<int64_t>& dilations,
                 const std::string& algorithm, int64_t workspace_limit, int num_threads) {
  const ConvAttrs a = AttrsFrom(strides, padding, explicit_paddings, data_format, dilations);
  const ConvGeometry g = Geometry(ShapeOf(x, "input"), ShapeOf(w, "filter"), a);
  Array<T> y(ToVec(g.output_shape()));
  RunOnHost(g, ConvPass::kForward, x.data(), x.size(), w.data(), w.size(), y.mutable_data(),
            algorithm, workspace_limit, num_threads);
  return y;
}

template <typename T>
Array<T> BackpropInput(const std::vector<int64_t>& input_shape, const Array<T>& w,
                       const Array<T>& dy, const std::vector<int64_t>& strides,
                       const std::string& padding,
                       const std::vector<int64_t>& explicit_paddings,
                       const std::string& data_format, const std::vector<int64_t>& dilations,
                       const std::string& algorithm, int64_t workspace_limit, int num_threads) {
  const ConvAttrs a = AttrsFrom(strides, padding, explicit_paddings, data_format, dilations);
  const ConvGeometry g = Geometry(input_shape, ShapeOf(w, "filter"), a);
  CheckOutBackprop(ShapeOf(dy, "out_backprop"), g);
  Array<T> dx(input_shape);
  RunOnHost(g, ConvPass::kBackpropInput, w.data(), w.size(), dy.data(), dy.size(),
            dx.mutable_data(), algorithm, workspace_limit, num_threads);
  return dx;
}

template <typename T>
Array<T> BackpropFilter(const Array<T>& x, const std::vector<int64_t>& filter_shape,
                        const Array<T>& dy, const std::vector<int64_t>& strides,
                        const std::string& padding,
                        const std::vector<int64_t>& explicit_paddings,
                        const std::string& data_format, const std::vector<int64_t>& dilations,
                        const std::string& algorithm, int64_t workspace_limit,
                        int num_threads) {
  const ConvAttrs a = AttrsFrom(strides, padding, explicit_paddings, data_format, dilations);
  const ConvGeometry g = Geometry(ShapeOf(x, "input"), filter_shape, a);
  CheckOutBackprop(ShapeOf(dy, "out_backprop"), g);
  Array<T> dw(filter_shape);
  RunOnHost(g, ConvPass::kBackpropFilter, x.data(), x.size(), dy.data(), dy.size(),
            dw.mutable_data(), algorithm, workspace_limit, num_threads);
  return dw;
}

py::dict GeometryDict(const std::vector<int64_t>& input_shape,
                      const std::vector<int64_t>& filter_shape,
                      const std::vector<int64_t>& strides, const std::string& padding,
                      const std::vector<int64_t>& explicit_paddings,
                      const std::string& data_format, const std::vector<int64_t>& dilations) {
  const ConvGeometry g = Geometry(
      input_shape, filter_shape,
      AttrsFrom(strides, padding, explicit_paddings, data_format, dilations));
  py::dict d;
  d["batch"] = g.batch; d["in_h"] = g.in_h; d["in_w"] = g.in_w; d["in_c"] = g.in_c;
  d["filter_h"] = g.filter_h; d["filter_w"] = g.filter_w;
  d["filter_in_c"] = g.filter_in_c; d["out_c"] = g.out_c; d["groups"] = g.groups;
  d["stride_h"] = g.stride_h; d["stride_w"] = g.stride_w;
  d["dilation_h"] = g.dilation_h; d["dilation_w"] = g.dilation_w;
  d["pad_top"] = g.pad_top; d["pad_bottom"] = g.pad_bottom;
  d["pad_left"] = g.pad_left; d["pad_right"] = g.pad_right;
  d["out_h"] = g.out_h; d["out_w"] = g.out_w;
  d["output_shape"] = py::tuple(py::cast(ToVec(g.output_shape())));
  d["macs"] = g.macs();
  return d;
}

py::list PlanList(const std::vector<int64_t>& input_shape,
                  const std::vector<int64_t>& filter_shape, const std::vector<int64_t>& strides,
                  const std::string& padding, const std::vector<int64_t>& explicit_paddings,
                  const std::string& data_format, const std::vector<int64_t>& dilations,
                  const std::string& algorithm, int64_t workspace_limit, int num_threads,
                  int real_bytes, bool allow_tf) {
  const ConvGeometry g = Geometry(
      input_shape, filter_shape,
      AttrsFrom(strides, padding, explicit_paddings, data_format, dilations));
  const PlanRequest req =
      Request(algorithm, workspace_limit, ThreadCount(num_threads), real_bytes, allow_tf);
  py::list out;
  for (ConvPass pass : {ConvPass::kForward, ConvPass::kBackpropInput, ConvPass::kBackpropFilter}) {
    const PassPlan p = Plan(g, pass, req);
    py::dict d;
    d["pass"] = PassName(pass);
    d["algorithm"] = AlgorithmName(p.algorithm);
    d["workspace_bytes"] = p.workspace_bytes;
    d["flops"] = p.flops;
    d["cost_direct"] = p.cost_direct;
    d["cost_fft"] = p.cost_fft;
    d["cost_tf"] = p.cost_tf;
    if (p.algorithm == Algorithm::kFft) {
      d["fft"] = py::make_tuple(p.fft.fft_h, p.fft.fft_w);
      d["tile"] = py::make_tuple(p.tiling.tile_h, p.tiling.tile_w);
      d["tiles"] = py::make_tuple(p.tiling.tiles_h, p.tiling.tiles_w);
      d["in_block"] = p.fft.in_block;
      d["out_block"] = p.fft.out_block;
      d["group_block"] = p.fft.group_block;
      d["vec_block"] = p.fft.vec_block;
      d["slots"] = p.fft.slots;
    }
    out.append(d);
  }
  return out;
}

// The GPU planner as the host emulation runs it (no cuFFT work areas).
struct HostCudaPlanner {
  std::string operator()(const ConvGeometry& g, ConvPass pass, Algorithm a, int real_bytes,
                         int64_t limit, cuda::CudaPlan* plan) const {
    return cuda::PlanEmulatedPass(g, pass, a, real_bytes, limit, plan);
  }
};

template <typename T>
void DefKernels(py::module_& m) {
  m.def("conv2d", &Forward<T>, py::arg("input"), py::arg("filter"), LARGECONV_ARGS,
        py::arg("num_threads") = 0, "Forward convolution (TF Conv2D semantics), planned as the op plans it.");
  m.def("conv2d_backprop_input", &BackpropInput<T>, py::arg("input_shape"), py::arg("filter"),
        py::arg("out_backprop"), LARGECONV_ARGS, py::arg("num_threads") = 0,
        "Gradient of conv2d with respect to its input.");
  m.def("conv2d_backprop_filter", &BackpropFilter<T>, py::arg("input"),
        py::arg("filter_shape"), py::arg("out_backprop"), LARGECONV_ARGS,
        py::arg("num_threads") = 0, "Gradient of conv2d with respect to its filter.");
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
        py::arg("num_threads") = 0, py::arg("real_bytes") = 4, py::arg("allow_tf") = false,
        "The planner's choice for each pass, as a list of dicts.");
  m.def("cuda_plan", &CudaPlanList<HostCudaPlanner>, LARGECONV_PLAN_PYARGS,
        "The GPU planner's choice for each pass (as the host emulation plans it).");
  m.attr("DEFAULT_WORKSPACE_LIMIT") = kDefaultWorkspaceLimit;
  // float64 first: overload resolution tries in order, and forcecast would otherwise turn
  // double arrays into float32.
  DefKernels<double>(m);
  DefKernels<float>(m);
}
