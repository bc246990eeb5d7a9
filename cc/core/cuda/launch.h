// Launch functions of the CUDA kernels: plain device pointers and a stream, no CUDA or
// TensorFlow headers, so host-compiled adapters (the TF op, the pybind11 module) can call
// them. Errors come back as a message ("" on success); nothing here aborts or synchronises.
#ifndef TF_LARGECONV_CORE_CUDA_LAUNCH_H_
#define TF_LARGECONV_CORE_CUDA_LAUNCH_H_

#include <cstdint>
#include <string>

#include "cc/core/cuda/tiles.h"
#include "cc/core/fft.h"
#include "cc/core/geometry.h"

struct CUstream_st;

namespace largeconv {
namespace cuda {

using Stream = CUstream_st*;  // cudaStream_t

// One pass of the direct tile kernels, enqueued on `stream`, cut up as `config` says:
// MakeTileConfig(g, pass, sizeof(AccT<T>), workspace_limit), made once by the caller, who
// also allocates its workspace_bytes (backprop-filter's partial sums; 0 otherwise) as
// `workspace`. Operands in RunPass's order: forward (input, filter) -> output;
// backprop-input (filter, out_backprop) -> in_backprop; backprop-filter (input,
// out_backprop) -> filter_backprop. T: float, double, f16, bf16 (cc/core/dtypes.h).
template <typename T>
std::string DirectPass(const ConvGeometry& g, ConvPass pass, const TileConfig& config,
                       const T* a, const T* b, T* out, void* workspace, Stream stream);

}  // namespace cuda
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CUDA_LAUNCH_H_
