// Reads the Conv2D attribute set from an op's construction or shape-inference context
// into the framework-free ConvAttrs, converts the core's errors into TF statuses, and
// words the operand errors the kernels and the shape functions share.
#ifndef TF_LARGECONV_TF_ATTRS_H_
#define TF_LARGECONV_TF_ATTRS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/common/geometry.h"
#include "cc/core/common/status.h"
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

// The operand errors of the kernels and the shape functions alike: our words naming the
// tensor, then TensorFlow's for the same mistake (its kernels' and its shape inference's),
// so that code matching either finds them.
inline absl::Status NotRank(const char* name, const std::string& shape, int64_t rank, int want) {
  return tensorflow::errors::InvalidArgument(name, " must be a ", want, "-D tensor, got shape ",
                                             shape, ". convolution ", name, " must be ", want,
                                             "-dimensional: ", shape, ". Shape must be rank ", want,
                                             " but is rank ", rank);
}
inline absl::Status NotRank4(const char* name, const std::string& shape, int64_t rank) {
  return NotRank(name, shape, rank, 4);
}

// `name` (input_sizes or filter_sizes) of the backprop op `op` is not a vector.
inline absl::Status SizesNotVector(const char* name, const char* op, const std::string& shape,
                                   int64_t rank) {
  return tensorflow::errors::InvalidArgument(name, " must be a vector, got shape ", shape, ". ", op,
                                             ": ", name, " input must be 1-dim, not ", rank);
}

// ... holds `count` sizes where 4 (or 2, `spatial_ok`: input_sizes) are needed.
inline absl::Status WrongSizesCount(const char* name, const char* op, bool spatial_ok,
                                    int64_t count) {
  if (!spatial_ok) {
    return tensorflow::errors::InvalidArgument(name, " must be a vector of 4 sizes, got ", count,
                                               ". filter must be 4-dimensional");
  }
  return tensorflow::errors::InvalidArgument(
      name, " must be a vector of 4 sizes (or 2: height and width), got ", count, ". ", op,
      " requires ", name, " to contain 4 values or 2 values, but got: ", count);
}

// ... holds the negative size `value`.
inline absl::Status NegativeSize(const char* name, int64_t value) {
  return tensorflow::errors::InvalidArgument(name, " must be non-negative, got ", value,
                                             ". Dimension ", value, " must be >= 0");
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

// The Conv3D attribute set (strides, dilations, padding, data_format), read and checked.
template <typename Ctx>
absl::Status ReadConv3dAttrs(Ctx* ctx, Conv3dAttrs* attrs) {
  Conv3dAttrs a;
  std::string padding, data_format;
  TF_RETURN_IF_ERROR(ctx->GetAttr("strides", &a.strides));
  TF_RETURN_IF_ERROR(ctx->GetAttr("dilations", &a.dilations));
  TF_RETURN_IF_ERROR(ctx->GetAttr("padding", &padding));
  TF_RETURN_IF_ERROR(ctx->GetAttr("data_format", &data_format));
  TF_RETURN_IF_ERROR(ToStatus(ParsePadding(padding, &a.padding)));
  TF_RETURN_IF_ERROR(ToStatus(ParseDataFormat3d(data_format, &a.data_format)));
  TF_RETURN_IF_ERROR(ToStatus(ValidateAttrs(a)));
  *attrs = a;
  return absl::OkStatus();
}

}  // namespace largeconv

#endif  // TF_LARGECONV_TF_ATTRS_H_
