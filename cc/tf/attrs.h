// Reads the Conv2D attribute set from an op's construction or shape-inference context
// into the framework-free ConvAttrs, and converts core error strings into TF statuses.
#ifndef TF_LARGECONV_TF_ATTRS_H_
#define TF_LARGECONV_TF_ATTRS_H_

#include <string>
#include <vector>

#include "cc/core/geometry.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/errors.h"

namespace largeconv {

inline absl::Status ToStatus(const std::string& err) {
  if (err.empty()) return absl::OkStatus();
  return tensorflow::errors::InvalidArgument(err);
}

// Ctx is OpKernelConstruction or shape_inference::InferenceContext (both have GetAttr).
template <typename Ctx>
absl::Status ReadConvAttrs(Ctx* ctx, ConvAttrs* attrs) {
  std::vector<int64_t> strides, dilations;
  std::vector<int64_t> explicit_paddings;
  std::string padding, data_format;
  TF_RETURN_IF_ERROR(ctx->GetAttr("strides", &strides));
  TF_RETURN_IF_ERROR(ctx->GetAttr("dilations", &dilations));
  TF_RETURN_IF_ERROR(ctx->GetAttr("padding", &padding));
  TF_RETURN_IF_ERROR(ctx->GetAttr("explicit_paddings", &explicit_paddings));
  TF_RETURN_IF_ERROR(ctx->GetAttr("data_format", &data_format));
  ConvAttrs a;
  a.strides = strides;
  a.dilations = dilations;
  a.explicit_paddings = explicit_paddings;
  TF_RETURN_IF_ERROR(ToStatus(ParsePadding(padding, &a.padding)));
  TF_RETURN_IF_ERROR(ToStatus(ParseDataFormat(data_format, &a.data_format)));
  TF_RETURN_IF_ERROR(ToStatus(ValidateAttrs(a)));
  *attrs = a;
  return absl::OkStatus();
}

}  // namespace largeconv

#endif  // TF_LARGECONV_TF_ATTRS_H_
