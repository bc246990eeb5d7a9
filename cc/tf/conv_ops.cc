// Op registrations for the LargeConv family: the attribute set of core Conv2D, and shape
// functions that derive every static size from the core ConvGeometry.
#include <array>
#include <string>
#include <vector>

#include "cc/core/common/dtypes.h"
#include "cc/core/common/geometry.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/plan/cpu_algorithms.h"
#include "cc/tf/attrs.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace largeconv {
namespace {

using tensorflow::shape_inference::DimensionHandle;
using tensorflow::shape_inference::InferenceContext;
using tensorflow::shape_inference::ShapeHandle;

absl::Status RequireRank4(InferenceContext* c, ShapeHandle s, const char* name, ShapeHandle* out) {
  if (c->RankKnown(s) && c->Rank(s) != 4) return NotRank4(name, c->DebugString(s), c->Rank(s));
  return c->WithRank(s, 4, out);
}

// input_sizes or filter_sizes (input `index` of the backprop op `op`): a vector of 4 sizes
// (or 2, `spatial_ok`) as far as known while tracing, in the kernels' words. A negative size
// is shape inference's to report (MakeShapeFromShapeTensor), in its own words, as in TF.
absl::Status SizesVector(InferenceContext* c, int index, const char* name, const char* op,
                         bool spatial_ok, int64_t* count) {
  const ShapeHandle s = c->input(index);
  if (c->RankKnown(s) && c->Rank(s) != 1) {
    return SizesNotVector(name, op, c->DebugString(s), c->Rank(s));
  }
  ShapeHandle vec;
  TF_RETURN_IF_ERROR(c->WithRank(s, 1, &vec));
  *count = c->ValueKnown(c->Dim(vec, 0)) ? c->Value(c->Dim(vec, 0)) : int64_t{-1};
  if (*count >= 0 && *count != 4 && !(spatial_ok && *count == 2)) {
    return WrongSizesCount(name, op, spatial_ok, *count);
  }
  return absl::OkStatus();
}

// Size `i` of a shape, -1 where unknown.
int64_t SizeOr(InferenceContext* c, ShapeHandle s, int i) {
  return c->ValueKnown(c->Dim(s, i)) ? c->Value(c->Dim(s, i)) : int64_t{-1};
}

// Output shape of the convolution from (possibly partially known) input and filter shapes.
// Known spatial sizes go through the same WindowOutputSize the kernels use, under the
// op's rule (geometry.h).
absl::Status ForwardShape(InferenceContext* c, ShapeHandle input, ShapeHandle filter,
                          WindowRule rule, ShapeHandle* out) {
  ConvAttrs a;
  TF_RETURN_IF_ERROR(ReadConvAttrs(c, &a));
  const bool nhwc = a.data_format == DataFormat::kNHWC;
  const int hi = nhwc ? 1 : 2, wi = nhwc ? 2 : 3, ci = nhwc ? 3 : 1;
  auto value = [&](ShapeHandle s, int i) { return SizeOr(c, s, i); };
  const int64_t in_c = value(input, ci), f_in = value(filter, 2), f_out = value(filter, 3);
  if (in_c >= 0 && f_in >= 0) {
    int64_t groups;
    TF_RETURN_IF_ERROR(ToStatus(ChannelGroups(in_c, f_in, f_out, &groups)));
  }
  const int64_t strides[2] = {a.strides[hi], a.strides[wi]};
  const int64_t dil[2] = {a.dilations[hi], a.dilations[wi]};
  const int dims[2] = {hi, wi};
  const char* names[2] = {"height", "width"};
  DimensionHandle spatial[2];
  for (int k = 0; k < 2; ++k) {
    const int64_t in = value(input, dims[k]), f = value(filter, k);
    if (in < 0 || f < 0) {
      spatial[k] = c->UnknownDim();
      continue;
    }
    int64_t before = 0, after = 0, size = 0;
    if (a.padding == Padding::kExplicit) {
      before = a.explicit_paddings[2 * dims[k]];
      after = a.explicit_paddings[2 * dims[k] + 1];
    }
    TF_RETURN_IF_ERROR(ToStatus(WindowOutputSize(in, f, strides[k], dil[k], a.padding, names[k],
                                                 &before, &after, &size, rule)));
    spatial[k] = c->MakeDim(size);
  }
  DimensionHandle batch = c->Dim(input, 0), depth = c->Dim(filter, 3);
  *out = nhwc ? c->MakeShape({batch, spatial[0], spatial[1], depth})
              : c->MakeShape({batch, depth, spatial[0], spatial[1]});
  return absl::OkStatus();
}

absl::Status Conv2DShapeFn(InferenceContext* c) {
  ShapeHandle input, filter, out;
  TF_RETURN_IF_ERROR(RequireRank4(c, c->input(0), "input", &input));
  TF_RETURN_IF_ERROR(RequireRank4(c, c->input(1), "filter", &filter));
  TF_RETURN_IF_ERROR(ForwardShape(c, input, filter, WindowRule::kMustFit, &out));
  c->set_output(0, out);
  return absl::OkStatus();
}

// The shape Conv2DBackpropInput's input_sizes describe: itself when it has 4 sizes, and
// when it has 2 (height and width), the batch of out_backprop and the depth of the filter's
// dimension 2 around them, as the kernel takes them.
absl::Status InputSizesShape(InferenceContext* c, ShapeHandle dy, ShapeHandle* out) {
  int64_t count;
  TF_RETURN_IF_ERROR(
      SizesVector(c, 0, "input_sizes", "Conv2DBackpropInput", /*spatial_ok=*/true, &count));
  if (count != 2) {
    TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(0, out));
    return c->WithRank(*out, 4, out);
  }
  ShapeHandle spatial, filter;
  TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(0, &spatial));
  TF_RETURN_IF_ERROR(c->WithRank(spatial, 2, &spatial));
  TF_RETURN_IF_ERROR(RequireRank4(c, c->input(1), "filter", &filter));
  ConvAttrs a;
  TF_RETURN_IF_ERROR(ReadConvAttrs(c, &a));
  const DimensionHandle n = c->Dim(dy, 0), h = c->Dim(spatial, 0), w = c->Dim(spatial, 1),
                        depth = c->Dim(filter, 2);
  *out = a.data_format == DataFormat::kNHWC ? c->MakeShape({n, h, w, depth})
                                            : c->MakeShape({n, depth, h, w});
  return absl::OkStatus();
}

