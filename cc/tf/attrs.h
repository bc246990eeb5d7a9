// Reads the Conv2D attribute set from an op's construction or shape-inference context
// into the framework-free ConvAttrs, and converts the core's errors into TF statuses.
#ifndef TF_LARGECONV_TF_ATTRS_H_
#define TF_LARGECONV_TF_ATTRS_H_

#include <string>
#include <vector>

#include "cc/core/geometry.h"
#include "cc/core/status.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/errors.h"

namespace largeconv {

// The core's error kinds as TF's error classes (see cc/core/status.h).
inline absl::Status ToStatus(const Status& s) {
  switch (s.kind()) {
    case ErrorKind::kOk:
      return absl::OkStatus();
    case ErrorKind::kInvalidArgument:
      return tensorflow::errors::InvalidArgument(s.message());
    case ErrorKind::kUnimplemented:
      return tensorflow::errors::Unimplemented(s.message());
    case ErrorKind::kResourceExhausted:
      return tensorflow::errors::ResourceExhausted(s.message());
    case ErrorKind::kInternal:
      break;
  }
  return tensorflow::errors::Internal(s.message());
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
