// Device driver of the FFT path (fft_pipeline.h): element kernels as grid-strided launches,
// transforms through cuFFT (cufft.h), the exact redo through the gated direct kernels. Also
// the planner and runner entry points of launch.h.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>

#include "cc/core/cuda/cufft.h"
#include "cc/core/cuda/fft_pipeline.h"
#include "cc/core/cuda/launch.h"

namespace largeconv {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // x kThreads: the stride kNarrowCount allows

template <class F, typename I>
__global__ void __launch_bounds__(kThreads) ForEachKernel(I count, const F f) {
  const I step = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
       i < count; i += step) {
    f(i);
  }
}

// Keeps the first error and skips everything after it.
struct DeviceRunner {
  cudaStream_t stream;
  int64_t work_bytes;  // cuFFT's work area as planned
  std::string error;
  bool transform_failed = false;

  template <class F>
  void ForEach(int64_t count, const F& f) {
    if (!error.empty() || count <= 0) return;
    const int64_t blocks = std::min((count + kThreads - 1) / kThreads, kMaxBlocks);
    if (count < kNarrowCount) {
      ForEachKernel<F, int32_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          static_cast<int32_t>(count), f);
    } else {
      ForEachKernel<F, int64_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(count, f);
    }
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) error = std::string("CUDA kernel launch failed: ") + cudaGetErrorString(e);
  }
  void Transform(const TransformShape& s, void* data, void* work) {
    if (!error.empty()) return;
    error = CufftExecute(s, data, work, work_bytes, stream);
    transform_failed = !error.empty();
  }
  template <typename T>
  void Direct(const ConvGeometry& g, ConvPass pass, const TileConfig& config, const T* a,
              const T* b, T* out, void* workspace, const int* gate) {
    if (error.empty()) error = DirectPass(g, pass, config, a, b, out, workspace, stream, gate);
  }
};

// Plans by everything they depend on: the geometry, the request and the device. Planning
// searches every transform size (milliseconds), and a training loop or a benchmark asks for
// the same few geometries on every call.
using PlanKey = std::array<int64_t, 25>;
constexpr size_t kMaxCachedPlans = 256;

struct PlanCache {
  std::mutex mu;
  std::map<PlanKey, CudaPlan> plans;
};

PlanCache& Plans() {
  static PlanCache* cache = new PlanCache();
  return *cache;
}

std::string PlanUncached(const ConvGeometry& g, ConvPass pass, Algorithm algorithm,
                         int real_bytes, int64_t workspace_limit, CudaPlan* plan) {
  const std::string status = algorithm == Algorithm::kDirect ? "" : CufftStatus();
  if (algorithm == Algorithm::kDirect || !status.empty()) {
    return PlanGpuPass(g, pass, algorithm, real_bytes, workspace_limit, nullptr, status, plan);
  }
  const WorkBytesFn work = [](const TransformShape& s, std::string* error) {
    return CufftWorkBytes(s, error);
  };
  return PlanGpuPass(g, pass, algorithm, real_bytes, workspace_limit, &work, "", plan);
}

}  // namespace

std::string PlanCudaPass(const ConvGeometry& g, ConvPass pass, Algorithm algorithm,
                         int real_bytes, int64_t workspace_limit, CudaPlan* plan) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // no device: plan anyway (the direct kernels need none to plan)
    device = -1;
  }
  const PlanKey key{g.batch, g.in_h, g.in_w, g.in_c, g.filter_h, g.filter_w, g.filter_in_c,
                    g.out_c, g.groups, g.stride_h, g.stride_w, g.dilation_h, g.dilation_w,
                    g.pad_top, g.pad_bottom, g.pad_left, g.pad_right, g.out_h, g.out_w,
                    static_cast<int64_t>(g.data_format), static_cast<int64_t>(pass),
                    static_cast<int64_t>(algorithm), real_bytes, workspace_limit, device};
  PlanCache& cache = Plans();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.plans.find(key);
    if (it != cache.plans.end()) {
      *plan = it->second;
      return "";
    }
  }
  const std::string error = PlanUncached(g, pass, algorithm, real_bytes, workspace_limit, plan);
  if (!error.empty()) return error;
  std::lock_guard<std::mutex> lock(cache.mu);
  if (cache.plans.size() >= kMaxCachedPlans) cache.plans.clear();
  cache.plans.emplace(key, *plan);
  return "";
}

template <typename T>
std::string RunCudaPass(const ConvGeometry& g, const CudaPlan& plan, const T* a, const T* b,
                        T* out, void* workspace, Stream stream) {
  if (plan.workspace_bytes > 0 && workspace == nullptr) {
    return "the planned pass needs a workspace of " + std::to_string(plan.workspace_bytes) +
           " bytes";
  }
  if (plan.algorithm != Algorithm::kFft) {
    return DirectPass(g, plan.pass, plan.direct, a, b, out, workspace, stream);
  }
  DeviceRunner run{stream, plan.fft_work_bytes, ""};
  RunFftPass(g, plan, a, b, out, static_cast<char*>(workspace), run);
  if (run.transform_failed) {
    // cuFFT failed at run time (e.g. no memory to re-create an evicted plan): the direct
    // kernels redo the whole pass, after whatever the FFT path had queued, and overwrite
    // every output it may have written.
    return DirectPass(g, plan.pass, plan.direct, a, b, out,
                      static_cast<char*>(workspace) + kFlagBytes, stream);
  }
  return run.error;
}

#define LARGECONV_INSTANTIATE(T)                                                           \
  template std::string RunCudaPass<T>(const ConvGeometry&, const CudaPlan&, const T*,     \
                                      const T*, T*, void*, Stream);
LARGECONV_INSTANTIATE(float)
LARGECONV_INSTANTIATE(double)
LARGECONV_INSTANTIATE(f16)
LARGECONV_INSTANTIATE(bf16)
#undef LARGECONV_INSTANTIATE

}  // namespace cuda
}  // namespace largeconv