// Backprop ops: the result's shape is the sizes tensor's; out_backprop must match the
// shape the forward pass would produce (under the backprop ops' window rule).
absl::Status BackpropShapeFn(InferenceContext* c, ConvTensor result_of) {
  const bool input_sizes = result_of == ConvTensor::kInput;
  ShapeHandle dy, result;
  TF_RETURN_IF_ERROR(RequireRank4(c, c->input(2), "out_backprop", &dy));
  if (input_sizes) {
    TF_RETURN_IF_ERROR(InputSizesShape(c, dy, &result));
  } else {
    int64_t count;
    TF_RETURN_IF_ERROR(
        SizesVector(c, 1, "filter_sizes", "Conv2DBackpropFilter", /*spatial_ok=*/false, &count));
    TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(1, &result));
    TF_RETURN_IF_ERROR(c->WithRank(result, 4, &result));
  }
  ShapeHandle input = input_sizes ? result : c->input(0);
  ShapeHandle filter = input_sizes ? c->input(1) : result;
  TF_RETURN_IF_ERROR(RequireRank4(c, input, "input", &input));
  TF_RETURN_IF_ERROR(RequireRank4(c, filter, "filter", &filter));
  ShapeHandle expected, merged;
  TF_RETURN_IF_ERROR(ForwardShape(c, input, filter, WindowRule::kTruncated, &expected));
  if (!c->Merge(dy, expected, &merged).ok()) {
    // The kernels' message, from what is known (unknown sizes are -1 and match anything).
    ConvAttrs a;
    TF_RETURN_IF_ERROR(ReadConvAttrs(c, &a));
    const bool nhwc = a.data_format == DataFormat::kNHWC;
    const int hi = nhwc ? 1 : 2, wi = nhwc ? 2 : 3;
    ConvGeometry g;
    g.data_format = a.data_format;
    g.batch = SizeOr(c, input, 0);
    g.in_h = SizeOr(c, input, hi);
    g.in_w = SizeOr(c, input, wi);
    g.filter_h = SizeOr(c, filter, 0);
    g.filter_w = SizeOr(c, filter, 1);
    g.out_c = SizeOr(c, filter, 3);
    g.stride_h = a.strides[hi];
    g.stride_w = a.strides[wi];
    g.dilation_h = a.dilations[hi];
    g.dilation_w = a.dilations[wi];
    g.out_h = SizeOr(c, expected, hi);
    g.out_w = SizeOr(c, expected, wi);
    std::array<int64_t, 4> dy_shape;
    for (int i = 0; i < 4; ++i) dy_shape[i] = SizeOr(c, dy, i);
    TF_RETURN_IF_ERROR(ToStatus(CheckOutBackprop(g, dy_shape)));
    return tensorflow::errors::InvalidArgument("out_backprop has shape ", c->DebugString(dy),
                                               " but the convolution produces ",
                                               c->DebugString(expected));
  }
  c->set_output(0, result);
  return absl::OkStatus();
}

