// pybind11 bindings over the framework-free core: geometry and the CPU direct kernels on
// numpy arrays. No TensorFlow here, so kernels can be tested (and, later, driven on a GPU
// machine) without it.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cc/core/direct.h"
#include "cc/core/geometry.h"

namespace py = pybind11;

namespace largeconv {
namespace {

ConvAttrs AttrsFrom(const std::vector<int64_t>& strides, const std::string& padding,
                    const std::vector<int64_t>& explicit_paddings,
                    const std::string& data_format, const std::vector<int64_t>& dilations) {
  ConvAttrs a;
  std::string err = ParsePadding(padding, &a.padding);
  if (err.empty()) err = ParseDataFormat(data_format, &a.data_format);
  if (!err.empty()) throw py::value_error(err);
  a.strides = strides;
  a.dilations = dilations;
  a.explicit_paddings = explicit_paddings;
  return a;
}

std::array<int64_t, 4> Shape4(const std::vector<int64_t>& v, const char* name) {
  if (v.size() != 4) throw py::value_error(std::string(name) + " must have 4 dimensions");
  return {v[0], v[1], v[2], v[3]};
}

ConvGeometry Geometry(const std::vector<int64_t>& input_shape,
                      const std::vector<int64_t>& filter_shape, const ConvAttrs& a) {
  ConvGeometry g;
  std::string err = MakeGeometry(a, Shape4(input_shape, "input"), Shape4(filter_shape, "filter"), &g);
  if (!err.empty()) throw py::value_error(err);
  return g;
}

// Splits [0, total) into near-equal contiguous chunks, one std::thread each.
ParallelFor ThreadFor(int num_threads) {
  int n = num_threads > 0 ? num_threads : static_cast<int>(std::thread::hardware_concurrency());
  n = std::max(1, n);
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

template <typename T>
using Array = py::array_t<T, py::array::c_style | py::array::forcecast>;

template <typename T>
std::vector<int64_t> ShapeOf(const Array<T>& a, const char* name) {
  if (a.ndim() != 4) throw py::value_error(std::string(name) + " must be a 4-D array");
  return {a.shape(0), a.shape(1), a.shape(2), a.shape(3)};
}

std::vector<int64_t> ToVec(const std::array<int64_t, 4>& s) { return {s[0], s[1], s[2], s[3]}; }

template <typename T>
Array<T> Forward(const Array<T>& x, const Array<T>& w, const std::vector<int64_t>& strides,
                 const std::string& padding, const std::vector<int64_t>& explicit_paddings,
                 const std::string& data_format, const std::vector<int64_t>& dilations,
                 int num_threads) {
  const ConvAttrs a = AttrsFrom(strides, padding, explicit_paddings, data_format, dilations);
  const ConvGeometry g = Geometry(ShapeOf(x, "input"), ShapeOf(w, "filter"), a);
  Array<T> y(ToVec(g.output_shape()));
  const T* xp = x.data();
  const T* wp = w.data();
  T* yp = y.mutable_data();
  py::gil_scoped_release release;
  DirectForward(g, xp, wp, yp, ThreadFor(num_threads));
  return y;
}

template <typename T>
Array<T> BackpropInput(const std::vector<int64_t>& input_shape, const Array<T>& w,
                       const Array<T>& dy, const std::vector<int64_t>& strides,
                       const std::string& padding,
                       const std::vector<int64_t>& explicit_paddings,
                       const std::string& data_format, const std::vector<int64_t>& dilations,
                       int num_threads) {
  const ConvAttrs a = AttrsFrom(strides, padding, explicit_paddings, data_format, dilations);
  const ConvGeometry g = Geometry(input_shape, ShapeOf(w, "filter"), a);
  if (ShapeOf(dy, "out_backprop") != ToVec(g.output_shape())) {
    throw py::value_error("out_backprop does not have the convolution's output shape");
  }
  Array<T> dx(input_shape);
  const T* wp = w.data();
  const T* dyp = dy.data();
  T* dxp = dx.mutable_data();
  py::gil_scoped_release release;
  DirectBackpropInput(g, wp, dyp, dxp, ThreadFor(num_threads));
  return dx;
}

template <typename T>
Array<T> BackpropFilter(const Array<T>& x, const std::vector<int64_t>& filter_shape,
                        const Array<T>& dy, const std::vector<int64_t>& strides,
                        const std::string& padding,
                        const std::vector<int64_t>& explicit_paddings,
                        const std::string& data_format, const std::vector<int64_t>& dilations,
                        int num_threads) {
  const ConvAttrs a = AttrsFrom(strides, padding, explicit_paddings, data_format, dilations);
  const ConvGeometry g = Geometry(ShapeOf(x, "input"), filter_shape, a);
  if (ShapeOf(dy, "out_backprop") != ToVec(g.output_shape())) {
    throw py::value_error("out_backprop does not have the convolution's output shape");
  }
  Array<T> dw(filter_shape);
  const T* xp = x.data();
  const T* dyp = dy.data();
  T* dwp = dw.mutable_data();
  py::gil_scoped_release release;
  DirectBackpropFilter(g, xp, dyp, dwp, ThreadFor(num_threads));
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

const std::vector<int64_t> kOnes{1, 1, 1, 1};
const std::vector<int64_t> kNone{};

#define LARGECONV_ARGS                                                                   \
  py::arg("strides"), py::arg("padding"), py::arg("explicit_paddings") = kNone,         \
      py::arg("data_format") = "NHWC", py::arg("dilations") = kOnes

template <typename T>
void DefKernels(py::module_& m) {
  m.def("conv2d", &Forward<T>, py::arg("input"), py::arg("filter"), LARGECONV_ARGS,
        py::arg("num_threads") = 0, "Direct forward convolution (TF Conv2D semantics).");
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
        LARGECONV_ARGS, "The ConvGeometry for these shapes and attributes, as a dict.");
  // float64 first: overload resolution tries in order, and forcecast would otherwise turn
  // double arrays into float32.
  DefKernels<double>(m);
  DefKernels<float>(m);
}
