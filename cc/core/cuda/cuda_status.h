// CUDA runtime errors as the core's statuses: an allocation failure is a resource
// exhausted, a machine without a usable device lacks a capability (unimplemented), anything
// else is an internal error; never the caller's arguments.
#ifndef TF_LARGECONV_CORE_CUDA_CUDA_STATUS_H_
#define TF_LARGECONV_CORE_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <string>

#include "cc/core/common/status.h"

namespace largeconv {
namespace cuda {

inline Status CudaStatus(const char* what, cudaError_t e) {
  if (e == cudaSuccess) return OkStatus();
  std::string message = std::string(what) + ": " + cudaGetErrorString(e);
  if (e == cudaErrorMemoryAllocation) return ResourceExhausted(std::move(message));
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
    return Unimplemented(std::move(message));
  }
  return Internal(std::move(message));
}

}  // namespace cuda
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CUDA_CUDA_STATUS_H_