// --- Three spatial dimensions ------------------------------------------------------------

absl::Status RequireRank5(InferenceContext* c, ShapeHandle s, const char* name, ShapeHandle* out) {
  if (c->RankKnown(s) && c->Rank(s) != 5) return NotRank(name, c->DebugString(s), c->Rank(s), 5);
  return c->WithRank(s, 5, out);
}

// The 3-D convolution's output shape from partly known input and filter shapes: each known
// spatial size through WindowOutputSize under `rule`, as Conv3dGeometry sizes it.
absl::Status Conv3dOutputShape(InferenceContext* c, ShapeHandle input, ShapeHandle filter,
                               WindowRule rule, ShapeHandle* out) {
  Conv3dAttrs a;
  TF_RETURN_IF_ERROR(ReadConv3dAttrs(c, &a));
  const bool channels_last = a.data_format == DataFormat::kNHWC;
  const int64_t in_c = SizeOr(c, input, channels_last ? 4 : 1);
  if (in_c >= 0 && SizeOr(c, filter, 3) >= 0) {
    int64_t groups;
    TF_RETURN_IF_ERROR(
        ToStatus(ChannelGroups(in_c, SizeOr(c, filter, 3), SizeOr(c, filter, 4), &groups)));
  }
  constexpr const char* kNames[kSpatial3d] = {"depth", "height", "width"};
  std::vector<DimensionHandle> dims = {c->Dim(input, 0)};
  if (!channels_last) dims.push_back(c->Dim(filter, 4));
  for (int k = 0; k < kSpatial3d; ++k) {
    const int at = (channels_last ? 1 : 2) + k;
    const int64_t in = SizeOr(c, input, at), f = SizeOr(c, filter, k);
    int64_t before = 0, after = 0, size = -1;
    if (in >= 0 && f >= 0) {
      TF_RETURN_IF_ERROR(ToStatus(WindowOutputSize(in, f, a.strides[at], a.dilations[at], a.padding,
                                                   kNames[k], &before, &after, &size, rule)));
    }
    dims.push_back(size >= 0 ? c->MakeDim(size) : c->UnknownDim());
  }
  if (channels_last) dims.push_back(c->Dim(filter, 4));
  *out = c->MakeShape(dims);
  return absl::OkStatus();
}

