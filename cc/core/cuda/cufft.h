// cuFFT, found at run time: the build needs neither its header nor its library. The library
// is looked up by soname (as already loaded by the process, e.g. by TensorFlow or torch, or
// on the loader path), then in the pip package nvidia-cufft beside this package, then in
// $CUDA_HOME/lib64 and /usr/local/cuda/lib64; $LARGECONV_CUFFT names a file to use instead.
// Plans are created once per (device, transform shape) and cached.
#ifndef TF_LARGECONV_CORE_CUDA_CUFFT_H_
#define TF_LARGECONV_CORE_CUDA_CUFFT_H_

#include <cstdint>
#include <string>

#include "cc/core/common/status.h"
#include "cc/core/cuda/fft_plan.h"

struct CUstream_st;

namespace largeconv {
namespace cuda {

// "" once cuFFT is loaded (it is loaded on the first call), otherwise why it is not.
std::string CufftStatus();
// The file cuFFT was loaded from and its version (e.g. 11300), or "" / 0.
std::string CufftPath();
int CufftVersion();

// Work-area bytes of a transform on the current device, creating and caching its plan; -1
// with *error set if cuFFT cannot make it.
int64_t CufftWorkBytes(const TransformShape& s, Status* error);

// Enqueues the in-place transform on `stream`, with `work` (work_bytes long, at least
// CufftWorkBytes of it) as the work area.
Status CufftExecute(const TransformShape& s, void* data, void* work, int64_t work_bytes,
                    CUstream_st* stream);

}  // namespace cuda
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CUDA_CUFFT_H_
