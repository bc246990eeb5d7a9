// pybind11 module tf_largeconv._cuda: the CUDA kernels on device arrays, with no
// TensorFlow, so they can be tested and timed on any machine with a GPU (arrays from torch,
// CuPy or anything else exposing __cuda_array_interface__). Outputs are caller-allocated;
// work is enqueued on the caller's stream and nothing synchronises.
#include <cuda_runtime_api.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "cc/core/common/dtypes.h"
#include "cc/core/common/geometry.h"
#include "cc/core/cuda/cuda_status.h"
#include "cc/core/cuda/cufft.h"
#include "cc/core/cuda/launch.h"
#include "cc/py/args.h"

namespace largeconv {
namespace {

struct DeviceArray {
  void* data = nullptr;
  std::vector<int64_t> shape;
  std::string dtype;  // a name of the dtype list (dtypes.h)
};

int64_t ElementBytes(const std::string& dtype) {
#define LARGECONV_BYTES(C, NAME, TF_WORD) \
  if (dtype == #NAME) return sizeof(C);
  LARGECONV_FOR_EACH_FLOAT_DTYPE(LARGECONV_BYTES)
#undef LARGECONV_BYTES
  return 0;
}

// dtype_override: "" to take the array's own typestr, or "bfloat16" for 2-byte integer
// views of bfloat16 data (torch exposes no typestr for bfloat16). rank: 4 (Conv2D) or 5
// (Conv3D).
DeviceArray FromInterface(const py::object& o, const char* name, const std::string& dtype_override,
                          int rank = 4) {
  if (!py::hasattr(o, "__cuda_array_interface__")) {
    throw py::value_error(std::string(name) +
                          " must be a CUDA device array exposing __cuda_array_interface__ "
                          "(e.g. a torch CUDA tensor or a CuPy array)");
  }
  const py::dict d = o.attr("__cuda_array_interface__");
  DeviceArray a;
  a.shape = d["shape"].cast<std::vector<int64_t>>();
  const std::string typestr = d["typestr"].cast<std::string>();
  if (dtype_override == "bfloat16") {
    if (typestr != "<i2" && typestr != "<u2") {
      throw py::value_error(std::string(name) +
                            ": dtype='bfloat16' needs a 2-byte integer view, got typestr " +
                            typestr);
    }
    a.dtype = "bfloat16";
  } else if (!dtype_override.empty()) {
    throw py::value_error("dtype must be '' or 'bfloat16', got '" + dtype_override + "'");
  } else if (typestr == "<f4") {
    a.dtype = "float32";
  } else if (typestr == "<f8") {
    a.dtype = "float64";
  } else if (typestr == "<f2") {
    a.dtype = "float16";
  } else {
    throw py::value_error(std::string(name) +
                          " must be float16, bfloat16, float32 or float64, "
                          "got typestr " +
                          typestr);
  }
  if (static_cast<int>(a.shape.size()) != rank) {
    throw py::value_error(std::string(name) + " must be " + std::to_string(rank) + "-D");
  }
  if (d.contains("strides") && !d["strides"].is_none()) {
    const auto strides = d["strides"].cast<std::vector<int64_t>>();
    int64_t expect = ElementBytes(a.dtype);
    for (int i = rank - 1; i >= 0; --i) {
      if (a.shape[i] > 1 && strides[i] != expect) {
        throw py::value_error(std::string(name) + " must be C-contiguous");
      }
      expect *= a.shape[i];
    }
  }
  a.data = reinterpret_cast<void*>(d["data"].cast<py::tuple>()[0].cast<uintptr_t>());
  return a;
}

void CheckCuda(cudaError_t e, const char* what) { ThrowIfError(cuda::CudaStatus(what, e)); }

cuda::CudaPlan PlanOrThrow(const ConvGeometry& g, ConvPass pass, const std::string& algorithm,
                           int real_bytes, int64_t workspace_limit) {
  cuda::CudaPlan plan;
  ThrowIfError(
      cuda::PlanCudaPass(g, pass, AlgorithmFrom(algorithm), real_bytes, workspace_limit, &plan));
  return plan;
}

// Makes the arrays' device current for the call (plans, cuFFT and the workspace all
// belong to the current device) and restores the caller's on the way out.
class DeviceGuard {
 public:
  DeviceGuard(const DeviceArray& a, const DeviceArray& b, const DeviceArray& out) {
    CheckCuda(cudaGetDevice(&previous_), "cudaGetDevice");
    int device = -1;
    for (const DeviceArray* array : {&a, &b, &out}) {
      if (array->data == nullptr) continue;  // an empty array has no memory to locate
      cudaPointerAttributes attr;
      if (cudaPointerGetAttributes(&attr, array->data) != cudaSuccess ||
          (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)) {
        cudaGetLastError();  // a failed query is not a sticky error; clear it
        throw py::value_error("the arrays must be in CUDA device memory");
      }
      if (device >= 0 && attr.device != device) {
        throw py::value_error("all three arrays must be on the same CUDA device");
      }
      device = attr.device;
    }
    if (device >= 0 && device != previous_) CheckCuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

// Geometry: ConvGeometry or Conv3dGeometry, here and below.
template <typename T, class Geometry>
void Launch(const Geometry& g, ConvPass pass, const DeviceArray& a, const DeviceArray& b,
            const DeviceArray& out, const std::string& algorithm, int64_t workspace_limit,
            cudaStream_t stream) {
  const DeviceGuard device(a, b, out);
  const Algorithm requested = AlgorithmFrom(algorithm);
  cuda::CudaPlan plan;
  Status plan_status, run_status;
  void* ws = nullptr;
  cudaError_t alloc = cudaSuccess, release = cudaSuccess;
  {
    // Planning may create cuFFT plans; neither it nor the launch needs Python.
    py::gil_scoped_release nogil;
    plan_status = cuda::PlanCudaPass(g, pass, requested, kComputeBytes<T>, workspace_limit, &plan);
    if (plan_status.ok() && plan.workspace_bytes > 0) {
      alloc = cudaMallocAsync(&ws, plan.workspace_bytes, stream);
    }
    if (plan_status.ok() && alloc == cudaSuccess) {
      run_status =
          cuda::RunCudaPass(g, plan, static_cast<const T*>(a.data), static_cast<const T*>(b.data),
                            static_cast<T*>(out.data), ws, stream);
      if (ws != nullptr) release = cudaFreeAsync(ws, stream);
    }
  }
  ThrowIfError(plan_status);
  CheckCuda(alloc, "workspace allocation");
  CheckCuda(release, "workspace release");
  ThrowIfError(run_status);
}

// Checks dtypes and the output's shape, then enqueues the pass.
template <class Geometry>
void Run(const Geometry& g, ConvPass pass, const DeviceArray& a, const DeviceArray& b,
         const DeviceArray& out, const std::vector<int64_t>& out_shape, const char* out_name,
         const std::string& algorithm, int64_t workspace_limit, uintptr_t stream) {
  if (a.dtype != b.dtype || a.dtype != out.dtype) {
    throw py::value_error("all three arrays must have the same dtype");
  }
  if (out.shape != out_shape) {
    throw py::value_error(std::string(out_name) + " does not have the shape the convolution " +
                          "gives it");
  }
  const auto s = reinterpret_cast<cudaStream_t>(stream);
#define LARGECONV_LAUNCH(C, NAME, TF_WORD) \
  if (a.dtype == #NAME) return Launch<C>(g, pass, a, b, out, algorithm, workspace_limit, s);
  LARGECONV_FOR_EACH_FLOAT_DTYPE(LARGECONV_LAUNCH)
#undef LARGECONV_LAUNCH
}

#define LARGECONV_CUDA_ARGS                                                                        \
  const std::vector<int64_t>&strides, const std::string &padding,                                  \
      const std::vector<int64_t>&explicit_paddings, const std::string &data_format,                \
      const std::vector<int64_t>&dilations, const std::string &algorithm, int64_t workspace_limit, \
      uintptr_t stream, const std::string &dtype
#define LARGECONV_CUDA_ARG_NAMES                                                                   \
  strides, padding, explicit_paddings, data_format, dilations, algorithm, workspace_limit, stream, \
      dtype

// One pass on device arrays in the pass's order (RolesOf): operands a and b, result `out`,
// whose own shape gives the shape of the tensor the pass writes; `names` name the three
// arguments in errors.
void RunArrays(ConvPass pass, const py::object& a, const py::object& b, const py::object& out,
               const std::array<const char*, 3>& names, LARGECONV_CUDA_ARGS) {
  const PassRoles roles = RolesOf(pass);
  const DeviceArray arrays[3] = {FromInterface(a, names[0], dtype),
                                 FromInterface(b, names[1], dtype),
                                 FromInterface(out, names[2], dtype)};
  const auto shape_of = [&](ConvTensor t) {
    return arrays[t == roles.a ? 0 : t == roles.b ? 1 : 2].shape;
  };
  const ConvGeometry g = Geometry(
      shape_of(ConvTensor::kInput), shape_of(ConvTensor::kFilter),
      AttrsFrom(strides, padding, explicit_paddings, data_format, dilations), WindowRuleOf(pass));
  if (roles.b == ConvTensor::kOutput) CheckOutBackprop(arrays[1].shape, g);
  Run(g, pass, arrays[0], arrays[1], arrays[2], ToVec(g.shape(roles.out)), names[2], algorithm,
      workspace_limit, stream);
}

void Forward(const py::object& input, const py::object& filter, const py::object& output,
             LARGECONV_CUDA_ARGS) {
  RunArrays(ConvPass::kForward, input, filter, output, {"input", "filter", "output"},
            LARGECONV_CUDA_ARG_NAMES);
}

void BackpropInput(const py::object& filter, const py::object& out_backprop,
                   const py::object& in_backprop, LARGECONV_CUDA_ARGS) {
  RunArrays(ConvPass::kBackpropInput, filter, out_backprop, in_backprop,
            {"filter", "out_backprop", "in_backprop"}, LARGECONV_CUDA_ARG_NAMES);
}

void BackpropFilter(const py::object& input, const py::object& out_backprop,
                    const py::object& filter_backprop, LARGECONV_CUDA_ARGS) {
  RunArrays(ConvPass::kBackpropFilter, input, out_backprop, filter_backprop,
            {"input", "out_backprop", "filter_backprop"}, LARGECONV_CUDA_ARG_NAMES);
}

#define LARGECONV_CUDA3D_ARGS                                                                      \
  const std::vector<int64_t>&strides, const std::string &padding, const std::string &data_format,  \
      const std::vector<int64_t>&dilations, const std::string &algorithm, int64_t workspace_limit, \
      uintptr_t stream, const std::string &dtype

// One Conv3D pass on device arrays, as RunArrays runs a 2-D one.
void RunArrays3d(ConvPass pass, const py::object& a, const py::object& b, const py::object& out,
                 const std::array<const char*, 3>& names, LARGECONV_CUDA3D_ARGS) {
  const PassRoles roles = RolesOf(pass);
  const DeviceArray arrays[3] = {FromInterface(a, names[0], dtype, 5),
                                 FromInterface(b, names[1], dtype, 5),
                                 FromInterface(out, names[2], dtype, 5)};
  const auto shape_of = [&](ConvTensor t) {
    return arrays[t == roles.a ? 0 : t == roles.b ? 1 : 2].shape;
  };
  const Conv3dGeometry g = Geometry3d(shape_of(ConvTensor::kInput), shape_of(ConvTensor::kFilter),
                                      strides, padding, data_format, dilations, WindowRuleOf(pass));
  if (roles.b == ConvTensor::kOutput) {
    ThrowIfError(CheckOutBackprop(g, ShapeOf5(arrays[1].shape, "out_backprop")));
  }
  Run(g, pass, arrays[0], arrays[1], arrays[2], ToVec(g.shape(roles.out)), names[2], algorithm,
      workspace_limit, stream);
}

#define LARGECONV_CUDA3D_ARG_NAMES \
  strides, padding, data_format, dilations, algorithm, workspace_limit, stream, dtype

void Forward3d(const py::object& input, const py::object& filter, const py::object& output,
               LARGECONV_CUDA3D_ARGS) {
  RunArrays3d(ConvPass::kForward, input, filter, output, {"input", "filter", "output"},
              LARGECONV_CUDA3D_ARG_NAMES);
}

void BackpropInput3d(const py::object& filter, const py::object& out_backprop,
                     const py::object& in_backprop, LARGECONV_CUDA3D_ARGS) {
  RunArrays3d(ConvPass::kBackpropInput, filter, out_backprop, in_backprop,
              {"filter", "out_backprop", "in_backprop"}, LARGECONV_CUDA3D_ARG_NAMES);
}

void BackpropFilter3d(const py::object& input, const py::object& out_backprop,
                      const py::object& filter_backprop, LARGECONV_CUDA3D_ARGS) {
  RunArrays3d(ConvPass::kBackpropFilter, input, out_backprop, filter_backprop,
              {"input", "out_backprop", "filter_backprop"}, LARGECONV_CUDA3D_ARG_NAMES);
}

ConvPass PassFrom(const std::string& pass) {
  const ConvPass* p = std::find_if(std::begin(kPasses), std::end(kPasses),
                                   [&](ConvPass q) { return pass == PassName(q); });
  if (p == std::end(kPasses)) {
    std::string names;
    for (ConvPass q : kPasses) names += (names.empty() ? "" : ", ") + std::string(PassName(q));
    throw py::value_error("pass_ must be one of " + names + ", got '" + pass + "'");
  }
  return *p;
}

// Device workspace of a pass as planned on the current device: the kernels' only
// temporary memory (cuFFT's work area included).
int64_t WorkspaceBytes(const std::string& pass, const std::vector<int64_t>& input_shape,
                       const std::vector<int64_t>& filter_shape,
                       const std::vector<int64_t>& strides, const std::string& padding,
                       const std::vector<int64_t>& explicit_paddings,
                       const std::string& data_format, const std::vector<int64_t>& dilations,
                       const std::string& algorithm, int64_t workspace_limit,
                       const std::string& dtype) {
  const ConvPass p = PassFrom(pass);
  const int rb = RealBytes(dtype);
  const ConvGeometry g =
      Geometry(input_shape, filter_shape,
               AttrsFrom(strides, padding, explicit_paddings, data_format, dilations));
  return PlanOrThrow(g, p, algorithm, rb, workspace_limit).workspace_bytes;
}

struct DevicePlanner {
  template <class Geometry>
  Status operator()(const Geometry& g, ConvPass pass, Algorithm a, int real_bytes, int64_t limit,
                    cuda::CudaPlan* plan) const {
    return cuda::PlanCudaPass(g, pass, a, real_bytes, limit, plan);
  }
};

py::dict CufftInfo() {
  py::dict d;
  d["status"] = cuda::CufftStatus();
  d["path"] = cuda::CufftPath();
  d["version"] = cuda::CufftVersion();
  return d;
}

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace
}  // namespace largeconv

PYBIND11_MODULE(_cuda, m) {
  using namespace largeconv;
  m.doc() = "tf_largeconv CUDA kernels on device arrays (__cuda_array_interface__).";
#define LARGECONV_CUDA_PYARGS                                                     \
  py::arg("strides"), py::arg("padding"),                                         \
      py::arg("explicit_paddings") = kNone, py::arg("data_format") = "NHWC",      \
      py::arg("dilations") = kOnes, py::arg("algorithm") = "auto",                \
      py::arg("workspace_limit") = int64_t{-1}, py::arg("stream") = uintptr_t{0}, \
      py::arg("dtype") = ""
  m.def("conv2d", &Forward, py::arg("input"), py::arg("filter"), py::arg("output"),
        LARGECONV_CUDA_PYARGS, "Forward convolution into `output`, enqueued on `stream`.");
  m.def("conv2d_backprop_input", &BackpropInput, py::arg("filter"), py::arg("out_backprop"),
        py::arg("in_backprop"), LARGECONV_CUDA_PYARGS,
        "Gradient with respect to the input, into `in_backprop`.");
  m.def("conv2d_backprop_filter", &BackpropFilter, py::arg("input"), py::arg("out_backprop"),
        py::arg("filter_backprop"), LARGECONV_CUDA_PYARGS,
        "Gradient with respect to the filter, into `filter_backprop`.");
#define LARGECONV_CUDA3D_PYARGS                                                \
  py::arg("strides"), py::arg("padding"),                                      \
      py::arg("data_format") = "NDHWC", py::arg("dilations") = kOnes3d,        \
      py::arg("algorithm") = "auto", py::arg("workspace_limit") = int64_t{-1}, \
      py::arg("stream") = uintptr_t{0}, py::arg("dtype") = ""
  m.def("conv3d", &Forward3d, py::arg("input"), py::arg("filter"), py::arg("output"),
        LARGECONV_CUDA3D_PYARGS, "Forward Conv3D into `output`, enqueued on `stream`.");
  m.def("conv3d_backprop_input", &BackpropInput3d, py::arg("filter"), py::arg("out_backprop"),
        py::arg("in_backprop"), LARGECONV_CUDA3D_PYARGS,
        "Conv3D's gradient with respect to the input, into `in_backprop`.");
  m.def("conv3d_backprop_filter", &BackpropFilter3d, py::arg("input"), py::arg("out_backprop"),
        py::arg("filter_backprop"), LARGECONV_CUDA3D_PYARGS,
        "Conv3D's gradient with respect to the filter, into `filter_backprop`.");
  m.def("plan3d", &CudaPlan3dList<DevicePlanner>, LARGECONV_PLAN3D_PYARGS,
        "The GPU planner's choice for each Conv3D pass on the current device, as dicts.");
  m.def("workspace_bytes", &WorkspaceBytes, py::arg("pass_"), py::arg("input_shape"),
        py::arg("filter_shape"), py::arg("strides"), py::arg("padding"),
        py::arg("explicit_paddings") = kNone, py::arg("data_format") = "NHWC",
        py::arg("dilations") = kOnes, py::arg("algorithm") = "auto",
        py::arg("workspace_limit") = int64_t{-1}, py::arg("dtype") = "float32",
        "Device workspace bytes a pass takes, as planned on the current device.");
  m.def("plan", &CudaPlanList<DevicePlanner>, LARGECONV_PLAN_PYARGS,
        "The GPU planner's choice for each pass on the current device, as a list of dicts.");
  m.def("cufft", &CufftInfo,
        "Whether cuFFT was found: {'status': '' or why not, 'path': ..., 'version': ...}.");
  m.def(
      "cufft_work_bytes",
      [](int64_t fft_h, int64_t fft_w, int64_t batch, bool inverse, const std::string& dtype) {
        Status error;
        const int64_t bytes =
            cuda::CufftWorkBytes({inverse, RealBytes(dtype), fft_h, fft_w, batch}, &error);
        ThrowIfError(error);
        return bytes;
      },
      py::arg("fft_h"), py::arg("fft_w"), py::arg("batch"), py::arg("inverse") = false,
      py::arg("dtype") = "float32",
      "cuFFT's work area in bytes for a batched fft_h x fft_w real transform, as the "
      "planner asks it.");
  m.def("device_count", &DeviceCount, "Number of CUDA devices visible (0 if none).");
  m.attr("DTYPES") = py::tuple(py::cast(DtypeNames(/*gpu=*/true)));
  m.attr("GPU_ROUTE_BATCH") = cuda::kRouteBatch;
}