absl::Status Conv3dShapeFn(InferenceContext* c) {
  ShapeHandle input, filter, out;
  TF_RETURN_IF_ERROR(RequireRank5(c, c->input(0), "input", &input));
  TF_RETURN_IF_ERROR(RequireRank5(c, c->input(1), "filter", &filter));
  TF_RETURN_IF_ERROR(Conv3dOutputShape(c, input, filter, WindowRule::kMustFit, &out));
  c->set_output(0, out);
  return absl::OkStatus();
}

// The 3-D backprop ops: the result has the sizes tensor's shape (input_sizes or
// filter_sizes, 5 sizes); out_backprop must have the shape the convolution produces.
absl::Status Conv3dBackpropShapeFn(InferenceContext* c, ConvTensor result_of) {
  const bool input_sizes = result_of == ConvTensor::kInput;
  ShapeHandle dy, result, input, filter, expected, merged;
  TF_RETURN_IF_ERROR(RequireRank5(c, c->input(2), "out_backprop", &dy));
  TF_RETURN_IF_ERROR(c->MakeShapeFromShapeTensor(input_sizes ? 0 : 1, &result));
  TF_RETURN_IF_ERROR(
      RequireRank5(c, result, input_sizes ? "input_sizes" : "filter_sizes", &result));
  TF_RETURN_IF_ERROR(RequireRank5(c, input_sizes ? result : c->input(0), "input", &input));
  TF_RETURN_IF_ERROR(RequireRank5(c, input_sizes ? c->input(1) : result, "filter", &filter));
  TF_RETURN_IF_ERROR(Conv3dOutputShape(c, input, filter, WindowRule::kTruncated, &expected));
  if (!c->Merge(dy, expected, &merged).ok()) {
    return tensorflow::errors::InvalidArgument("out_backprop has shape ", c->DebugString(dy),
                                               " but the convolution produces ",
                                               c->DebugString(expected));
  }
  c->set_output(0, result);
  return absl::OkStatus();
}

}  // namespace

// The element-type attribute, from the one dtype list.
std::string DtypeAttr() {
  std::string words;
#define LARGECONV_TF_WORD(C, NAME, TF_WORD) \
  words += (words.empty() ? "" : ", ") + std::string(#TF_WORD);
  LARGECONV_FOR_EACH_DTYPE(LARGECONV_TF_WORD)
#undef LARGECONV_TF_WORD
  return "T: {" + words + "}";
}

// The algorithm attribute, from the one list (plan/cpu_algorithms.h): every algorithm but TF's own
// kernels, which only the Python layer can run.
std::string AlgorithmAttr() {
  std::string words;
  for (Algorithm a : kAlgorithms) {
    if (a == TfAlgorithm::kAlgorithm) continue;
    words += (words.empty() ? "'" : ", '") + std::string(a.name()) + "'";
  }
  return "algorithm: {" + words + "} = 'auto'";
}

}  // namespace largeconv

#define LARGECONV_COMMON_ATTRS                        \
  Attr(largeconv::DtypeAttr())                        \
      .Attr("strides: list(int)")                     \
      .Attr("padding: {'SAME', 'VALID', 'EXPLICIT'}") \
      .Attr("explicit_paddings: list(int) = []")      \
      .Attr("data_format: {'NHWC', 'NCHW'} = 'NHWC'") \
      .Attr("dilations: list(int) = [1, 1, 1, 1]")    \
      .Attr(largeconv::AlgorithmAttr())               \
      .Attr("workspace_limit: int = -1")              \
      .Attr("keep_memory: bool = true")

REGISTER_OP("LargeConv>Conv2D")
    .Input("input: T")
    .Input("filter: T")
    .Output("output: T")
    .LARGECONV_COMMON_ATTRS.SetShapeFn(largeconv::Conv2DShapeFn)
    .Doc(R"doc(
2-D convolution with the semantics of Conv2D (grouped when the filter's in-depth divides
the input depth), computed by memory-lean kernels suited to large filters.
)doc");

