// Argument handling shared by the pybind11 modules (_core on the host, _cuda on a device):
// Conv2D attributes and shapes in, ConvGeometry out, errors as Python ValueError.
#ifndef TF_LARGECONV_PY_ARGS_H_
#define TF_LARGECONV_PY_ARGS_H_

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/cuda/fft_plan.h"
#include "cc/core/geometry.h"
#include "cc/core/plan.h"

namespace py = pybind11;

namespace largeconv {

inline ConvAttrs AttrsFrom(const std::vector<int64_t>& strides, const std::string& padding,
                           const std::vector<int64_t>& explicit_paddings,
                           const std::string& data_format,
                           const std::vector<int64_t>& dilations) {
  ConvAttrs a;
  std::string err = ParsePadding(padding, &a.padding);
  if (err.empty()) err = ParseDataFormat(data_format, &a.data_format);
  if (!err.empty()) throw py::value_error(err);
  a.strides = strides;
  a.dilations = dilations;
  a.explicit_paddings = explicit_paddings;
  return a;
}

inline std::array<int64_t, 4> Shape4(const std::vector<int64_t>& v, const char* name) {
  if (v.size() != 4) throw py::value_error(std::string(name) + " must have 4 dimensions");
  return {v[0], v[1], v[2], v[3]};
}

inline ConvGeometry Geometry(const std::vector<int64_t>& input_shape,
                             const std::vector<int64_t>& filter_shape, const ConvAttrs& a) {
  ConvGeometry g;
  std::string err =
      MakeGeometry(a, Shape4(input_shape, "input"), Shape4(filter_shape, "filter"), &g);
  if (!err.empty()) throw py::value_error(err);
  return g;
}

inline std::vector<int64_t> ToVec(const std::array<int64_t, 4>& s) {
  return {s[0], s[1], s[2], s[3]};
}

// The gradient ops' check that out_backprop has the convolution's output shape.
inline void CheckOutBackprop(const std::vector<int64_t>& shape, const ConvGeometry& g) {
  if (shape != ToVec(g.output_shape())) {
    throw py::value_error("out_backprop does not have the convolution's output shape");
  }
}

// Bytes of the real type a dtype computes in: 8 for float64, 4 for the others.
inline int RealBytes(const std::string& dtype) {
  if (dtype != "float16" && dtype != "bfloat16" && dtype != "float32" && dtype != "float64") {
    throw py::value_error("dtype must be float16, bfloat16, float32 or float64, got '" +
                          dtype + "'");
  }
  return dtype == "float64" ? 8 : 4;
}

inline Algorithm AlgorithmFrom(const std::string& algorithm) {
  Algorithm a = Algorithm::kAuto;
  const std::string err = ParseAlgorithm(algorithm, &a);
  if (!err.empty()) throw py::value_error(err);
  return a;
}

// The GPU planner's choice for each pass as dicts. Planner{}(g, pass, algorithm, real_bytes,
// limit, &plan) returns "" or an error: the device's planner (_cuda) or the host
// emulation's (_core).
template <class Planner>
py::list CudaPlanList(const std::vector<int64_t>& input_shape,
                      const std::vector<int64_t>& filter_shape,
                      const std::vector<int64_t>& strides, const std::string& padding,
                      const std::vector<int64_t>& explicit_paddings,
                      const std::string& data_format, const std::vector<int64_t>& dilations,
                      const std::string& algorithm, int64_t workspace_limit,
                      const std::string& dtype) {
  const ConvGeometry g = Geometry(
      input_shape, filter_shape,
      AttrsFrom(strides, padding, explicit_paddings, data_format, dilations));
  const Algorithm a = AlgorithmFrom(algorithm);
  const int rb = RealBytes(dtype);
  py::list out;
  for (ConvPass pass : {ConvPass::kForward, ConvPass::kBackpropInput, ConvPass::kBackpropFilter}) {
    cuda::CudaPlan p;
    const std::string err = Planner{}(g, pass, a, rb, workspace_limit, &p);
    if (!err.empty()) throw py::value_error(err);
    py::dict d;
    d["pass"] = PassName(pass);
    d["algorithm"] = AlgorithmName(p.algorithm);
    d["workspace_bytes"] = p.workspace_bytes;
    d["cost_direct"] = p.cost_direct;
    d["cost_fft"] = p.cost_fft;
    if (p.algorithm == Algorithm::kFft) {
      d["fft"] = py::make_tuple(p.fft.fft_h, p.fft.fft_w);
      d["tile"] = py::make_tuple(p.fft.tiling.tile_h, p.fft.tiling.tile_w);
      d["tiles"] = py::make_tuple(p.fft.tiling.tiles_h, p.fft.tiling.tiles_w);
      d["items"] = p.fft.items;
      d["chunk"] = p.fft.chunk;
      d["fft_work_bytes"] = p.fft_work_bytes;
    }
    out.append(d);
  }
  return out;
}

#define LARGECONV_PLAN_PYARGS                                                             \
  py::arg("input_shape"), py::arg("filter_shape"), LARGECONV_ARGS, py::arg("dtype") = "float32"

inline const std::vector<int64_t> kOnes{1, 1, 1, 1};
inline const std::vector<int64_t> kNone{};

#define LARGECONV_ARGS                                                                   \
  py::arg("strides"), py::arg("padding"), py::arg("explicit_paddings") = kNone,         \
      py::arg("data_format") = "NHWC", py::arg("dilations") = kOnes,                    \
      py::arg("algorithm") = "auto", py::arg("workspace_limit") = int64_t{-1}

}  // namespace largeconv

#endif  // TF_LARGECONV_PY_ARGS_H_
