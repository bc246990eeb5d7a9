// Output-size, padding and layout arithmetic for the Conv2D family, in int64 throughout.
#include "cc/core/common/geometry.h"

#include <limits>

namespace largeconv {
namespace {

// Formats with std::to_string, not iostreams: inside a torch process on the GPU machines,
// inserting an integer into a std::ostringstream from the _cuda module crashed (SIGSEGV in
// the stream's locale facets), the first thing any explicit padding or bad-attribute message
// ran into.
std::string ListToString(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// A shape as TensorFlow prints it, "?" for an unknown (negative) size.
template <size_t N>
std::string ShapeToString(const std::array<int64_t, N>& v) {
  std::string s = "[";
  for (size_t i = 0; i < N; ++i) {
    s += (i ? "," : "") + (v[i] < 0 ? std::string("?") : std::to_string(v[i]));
  }
  return s + "]";
}

// An invalid argument in our words (naming the argument), followed by TensorFlow's own
// message for the same error, so that code matching on either finds it.
Status Invalid(const std::string& ours, const std::string& tf) {
  return InvalidArgument(ours + ". " + tf);
}

// Indices of the H, W and C dimensions within a 4-D shape/attr in data_format order.
void SpatialIndices(DataFormat f, int* h, int* w, int* c) {
  if (f == DataFormat::kNHWC) {
    *h = 1;
    *w = 2;
    *c = 3;
  } else {
    *c = 1;
    *h = 2;
    *w = 3;
  }
}

// Index of spatial dimension i, and of the channels, in a shape or attribute of a tensor
// with `dims` spatial dimensions.
int SpatialIndex(DataFormat f, int i) { return f == DataFormat::kNHWC ? 1 + i : 2 + i; }
int ChannelIndex(DataFormat f, int dims) { return f == DataFormat::kNHWC ? dims + 1 : 1; }

// A window attribute (strides, dilations) of an op with `dims` spatial dimensions.
// `positive`: TensorFlow's message for a spatial entry below 1.
Status CheckWindowAttr(const std::vector<int64_t>& v, const std::string& name, DataFormat f,
                       const char* positive, int dims = 2) {
  const std::string entries = std::to_string(dims + 2);
  if (v.size() != static_cast<size_t>(dims + 2)) {
    return Invalid(name + " must have " + entries + " entries (one per dimension of input), got " +
                       ListToString(v),
                   "Sliding window " + name + " field must specify " + entries + " dimensions");
  }
  const int c = ChannelIndex(f, dims);
  if (v[0] != 1 || v[c] != 1) {
    // Unimplemented, as TensorFlow's kernels classify it (and its own tests expect).
    return Unimplemented(name + " must be 1 in the batch and depth dimensions, got " +
                         ListToString(v) + ". Current implementation does not yet support " + name +
                         " in the batch and depth dimensions.");
  }
  for (int i = 0; i < dims; ++i) {
    if (v[SpatialIndex(f, i)] < 1) {
      return Invalid(name + " must be positive in the spatial dimensions, got " + ListToString(v),
                     positive);
    }
  }
  return OkStatus();
}

}  // namespace

Status ParsePadding(const std::string& s, Padding* out) {
  if (s == "SAME") {
    *out = Padding::kSame;
    return OkStatus();
  }
  if (s == "VALID") {
    *out = Padding::kValid;
    return OkStatus();
  }
  if (s == "EXPLICIT") {
    *out = Padding::kExplicit;
    return OkStatus();
  }
  return InvalidArgument("padding must be one of SAME, VALID, EXPLICIT, got '" + s + "'");
}

Status ParseDataFormat(const std::string& s, DataFormat* out) {
  if (s == "NHWC") {
    *out = DataFormat::kNHWC;
    return OkStatus();
  }
  if (s == "NCHW") {
    *out = DataFormat::kNCHW;
    return OkStatus();
  }
  return InvalidArgument("data_format must be NHWC or NCHW, got '" + s + "'");
}

Status ValidateAttrs(const ConvAttrs& a) {
  LC_RETURN_IF_ERROR(CheckWindowAttr(a.strides, "strides", a.data_format,
                                     "Row and column strides should be larger than 0."));
  LC_RETURN_IF_ERROR(CheckWindowAttr(a.dilations, "dilations", a.data_format,
                                     "Dilated rates should be larger than 0."));
  const std::string paddings = ListToString(a.explicit_paddings);
  if (a.padding == Padding::kExplicit) {
    if (a.explicit_paddings.size() != 8) {
      return Invalid(
          "explicit_paddings must have 8 entries (a before/after pair per dimension) when "
          "padding is EXPLICIT, got " +
              paddings,
          "explicit_paddings attribute must contain 8 values, but got: " +
              std::to_string(a.explicit_paddings.size()));
    }
    int h, w, c;
    SpatialIndices(a.data_format, &h, &w, &c);
    for (int64_t p : a.explicit_paddings) {
      if (p < 0) {
        return Invalid("explicit_paddings must be non-negative, got " + paddings,
                       "All elements of explicit_paddings must be nonnegative");
      }
    }
    if (a.explicit_paddings[0] || a.explicit_paddings[1] || a.explicit_paddings[2 * c] ||
        a.explicit_paddings[2 * c + 1]) {
      return Invalid(
          "explicit_paddings must be 0 in the batch and depth dimensions, got " + paddings,
          "Nonzero explicit padding in the batch or depth dimensions is not supported");
    }
  } else if (!a.explicit_paddings.empty()) {
    return Invalid(
        "explicit_paddings must be empty unless padding is EXPLICIT, got " + paddings,
        "explicit_paddings attribute must be empty if the padding attribute is not EXPLICIT");
  }
  return OkStatus();
}

Status WindowOutputSize(int64_t in, int64_t filter, int64_t stride, int64_t dilation,
                        Padding padding, const char* dim, int64_t* pad_before, int64_t* pad_after,
                        int64_t* out, WindowRule rule) {
  const std::string d(dim);
  if (in < 0)
    return InvalidArgument("input " + d + " must be non-negative, got " + std::to_string(in));
  if (filter < 0 || (filter == 0 && rule == WindowRule::kMustFit)) {
    return Invalid("filters " + d + " must be positive, got " + std::to_string(filter),
                   "filter must not have zero elements (i.e. all dimensions must be non-zero)");
  }
  if (stride < 1 || dilation < 1) {
    return InvalidArgument("strides and dilations along " + d + " must be positive");
  }
  // The dilated extent; 1 - dilation (<= 0) for a filter without taps (kTruncated only).
  int64_t span, eff;
  if (__builtin_mul_overflow(filter - 1, dilation, &span) ||
      __builtin_add_overflow(span, int64_t{1}, &eff)) {
    return InvalidArgument("filters " + d + " times dilation overflows int64");
  }
  if (padding == Padding::kSame) {
    // ceil(in / stride) without overflow.
    *out = in / stride + (in % stride != 0);
    int64_t needed = 0;
    if (*out > 0) {
      // (out - 1) * stride + eff - in, computed so it cannot overflow: (out-1)*stride < in.
      needed = (*out - 1) * stride - in;  // in (-stride, 0]
      needed = eff > -needed ? needed + eff : 0;
      if (needed < 0) needed = 0;
    }
    *pad_before = needed / 2;
    *pad_after = needed - *pad_before;
    return OkStatus();
  }
  if (padding == Padding::kValid) {
    *pad_before = 0;
    *pad_after = 0;
  }
  if (*pad_before < 0 || *pad_after < 0) {
    return InvalidArgument("explicit padding along " + d + " must be non-negative");
  }
  int64_t padded;
  if (__builtin_add_overflow(in, *pad_before, &padded) ||
      __builtin_add_overflow(padded, *pad_after, &padded)) {
    return InvalidArgument("padded input " + d + " overflows int64");
  }
  const std::string filter_desc =
      "filters " + d + " " + std::to_string(filter) +
      (dilation > 1 ? " (dilated to " + std::to_string(eff) + ")" : std::string());
  if (rule == WindowRule::kMustFit) {
    if (padded < eff) {
      return Invalid(filter_desc + " is larger than the padded input " + d + " " +
                         std::to_string(padded) + "; use padding='SAME' or a smaller filter",
                     "Negative dimension size caused by subtracting " + std::to_string(eff) +
                         " from " + std::to_string(padded));
    }
    *out = (padded - eff) / stride + 1;
    return OkStatus();
  }
  // TensorFlow's backprop kernels: (padded - eff + stride) / stride, rounded towards zero.
  int64_t num;
  if (__builtin_sub_overflow(padded, eff, &num) || __builtin_add_overflow(num, stride, &num)) {
    return InvalidArgument("padded input " + d + " minus filters " + d + " overflows int64");
  }
  *out = num / stride;
  if (*out < 0) {
    return Invalid(filter_desc + " is too large for the padded input " + d + " " +
                       std::to_string(padded) + ": the output " + d + " would be " +
                       std::to_string(*out),
                   "Computed output size would be negative: " + std::to_string(*out) +
                       " [input_size: " + std::to_string(in) + ", effective_filter_size: " +
                       std::to_string(eff) + ", stride: " + std::to_string(stride) + "]");
  }
  return OkStatus();
}

Status ChannelGroups(int64_t in_c, int64_t filter_in_c, int64_t out_c, int64_t* groups) {
  if (filter_in_c == 0) {
    if (in_c != 0) {
      return Invalid(
          "filters in-depth (dimension 2) is 0 but input depth is " + std::to_string(in_c),
          "filter depth must be stricly positive, got 0");
    }
    *groups = 1;
    return OkStatus();
  }
  if (in_c == 0 || in_c % filter_in_c != 0) {
    return Invalid("input depth " + std::to_string(in_c) +
                       " must be a positive multiple of filters in-depth (dimension 2) " +
                       std::to_string(filter_in_c),
                   "input depth must be evenly divisible by filter depth: " + std::to_string(in_c) +
                       " vs " + std::to_string(filter_in_c));
  }
  *groups = in_c / filter_in_c;
  if (out_c >= 0 && out_c % *groups != 0) {
    return Invalid("filters out-depth (dimension 3) " + std::to_string(out_c) +
                       " must be divisible by the number of groups " + std::to_string(*groups) +
                       " (input depth / filters in-depth)",
                   "output depth must be evenly divisible by number of groups: " +
                       std::to_string(out_c) + " vs " + std::to_string(*groups));
  }
  return OkStatus();
}

Strides4 ConvGeometry::input_strides() const {
  if (data_format == DataFormat::kNHWC) {
    return {in_h * in_w * in_c, in_w * in_c, in_c, 1};
  }
  return {in_c * in_h * in_w, in_w, 1, in_h * in_w};
}

Strides4 ConvGeometry::output_strides() const {
  if (data_format == DataFormat::kNHWC) {
    return {out_h * out_w * out_c, out_w * out_c, out_c, 1};
  }
  return {out_c * out_h * out_w, out_w, 1, out_h * out_w};
}

std::array<int64_t, 4> ConvGeometry::input_shape() const {
  if (data_format == DataFormat::kNHWC) return {batch, in_h, in_w, in_c};
  return {batch, in_c, in_h, in_w};
}

std::array<int64_t, 4> ConvGeometry::output_shape() const {
  if (data_format == DataFormat::kNHWC) return {batch, out_h, out_w, out_c};
  return {batch, out_c, out_h, out_w};
}

double ConvGeometry::macs() const {
  return static_cast<double>(batch) * out_h * out_w * out_c * filter_h * filter_w * filter_in_c;
}

Status MakeGeometry(const ConvAttrs& a, const std::array<int64_t, 4>& input_shape,
                    const std::array<int64_t, 4>& filter_shape, ConvGeometry* g, WindowRule rule) {
  LC_RETURN_IF_ERROR(ValidateAttrs(a));
  for (int i = 0; i < 4; ++i) {
    if (input_shape[i] < 0) return InvalidArgument("input shape must be non-negative");
    if (filter_shape[i] < 0) return InvalidArgument("filters shape must be non-negative");
  }
  int h, w, c;
  SpatialIndices(a.data_format, &h, &w, &c);
  ConvGeometry r;
  r.data_format = a.data_format;
  r.batch = input_shape[0];
  r.in_h = input_shape[h];
  r.in_w = input_shape[w];
  r.in_c = input_shape[c];
  r.filter_h = filter_shape[0];
  r.filter_w = filter_shape[1];
  r.filter_in_c = filter_shape[2];
  r.out_c = filter_shape[3];
  r.stride_h = a.strides[h];
  r.stride_w = a.strides[w];
  r.dilation_h = a.dilations[h];
  r.dilation_w = a.dilations[w];

  LC_RETURN_IF_ERROR(ChannelGroups(r.in_c, r.filter_in_c, r.out_c, &r.groups));
  if (a.padding == Padding::kExplicit) {
    r.pad_top = a.explicit_paddings[2 * h];
    r.pad_bottom = a.explicit_paddings[2 * h + 1];
    r.pad_left = a.explicit_paddings[2 * w];
    r.pad_right = a.explicit_paddings[2 * w + 1];
  }
  LC_RETURN_IF_ERROR(WindowOutputSize(r.in_h, r.filter_h, r.stride_h, r.dilation_h, a.padding,
                                      "height", &r.pad_top, &r.pad_bottom, &r.out_h, rule));
  LC_RETURN_IF_ERROR(WindowOutputSize(r.in_w, r.filter_w, r.stride_w, r.dilation_w, a.padding,
                                      "width", &r.pad_left, &r.pad_right, &r.out_w, rule));
  int64_t total;
  if (__builtin_mul_overflow(r.batch, r.out_h, &total) ||
      __builtin_mul_overflow(total, r.out_w, &total) ||
      __builtin_mul_overflow(total, r.out_c, &total)) {
    return InvalidArgument("output size overflows int64");
  }
  *g = r;
  return OkStatus();
}

Status CheckOutBackprop(const ConvGeometry& g, const std::array<int64_t, 4>& out_backprop) {
  const std::array<int64_t, 4> want = g.output_shape();
  int h, w, c;
  SpatialIndices(g.data_format, &h, &w, &c);
  const auto differs = [&](int i) {
    return out_backprop[i] >= 0 && want[i] >= 0 && out_backprop[i] != want[i];
  };
  std::string tf;
  if (differs(0)) {
    tf = "input and out_backprop must have the same batch size. Input batch: " +
         std::to_string(g.batch) + ", outbackprop batch: " + std::to_string(out_backprop[0]) +
         ", batch_dim: 0";
  } else if (differs(c)) {
    tf = "filter and out_backprop must have the same out_depth";
  } else {
    const struct {
      int index;
      int64_t in, filter, stride, dilation;
    } spatial[2] = {{h, g.in_h, g.filter_h, g.stride_h, g.dilation_h},
                    {w, g.in_w, g.filter_w, g.stride_w, g.dilation_w}};
    for (const auto& s : spatial) {
      if (!differs(s.index)) continue;
      const std::string actual = std::to_string(out_backprop[s.index]);
      tf = "Size of out_backprop doesn't match computed: actual = " + actual +
           ", computed = " + std::to_string(want[s.index]) +
           " spatial_dim: " + std::to_string(s.index) + " input: " + std::to_string(s.in) +
           " filter: " + std::to_string(s.filter) + " output: " + actual +
           " stride: " + std::to_string(s.stride) + " dilation: " + std::to_string(s.dilation);
      break;
    }
  }
  if (tf.empty()) return OkStatus();
  return Invalid("out_backprop has shape " + ShapeToString(out_backprop) +
                     " but the convolution produces " + ShapeToString(want),
                 tf);
}

// --- Three spatial dimensions --------------------------------------------------------------

namespace {
constexpr const char* kDimNames3d[kSpatial3d] = {"depth", "height", "width"};
}  // namespace

Status ParseDataFormat3d(const std::string& s, DataFormat* out) {
  if (s == "NDHWC" || s == "NCDHW") {
    *out = s == "NDHWC" ? DataFormat::kNHWC : DataFormat::kNCHW;
    return OkStatus();
  }
  return InvalidArgument("data_format must be NDHWC or NCDHW, got '" + s + "'");
}

Status ValidateAttrs(const Conv3dAttrs& a) {
  LC_RETURN_IF_ERROR(CheckWindowAttr(a.strides, "strides", a.data_format,
                                     "Strides should be larger than 0.", kSpatial3d));
  LC_RETURN_IF_ERROR(CheckWindowAttr(a.dilations, "dilations", a.data_format,
                                     "Dilated rates should be larger than 0.", kSpatial3d));
  if (a.padding == Padding::kExplicit) {
    return Invalid("padding must be SAME or VALID for a 3-D convolution, got EXPLICIT",
                   "Conv3D does not support explicit padding");
  }
  return OkStatus();
}

Shape5 Conv3dGeometry::shape(ConvTensor t) const {
  if (t == ConvTensor::kFilter) return {filter[0], filter[1], filter[2], filter_in_c, out_c};
  const Dims3& d = t == ConvTensor::kInput ? in : out;
  const int64_t c = t == ConvTensor::kInput ? in_c : out_c;
  if (data_format == DataFormat::kNHWC) return {batch, d[0], d[1], d[2], c};
  return {batch, c, d[0], d[1], d[2]};
}

Status MakeGeometry(const Conv3dAttrs& a, const Shape5& input_shape, const Shape5& filter_shape,
                    Conv3dGeometry* g, WindowRule rule) {
  LC_RETURN_IF_ERROR(ValidateAttrs(a));
  for (int i = 0; i < kSpatial3d + 2; ++i) {
    if (input_shape[i] < 0) return InvalidArgument("input shape must be non-negative");
    if (filter_shape[i] < 0) return InvalidArgument("filters shape must be non-negative");
  }
  Conv3dGeometry r;
  r.data_format = a.data_format;
  r.batch = input_shape[0];
  r.in_c = input_shape[ChannelIndex(a.data_format, kSpatial3d)];
  r.filter_in_c = filter_shape[kSpatial3d];
  r.out_c = filter_shape[kSpatial3d + 1];
  LC_RETURN_IF_ERROR(ChannelGroups(r.in_c, r.filter_in_c, r.out_c, &r.groups));
  int64_t total = r.batch;
  for (int i = 0; i < kSpatial3d; ++i) {
    const int at = SpatialIndex(a.data_format, i);
    r.in[i] = input_shape[at];
    r.filter[i] = filter_shape[i];
    r.stride[i] = a.strides[at];
    r.dilation[i] = a.dilations[at];
    LC_RETURN_IF_ERROR(WindowOutputSize(r.in[i], r.filter[i], r.stride[i], r.dilation[i], a.padding,
                                        kDimNames3d[i], &r.pad_before[i], &r.pad_after[i],
                                        &r.out[i], rule));
    if (__builtin_mul_overflow(total, r.out[i], &total)) {
      return InvalidArgument("output size overflows int64");
    }
  }
  if (__builtin_mul_overflow(total, r.out_c, &total)) {
    return InvalidArgument("output size overflows int64");
  }
  *g = r;
  return OkStatus();
}

Status CheckOutBackprop(const Conv3dGeometry& g, const Shape5& out_backprop) {
  const Shape5 want = g.shape(ConvTensor::kOutput);
  for (int i = 0; i < kSpatial3d + 2; ++i) {
    if (out_backprop[i] < 0 || want[i] < 0 || out_backprop[i] == want[i]) continue;
    const std::string dim = i == 0                                         ? "batch"
                            : i == ChannelIndex(g.data_format, kSpatial3d) ? "depth (channels)"
                                                                           : "spatial";
    return Invalid("out_backprop has shape " + ShapeToString(out_backprop) +
                       " but the convolution produces " + ShapeToString(want),
                   "Size of out_backprop doesn't match computed: actual = " +
                       std::to_string(out_backprop[i]) + ", computed = " + std::to_string(want[i]) +
                       " in the " + dim + " dimension " + std::to_string(i));
  }
  return OkStatus();
}

}  // namespace largeconv
