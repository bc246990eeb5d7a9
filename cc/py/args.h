// Argument handling shared by the pybind11 modules (_core on the host, _cuda on a device):
// Conv2D attributes and shapes in, ConvGeometry out, errors as Python ValueError.
#ifndef TF_LARGECONV_PY_ARGS_H_
#define TF_LARGECONV_PY_ARGS_H_

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "cc/core/common/dtypes.h"
#include "cc/core/common/geometry.h"
#include "cc/core/common/status.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cuda/algorithms.h"
#include "cc/core/cuda/fft_plan.h"
#include "cc/core/plan/cpu_algorithms.h"
#include "cc/core/plan/plan.h"

namespace py = pybind11;

namespace largeconv {

// Raises the core's error as the matching Python exception (see cc/core/status.h).
inline void ThrowIfError(const Status& s) {
  PyObject* type = nullptr;
  switch (s.kind()) {
    case ErrorKind::kOk:
      return;
    case ErrorKind::kInvalidArgument:
      throw py::value_error(s.message());
    case ErrorKind::kUnimplemented:
      type = PyExc_NotImplementedError;
      break;
    case ErrorKind::kResourceExhausted:
      type = PyExc_MemoryError;
      break;
    case ErrorKind::kInternal:
      throw std::runtime_error(s.message());
  }
  PyErr_SetString(type, s.message().c_str());
  throw py::error_already_set();
}

inline ConvAttrs AttrsFrom(const std::vector<int64_t>& strides, const std::string& padding,
                           const std::vector<int64_t>& explicit_paddings,
                           const std::string& data_format, const std::vector<int64_t>& dilations) {
  ConvAttrs a;
  ThrowIfError(ParsePadding(padding, &a.padding));
  ThrowIfError(ParseDataFormat(data_format, &a.data_format));
  a.strides = strides;
  a.dilations = dilations;
  a.explicit_paddings = explicit_paddings;
  return a;
}

inline std::array<int64_t, 4> Shape4(const std::vector<int64_t>& v, const char* name) {
  if (v.size() != 4) throw py::value_error(std::string(name) + " must have 4 dimensions");
  return {v[0], v[1], v[2], v[3]};
}

// `rule`: kTruncated for the backprop passes, as the TF ops build theirs (geometry.h).
inline ConvGeometry Geometry(const std::vector<int64_t>& input_shape,
                             const std::vector<int64_t>& filter_shape, const ConvAttrs& a,
                             WindowRule rule = WindowRule::kMustFit) {
  ConvGeometry g;
  ThrowIfError(
      MakeGeometry(a, Shape4(input_shape, "input"), Shape4(filter_shape, "filter"), &g, rule));
  return g;
}

template <size_t N>
std::vector<int64_t> ToVec(const std::array<int64_t, N>& s) {
  return std::vector<int64_t>(s.begin(), s.end());
}

inline Shape5 ShapeOf5(const std::vector<int64_t>& v, const char* name) {
  if (v.size() != 5) throw py::value_error(std::string(name) + " must have 5 dimensions");
  return {v[0], v[1], v[2], v[3], v[4]};
}

// The Conv3D attributes and geometry; `rule` as for Geometry.
inline Conv3dGeometry Geometry3d(const std::vector<int64_t>& input_shape,
                                 const std::vector<int64_t>& filter_shape,
                                 const std::vector<int64_t>& strides, const std::string& padding,
                                 const std::string& data_format,
                                 const std::vector<int64_t>& dilations,
                                 WindowRule rule = WindowRule::kMustFit) {
  Conv3dAttrs attrs;
  ThrowIfError(ParsePadding(padding, &attrs.padding));
  ThrowIfError(ParseDataFormat3d(data_format, &attrs.data_format));
  attrs.strides = strides;
  attrs.dilations = dilations;
  Conv3dGeometry g;
  ThrowIfError(MakeGeometry(attrs, ShapeOf5(input_shape, "input"), ShapeOf5(filter_shape, "filter"),
                            &g, rule));
  return g;
}

// The gradient ops' check that out_backprop has the convolution's output shape.
inline void CheckOutBackprop(const std::vector<int64_t>& shape, const ConvGeometry& g) {
  ThrowIfError(largeconv::CheckOutBackprop(g, Shape4(shape, "out_backprop")));
}

// The supported dtypes' names (as numpy and TensorFlow spell them), from the one list in
// dtypes.h: every type for the host, the floating ones (`gpu`) for the CUDA kernels. The
// modules export them as DTYPES, and Python reads them from there.
inline std::vector<std::string> DtypeNames(bool gpu = false) {
  std::vector<std::string> names;
#define LARGECONV_NAME(C, NAME, TF_WORD) names.push_back(#NAME);
  LARGECONV_FOR_EACH_FLOAT_DTYPE(LARGECONV_NAME)
  if (!gpu) LARGECONV_FOR_EACH_INT_DTYPE(LARGECONV_NAME)
#undef LARGECONV_NAME
  return names;
}

// Whether `a` is one of the project's algorithms (the one list, plan/cpu_algorithms.h).
constexpr bool Listed(Algorithm a) {
  for (Algorithm b : kAlgorithms) {
    if (a == b) return true;
  }
  return false;
}
template <class... A>
constexpr bool AllListed(AlgorithmList<A...>) {
  return (Listed(A::kAlgorithm) && ...);
}
static_assert(AllListed(cuda::GpuAlgorithms{}) && Listed(cuda::kCudnn),
              "the GPU's algorithms are the project's");

// The algorithms' names, 'auto' first, from the one list (plan/cpu_algorithms.h): the
// modules export them as ALGORITHMS.
inline std::vector<std::string> AlgorithmNames() {
  std::vector<std::string> names;
  for (Algorithm a : kAlgorithms) names.push_back(a.name());
  return names;
}

// What a planner needs of a dtype named as numpy spells it: the bytes of the type it
// computes in, and whether it is an integer type (direct kernels only). `gpu`: only the
// types the CUDA kernels take are valid.
struct DtypeInfo {
  int real_bytes;
  bool is_int;
};
inline DtypeInfo InfoOf(const std::string& dtype, bool gpu = false) {
#define LARGECONV_INFO(C, NAME, TF_WORD) \
  if (dtype == #NAME) return {kComputeBytes<C>, kIsInt<C>};
  LARGECONV_FOR_EACH_FLOAT_DTYPE(LARGECONV_INFO)
  if (!gpu) LARGECONV_FOR_EACH_INT_DTYPE(LARGECONV_INFO)
#undef LARGECONV_INFO
  std::string names;
  for (const std::string& n : DtypeNames(gpu)) names += (names.empty() ? "" : ", ") + n;
  throw py::value_error("dtype must be one of " + names + ", got '" + dtype + "'");
}

// Bytes of the real type a dtype of the CUDA kernels computes in.
inline int RealBytes(const std::string& dtype) { return InfoOf(dtype, true).real_bytes; }

inline Algorithm AlgorithmFrom(const std::string& algorithm) {
  Algorithm a;
  ThrowIfError(ParseAlgorithm(algorithm, &a));
  return a;
}

// The fields of a plan dict that every planner fills, whatever its geometry.
template <class Plan>
py::dict PlanFields(const Plan& p) {
  py::dict d;
  d["pass"] = PassName(p.pass);
  d["algorithm"] = p.algorithm.name();
  d["workspace_bytes"] = p.workspace_bytes;
  for (Algorithm a : kAlgorithms) {  // cost_direct, cost_fft, ...: < 0 where it cannot run
    if (a != kAutoAlgorithm) d[("cost_" + std::string(a.name())).c_str()] = p.costs[a];
  }
  return d;
}

// The fields of a 2-D plan dict that every planner fills (CPU PassPlan, GPU CudaPlan).
template <class Plan>
py::dict PlanDict(const Plan& p) {
  py::dict d = PlanFields(p);
  if (p.algorithm == FftAlgorithm::kAlgorithm) {
    d["fft"] = py::make_tuple(p.fft.fft_h, p.fft.fft_w);
    d["tile"] = py::make_tuple(p.fft.tiling.tile_h, p.fft.tiling.tile_w);
    d["tiles"] = py::make_tuple(p.fft.tiling.tiles_h, p.fft.tiling.tiles_w);
  }
  return d;
}

// The GPU planner's choice for each pass of geometry g as dicts. Planner{}(g, pass,
// algorithm, real_bytes, limit, &plan) returns OK or an error: the device's planner (_cuda)
// or the host emulation's (_core). A 3-D plan's FFT fields have three entries (depth,
// height, width).
template <class Planner, class Geometry>
py::list CudaPlansOf(const Geometry& g, const std::string& algorithm, int64_t workspace_limit,
                     const std::string& dtype) {
  const Algorithm a = AlgorithmFrom(algorithm);
  const int rb = RealBytes(dtype);
  constexpr bool k3d = std::is_same_v<Geometry, Conv3dGeometry>;
  py::list out;
  for (ConvPass pass : kPasses) {
    cuda::CudaPlan p;
    ThrowIfError(Planner{}(g, pass, a, rb, workspace_limit, &p));
    py::dict d = k3d ? PlanFields(p) : PlanDict(p);
    d["tf_faster"] = cuda::TfFaster(p);
    if (p.algorithm == cuda::kGpuFft) {
      const cuda::FftModelTerms& m = p.fft_terms;
      d["fft_terms"] = py::make_tuple(m.transform_bytes, m.product_bytes, m.launches);
      if (k3d) {
        const FftTiling& t = p.fft.tiling;
        d["fft"] = py::make_tuple(p.fft.fft_d, p.fft.fft_h, p.fft.fft_w);
        d["tile"] = py::make_tuple(p.fft.tile_d, t.tile_h, t.tile_w);
        d["tiles"] = py::make_tuple(p.fft.tiles_d, t.tiles_h, t.tiles_w);
      }
      d["items"] = p.fft.items;
      d["chunk"] = p.fft.chunk;
      d["fft_work_bytes"] = p.fft_work_bytes;
    }
    out.append(d);
  }
  return out;
}

template <class Planner>
py::list CudaPlanList(const std::vector<int64_t>& input_shape,
                      const std::vector<int64_t>& filter_shape, const std::vector<int64_t>& strides,
                      const std::string& padding, const std::vector<int64_t>& explicit_paddings,
                      const std::string& data_format, const std::vector<int64_t>& dilations,
                      const std::string& algorithm, int64_t workspace_limit,
                      const std::string& dtype) {
  const ConvGeometry g =
      Geometry(input_shape, filter_shape,
               AttrsFrom(strides, padding, explicit_paddings, data_format, dilations));
  return CudaPlansOf<Planner>(g, algorithm, workspace_limit, dtype);
}

template <class Planner>
py::list CudaPlan3dList(const std::vector<int64_t>& input_shape,
                        const std::vector<int64_t>& filter_shape,
                        const std::vector<int64_t>& strides, const std::string& padding,
                        const std::string& data_format, const std::vector<int64_t>& dilations,
                        const std::string& algorithm, int64_t workspace_limit,
                        const std::string& dtype) {
  const Conv3dGeometry g =
      Geometry3d(input_shape, filter_shape, strides, padding, data_format, dilations);
  return CudaPlansOf<Planner>(g, algorithm, workspace_limit, dtype);
}

#define LARGECONV_PLAN_PYARGS \
  py::arg("input_shape"), py::arg("filter_shape"), LARGECONV_ARGS, py::arg("dtype") = "float32"
#define LARGECONV_PLAN3D_PYARGS                                                            \
  py::arg("input_shape"), py::arg("filter_shape"), py::arg("strides"), py::arg("padding"), \
      py::arg("data_format") = "NDHWC", py::arg("dilations") = kOnes3d,                    \
      py::arg("algorithm") = "auto", py::arg("workspace_limit") = int64_t{-1},             \
      py::arg("dtype") = "float32"

inline const std::vector<int64_t> kOnes{1, 1, 1, 1};
inline const std::vector<int64_t> kOnes3d{1, 1, 1, 1, 1};
inline const std::vector<int64_t> kNone{};

#define LARGECONV_ARGS                                                       \
  py::arg("strides"), py::arg("padding"),                                    \
      py::arg("explicit_paddings") = kNone, py::arg("data_format") = "NHWC", \
      py::arg("dilations") = kOnes, py::arg("algorithm") = "auto",           \
      py::arg("workspace_limit") = int64_t{-1}
#define LARGECONV_ARGS3D                                                \
  py::arg("strides"), py::arg("padding"),                               \
      py::arg("data_format") = "NDHWC", py::arg("dilations") = kOnes3d, \
      py::arg("algorithm") = "auto", py::arg("workspace_limit") = int64_t{-1}

}  // namespace largeconv

#endif  // TF_LARGECONV_PY_ARGS_H_
