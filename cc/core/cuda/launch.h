// Launch functions of the CUDA kernels: plain device pointers and a stream, no CUDA or
// TensorFlow headers, so host-compiled adapters (the TF op, the pybind11 module) can call
// them. Errors come back as a Status (cc/core/status.h); nothing here aborts or synchronises.
#ifndef TF_LARGECONV_CORE_CUDA_LAUNCH_H_
#define TF_LARGECONV_CORE_CUDA_LAUNCH_H_

#include <cstdint>
#include <string>

#include "cc/core/common/geometry.h"
#include "cc/core/common/status.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cuda/fft_plan.h"
#include "cc/core/cuda/tiles.h"

struct CUstream_st;

namespace largeconv {
namespace cuda {

using Stream = CUstream_st*;  // cudaStream_t

// Plans a pass for the current device: the direct tile kernels or the FFT path, whichever
// the cost model prefers within `workspace_limit` (kAutoAlgorithm), or the one asked for.
// Loads cuFFT on first use and asks it for its work areas (creating and caching plans);
// without cuFFT only the direct kernels are planned, and an explicit kGpuFft is refused.
// real_bytes: 4 for float/half/bfloat16 (float arithmetic), 8 for double.
Status PlanCudaPass(const ConvGeometry& g, ConvPass pass, Algorithm algorithm, int real_bytes,
                    int64_t workspace_limit, CudaPlan* plan);
// The same for a Conv3D pass (rank-3 cuFFT transforms on the FFT path).
Status PlanCudaPass(const Conv3dGeometry& g, ConvPass pass, Algorithm algorithm, int real_bytes,
                    int64_t workspace_limit, CudaPlan* plan);

// Enqueues a planned pass on `stream`; `workspace` holds plan.workspace_bytes (may be null
// when that is 0). Operands in RunPass's order: forward (input, filter) -> output;
// backprop-input (filter, out_backprop) -> in_backprop; backprop-filter (input,
// out_backprop) -> filter_backprop. T: LARGECONV_FOR_EACH_FLOAT_DTYPE (cc/core/dtypes.h).
template <typename T>
Status RunCudaPass(const ConvGeometry& g, const CudaPlan& plan, const T* a, const T* b, T* out,
                   void* workspace, Stream stream);
template <typename T>
Status RunCudaPass(const Conv3dGeometry& g, const CudaPlan& plan, const T* a, const T* b, T* out,
                   void* workspace, Stream stream);

// The direct tile kernels alone, cut up as `config` says (MakeTileConfig), with its
// workspace_bytes as `workspace`. With `gate` (a device int), the kernels do nothing
// unless *gate != 0 when they run.
template <typename T>
Status DirectPass(const ConvGeometry& g, ConvPass pass, const TileConfig& config, const T* a,
                  const T* b, T* out, void* workspace, Stream stream, const int* gate = nullptr);
template <typename T>
Status DirectPass(const Conv3dGeometry& g, ConvPass pass, const TileConfig& config, const T* a,
                  const T* b, T* out, void* workspace, Stream stream, const int* gate = nullptr);

}  // namespace cuda
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CUDA_LAUNCH_H_
