// Launch functions of the CUDA kernels: plain device pointers and a stream, no CUDA or
// TensorFlow headers, so host-compiled adapters (the TF op, the pybind11 module) can call
// them. Errors come back as a message ("" on success); nothing here aborts or synchronises.
#ifndef TF_LARGECONV_CORE_CUDA_LAUNCH_H_
#define TF_LARGECONV_CORE_CUDA_LAUNCH_H_

#include <cstdint>
#include <string>

#include "cc/core/fft.h"
#include "cc/core/geometry.h"

struct CUstream_st;

namespace largeconv {
namespace cuda {

using Stream = CUstream_st*;  // cudaStream_t

// Bytes of device workspace DirectPass needs (backprop-filter's partial sums; 0 otherwise).
int64_t DirectWorkspaceBytes(const ConvGeometry& g, ConvPass pass, int acc_bytes,
                             int64_t workspace_limit);

// One pass of the direct tile kernels, enqueued on `stream`. Operands in RunPass's order:
// forward (input, filter) -> output; backprop-input (filter, out_backprop) -> in_backprop;
// backprop-filter (input, out_backprop) -> filter_backprop. `workspace` holds
// DirectWorkspaceBytes(g, pass, sizeof accumulator, workspace_limit) bytes.
// T: float, double, f16, bf16 (cc/core/dtypes.h).
template <typename T>
std::string DirectPass(const ConvGeometry& g, ConvPass pass, const T* a, const T* b, T* out,
                       void* workspace, int64_t workspace_limit, Stream stream);

}  // namespace cuda
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CUDA_LAUNCH_H_
