// ConvGeometry: the single source of truth for convolution output sizes and padding.
// Framework-free (no TensorFlow headers); every kernel, shape function and the Python
// bindings derive sizes from here.
#ifndef TF_LARGECONV_CORE_COMMON_GEOMETRY_H_
#define TF_LARGECONV_CORE_COMMON_GEOMETRY_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/common/status.h"
#include "cc/core/common/vocabulary.h"

namespace largeconv {

enum class Padding { kSame, kValid, kExplicit };
enum class DataFormat { kNHWC, kNCHW };

// Parses "SAME"/"VALID"/"EXPLICIT" and "NHWC"/"NCHW"; returns an error naming the argument or OK.
Status ParsePadding(const std::string& s, Padding* out);
Status ParseDataFormat(const std::string& s, DataFormat* out);

// The attributes of a Conv2D-family op, exactly as TF's Conv2D carries them: strides,
// dilations and explicit_paddings are in data_format order.
struct ConvAttrs {
  std::vector<int64_t> strides;
  std::vector<int64_t> dilations;
  Padding padding = Padding::kValid;
  std::vector<int64_t> explicit_paddings;
  DataFormat data_format = DataFormat::kNHWC;
};

// Checks the attributes alone (lengths, signs, batch/depth entries). Returns OK when valid,
// otherwise a message naming the offending argument.
Status ValidateAttrs(const ConvAttrs& attrs);

// What a (dilated) filter larger than its padded input means, in TensorFlow's two rules:
//   kMustFit    the forward op, as TF's shape inference: an error. The filter must have
//               at least one tap in each dimension.
//   kTruncated  the backprop ops, as TF's backprop kernels: the output size is
//               (padded - dilated filter + stride) / stride rounded towards zero, so it
//               can be 0 (the gradients are then zeros or empty), and a filter may have
//               no taps; only a negative output size is an error.
enum class WindowRule { kMustFit, kTruncated };

// Output size along one spatial dimension. `pad_before`/`pad_after` are inputs for
// EXPLICIT padding and outputs for SAME/VALID. Returns OK or an error that names `dim`.
Status WindowOutputSize(int64_t in, int64_t filter, int64_t stride, int64_t dilation,
                        Padding padding, const char* dim, int64_t* pad_before, int64_t* pad_after,
                        int64_t* out, WindowRule rule = WindowRule::kMustFit);

// Number of groups implied by the channel counts (input depth / filters in-depth), with the
// checks TF's Conv2D makes. out_c < 0 means "not known yet" and skips its check.
Status ChannelGroups(int64_t in_c, int64_t filter_in_c, int64_t out_c, int64_t* groups);

// Element strides of a logical (N, H, W, C) view of a dense tensor in a given layout.
struct Strides4 {
  int64_t n, h, w, c;
};

// The channels a pass correlates from (source) into (destination), in all and per group:
// those of the pass's ImagesOf (forward input -> output channels, backprop-input the
// reverse, backprop-filter input channels against output channels).
struct PassChannels {
  int64_t src, dst, src_per_group, dst_per_group;
};
// The channels of `pass` for a convolution of in_c input and out_c output channels, per
// group icpg and ocpg: what every geometry's channels() answers.
inline PassChannels ChannelsOf(ConvPass pass, int64_t in_c, int64_t out_c, int64_t icpg,
                               int64_t ocpg) {
  const PassImages im = ImagesOf(pass);
  const auto pick = [&](ConvTensor t, int64_t input, int64_t output) {
    return t == ConvTensor::kInput ? input : output;
  };
  return {pick(im.src, in_c, out_c), pick(im.dst, in_c, out_c), pick(im.src, icpg, ocpg),
          pick(im.dst, icpg, ocpg)};
}

struct ConvGeometry {
  int64_t batch = 0, in_h = 0, in_w = 0, in_c = 0;
  int64_t filter_h = 0, filter_w = 0, filter_in_c = 0, out_c = 0;
  int64_t groups = 1;
  int64_t stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  int64_t pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
  int64_t out_h = 0, out_w = 0;
  DataFormat data_format = DataFormat::kNHWC;