REGISTER_OP("LargeConv>Conv2DBackpropInput")
    .Input("input_sizes: int32")
    .Input("filter: T")
    .Input("out_backprop: T")
    .Output("output: T")
    .LARGECONV_COMMON_ATTRS
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      return largeconv::BackpropShapeFn(c, largeconv::ConvTensor::kInput);
    })
    .Doc("Gradient of LargeConv>Conv2D with respect to its input.");

REGISTER_OP("LargeConv>Conv2DBackpropFilter")
    .Input("input: T")
    .Input("filter_sizes: int32")
    .Input("out_backprop: T")
    .Output("output: T")
    .LARGECONV_COMMON_ATTRS
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      return largeconv::BackpropShapeFn(c, largeconv::ConvTensor::kFilter);
    })
    .Doc("Gradient of LargeConv>Conv2D with respect to its filter.");

REGISTER_OP("LargeConv>Conv2DRoute")
    .Input("output: T")
    .Input("input: T")
    .Input("filter: T")
    .Output("routed: T")
    .Attr(largeconv::DtypeAttr())
    .Attr("route: string")
    .SetShapeFn(tensorflow::shape_inference::UnchangedShape)
    .Doc(R"doc(
`output`, the convolution of `input` and `filter` (or their transposed convolution),
passed on unchanged. What the op adds is its gradient: each pass of that gradient runs on
the kernel its route names, and none reaches `output`. `route` holds, as JSON written by
the Python layer (tf_largeconv.ops.route_spec), the convolution's attributes, the routes
of its forward, backprop_input and backprop_filter passes (true for TensorFlow's kernel,
false for LargeConv's) and whether it is transposed: one attribute, as reading each
attribute of an eager op in its gradient costs about 10 us. An eager call of a route that
mixes TensorFlow's kernels with the op's runs one such op in place of a
tf.custom_gradient, which costs several times as much.
)doc");

// TensorFlow's Conv3D attributes (no explicit padding), and the algorithm choice.
#define LARGECONV_CONV3D_ATTRS                           \
  Attr(largeconv::DtypeAttr())                           \
      .Attr("strides: list(int) >= 5")                   \
      .Attr("padding: {'SAME', 'VALID'}")                \
      .Attr("data_format: {'NDHWC', 'NCDHW'} = 'NDHWC'") \
      .Attr("dilations: list(int) = [1, 1, 1, 1, 1]")    \
      .Attr(largeconv::AlgorithmAttr())                  \
      .Attr("workspace_limit: int = -1")                 \
      .Attr("keep_memory: bool = true")

REGISTER_OP("LargeConv>Conv3D")
    .Input("input: T")
    .Input("filter: T")
    .Output("output: T")
    .LARGECONV_CONV3D_ATTRS.SetShapeFn(largeconv::Conv3dShapeFn)
    .Doc(R"doc(
3-D convolution with the semantics of Conv3D (grouped when the filter's in-depth divides
the input depth), computed by memory-lean kernels suited to large filters.
)doc");

REGISTER_OP("LargeConv>Conv3DBackpropInput")
    .Input("input_sizes: int32")
    .Input("filter: T")
    .Input("out_backprop: T")
    .Output("output: T")
    .LARGECONV_CONV3D_ATTRS
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      return largeconv::Conv3dBackpropShapeFn(c, largeconv::ConvTensor::kInput);
    })
    .Doc("Gradient of LargeConv>Conv3D with respect to its input.");

REGISTER_OP("LargeConv>Conv3DBackpropFilter")
    .Input("input: T")
    .Input("filter_sizes: int32")
    .Input("out_backprop: T")
    .Output("output: T")
    .LARGECONV_CONV3D_ATTRS
    .SetShapeFn([](tensorflow::shape_inference::InferenceContext* c) {
      return largeconv::Conv3dBackpropShapeFn(c, largeconv::ConvTensor::kFilter);
    })
    .Doc("Gradient of LargeConv>Conv3D with respect to its filter.");
