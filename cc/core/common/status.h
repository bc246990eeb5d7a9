// The core's errors: a kind and a message naming the argument (or the failing call). The
// adapters map the kind to their own error classes, so a CUDA or cuFFT failure never reaches
// a user as a complaint about their arguments:
//   kind                 TensorFlow              Python
//   kInvalidArgument     InvalidArgumentError    ValueError
//   kUnimplemented       UnimplementedError      NotImplementedError
//   kResourceExhausted   ResourceExhaustedError  MemoryError
//   kInternal            InternalError           RuntimeError
#ifndef TF_LARGECONV_CORE_COMMON_STATUS_H_
#define TF_LARGECONV_CORE_COMMON_STATUS_H_

#include <string>
#include <utility>

namespace largeconv {

enum class ErrorKind { kOk, kInvalidArgument, kUnimplemented, kResourceExhausted, kInternal };

class Status {
 public:
  Status() = default;  // success
  Status(ErrorKind kind, std::string message) : kind_(kind), message_(std::move(message)) {}

  bool ok() const { return kind_ == ErrorKind::kOk; }
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }

 private:
  ErrorKind kind_ = ErrorKind::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
inline Status InvalidArgument(std::string message) {
  return Status(ErrorKind::kInvalidArgument, std::move(message));
}
inline Status Unimplemented(std::string message) {
  return Status(ErrorKind::kUnimplemented, std::move(message));
}
inline Status ResourceExhausted(std::string message) {
  return Status(ErrorKind::kResourceExhausted, std::move(message));
}
inline Status Internal(std::string message) {
  return Status(ErrorKind::kInternal, std::move(message));
}

}  // namespace largeconv

// Returns the status of `expr` from the enclosing function when it is an error.
#define LC_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::largeconv::Status lc_status_ = (expr); \
    if (!lc_status_.ok()) return lc_status_; \
  } while (false)

#endif  // TF_LARGECONV_CORE_COMMON_STATUS_H_