  int64_t in_c_per_group() const { return filter_in_c; }
  int64_t out_c_per_group() const { return groups > 0 ? out_c / groups : 0; }
  Strides4 input_strides() const;
  Strides4 output_strides() const;
  int64_t input_elements() const { return batch * in_h * in_w * in_c; }
  int64_t output_elements() const { return batch * out_h * out_w * out_c; }
  int64_t filter_elements() const { return filter_h * filter_w * filter_in_c * out_c; }
  int64_t elements(ConvTensor t) const {
    return t == ConvTensor::kInput    ? input_elements()
           : t == ConvTensor::kFilter ? filter_elements()
                                      : output_elements();
  }
  // Input / output shapes in data_format order, the filter's [KH, KW, C_in / groups, C_out].
  std::array<int64_t, 4> input_shape() const;
  std::array<int64_t, 4> output_shape() const;
  std::array<int64_t, 4> filter_shape() const { return {filter_h, filter_w, filter_in_c, out_c}; }
  // The shape of one of the three tensors (and of its gradient).
  std::array<int64_t, 4> shape(ConvTensor t) const {
    return t == ConvTensor::kInput    ? input_shape()
           : t == ConvTensor::kFilter ? filter_shape()
                                      : output_shape();
  }
  // Multiply-adds of one forward pass.
  double macs() const;
  // No products but with padding at most (an operand or the result has no elements): every
  // pass's result is zeros (or empty), and there is nothing to transform.
  bool no_products() const {
    return batch == 0 || in_h == 0 || in_w == 0 || out_h == 0 || out_w == 0 || out_c == 0 ||
           filter_h == 0 || filter_w == 0 || filter_in_c == 0;
  }
  PassChannels channels(ConvPass pass) const {
    return ChannelsOf(pass, in_c, out_c, in_c_per_group(), out_c_per_group());
  }
  // Height and width of one of the three tensors.
  std::array<int64_t, 2> spatial(ConvTensor t) const {
    return t == ConvTensor::kInput    ? std::array<int64_t, 2>{in_h, in_w}
           : t == ConvTensor::kFilter ? std::array<int64_t, 2>{filter_h, filter_w}
                                      : std::array<int64_t, 2>{out_h, out_w};
  }
  // Every field, for the plan caches: geometries with equal keys plan alike.
  using Key = std::array<int64_t, 20>;
  Key key() const {
    return {batch,    in_h,        in_w,       in_c,    filter_h,
            filter_w, filter_in_c, out_c,      groups,  stride_h,
            stride_w, dilation_h,  dilation_w, pad_top, pad_bottom,
            pad_left, pad_right,   out_h,      out_w,   static_cast<int64_t>(data_format)};
  }
};

// Builds the geometry from validated-or-not attributes and the two shapes (input in
// data_format order, filter as [KH, KW, C_in / groups, C_out]). Returns OK or an error.
// The forward op builds it with kMustFit, the backprop ops with kTruncated.
Status MakeGeometry(const ConvAttrs& attrs, const std::array<int64_t, 4>& input_shape,
                    const std::array<int64_t, 4>& filter_shape, ConvGeometry* g,
                    WindowRule rule = WindowRule::kMustFit);

// The rule a pass's geometry is built with: the backprop passes are the backprop ops'.
inline WindowRule WindowRuleOf(ConvPass pass) {
  return RolesOf(pass).out == ConvTensor::kOutput ? WindowRule::kMustFit : WindowRule::kTruncated;
}

// The backprop ops' check that out_backprop has the shape the convolution produces. The
// error gives both shapes and then, in TensorFlow's words, the first dimension that
// differs (batch, depth, then height and width). Sizes < 0 are unknown and match: those of
// out_backprop, and those of a geometry the shape functions fill from partly known shapes.
Status CheckOutBackprop(const ConvGeometry& g, const std::array<int64_t, 4>& out_backprop);

// --- Three spatial dimensions --------------------------------------------------------------
//
// The Conv3D family's geometry sits beside ConvGeometry rather than inside it, so that the
// 2-D kernels (CPU and CUDA) keep their fields and their speed. Each spatial dimension is
// sized by the same WindowOutputSize as the 2-D ops' height and width; the fields are arrays
// over the spatial dimensions (depth, height, width), so the 3-D kernels loop over
// dimensions instead of naming them. The data formats are the 2-D ones with a depth
// dimension: DataFormat::kNHWC stands for NDHWC (channels last), kNCHW for NCDHW.

constexpr int kSpatial3d = 3;
using Dims3 = std::array<int64_t, kSpatial3d>;  // depth, height, width
using Shape5 = std::array<int64_t, kSpatial3d + 2>;

inline int64_t Volume(const Dims3& d) { return d[0] * d[1] * d[2]; }

// Parses "NDHWC" / "NCDHW".
Status ParseDataFormat3d(const std::string& s, DataFormat* out);

// The attributes of TensorFlow's Conv3D: strides and dilations have 5 entries in
// data_format order; padding is SAME or VALID (Conv3D has no explicit padding).
struct Conv3dAttrs {
  std::vector<int64_t> strides;
  std::vector<int64_t> dilations;
  Padding padding = Padding::kValid;
  DataFormat data_format = DataFormat::kNHWC;
};

Status ValidateAttrs(const Conv3dAttrs& attrs);

// Element strides of a dense 5-D tensor: image, channel, and each spatial dimension.
struct Strides5 {
  int64_t n, c;
  Dims3 s;
};

struct Conv3dGeometry {
  int64_t batch = 0, in_c = 0, filter_in_c = 0, out_c = 0, groups = 1;
  Dims3 in{}, filter{}, out{};
  Dims3 stride{1, 1, 1}, dilation{1, 1, 1}, pad_before{}, pad_after{};
  DataFormat data_format = DataFormat::kNHWC;

  int64_t in_c_per_group() const { return filter_in_c; }
  int64_t out_c_per_group() const { return groups > 0 ? out_c / groups : 0; }
  int64_t input_elements() const { return batch * Volume(in) * in_c; }
  int64_t output_elements() const { return batch * Volume(out) * out_c; }
  int64_t filter_elements() const { return Volume(filter) * filter_in_c * out_c; }
  int64_t elements(ConvTensor t) const {
    return t == ConvTensor::kInput    ? input_elements()
           : t == ConvTensor::kFilter ? filter_elements()
                                      : output_elements();
  }
  Strides5 input_strides() const { return StridesOf(in, in_c); }
  Strides5 output_strides() const { return StridesOf(out, out_c); }
  // Input / output shapes in data_format order, the filter's [KD, KH, KW, C_in / groups,
  // C_out].
  Shape5 shape(ConvTensor t) const;
  double macs() const {
    return static_cast<double>(batch) * Volume(out) * out_c * Volume(filter) * filter_in_c;
  }
  bool no_products() const {
    return batch == 0 || Volume(in) == 0 || Volume(out) == 0 || out_c == 0 || Volume(filter) == 0 ||
           filter_in_c == 0;
  }
  PassChannels channels(ConvPass pass) const {
    return ChannelsOf(pass, in_c, out_c, in_c_per_group(), out_c_per_group());
  }

 private:
  Strides5 StridesOf(const Dims3& d, int64_t c) const {
    if (data_format == DataFormat::kNHWC) {
      return {Volume(d) * c, 1, {d[1] * d[2] * c, d[2] * c, c}};
    }
    return {c * Volume(d), Volume(d), {d[1] * d[2], d[2], 1}};
  }
};

// Builds the 3-D geometry (input in data_format order, filter [KD, KH, KW, C_in / groups,
// C_out]) under `rule`, each dimension by WindowOutputSize.
Status MakeGeometry(const Conv3dAttrs& attrs, const Shape5& input_shape, const Shape5& filter_shape,
                    Conv3dGeometry* g, WindowRule rule = WindowRule::kMustFit);

// The 3-D backprop ops' check of out_backprop's shape (sizes < 0 are unknown and match).
Status CheckOutBackprop(const Conv3dGeometry& g, const Shape5& out_backprop);

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_COMMON_GEOMETRY_H_
