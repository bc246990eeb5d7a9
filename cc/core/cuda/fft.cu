// Device driver of the FFT path (fft_pipeline.h): element kernels as grid-strided launches,
// transforms through cuFFT (cufft.h), the exact redo through the gated direct kernels. Also
// the planner and runner entry points of launch.h: a plan runs through the GPU's algorithms
// (algorithms.h) with the device's runner.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "cc/core/cuda/algorithms.h"
#include "cc/core/cuda/cuda_status.h"
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
  // About one wave of resident threads on an H100 or H200 (132 SMs x 2048).
  static constexpr int64_t kRowThreads = int64_t{1} << 18;
  cudaStream_t stream;
  int64_t work_bytes;  // cuFFT's work area as planned
  Status error;
  bool transform_failed = false;

  template <class F>
  void ForEach(int64_t count, const F& f) {
    if (!error.ok() || count <= 0) return;
    const int64_t blocks = std::min((count + kThreads - 1) / kThreads, kMaxBlocks);
    if (count < kNarrowCount) {
      ForEachKernel<F, int32_t>
          <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(static_cast<int32_t>(count), f);
    } else {
      ForEachKernel<F, int64_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(count, f);
    }
    error = CudaStatus("CUDA kernel launch failed", cudaGetLastError());
  }
  void Transform(const TransformShape& s, void* data, void* work) {
    if (!error.ok()) return;
    error = CufftExecute(s, data, work, work_bytes, stream);
    transform_failed = !error.ok();
  }
  template <typename T, class Geometry>
  LC_RUN_INLINE void Direct(const Geometry& g, ConvPass pass, const TileConfig& config, const T* a,
                            const T* b, T* out, void* workspace, const int* gate) {
    if (error.ok()) error = DirectPass(g, pass, config, a, b, out, workspace, stream, gate);
  }
};

// Plans by everything they depend on: the geometry, the request and the device. Planning
// searches every transform size (milliseconds; in 3-D more), and a training loop or a
// benchmark asks for the same few geometries on every call. One cache per dimensionality.
template <class GeometryKey>
struct PlanCache {
  using Key = std::tuple<GeometryKey, ConvPass, Algorithm, int, int64_t, int>;
  std::mutex mu;
  std::map<Key, CudaPlan> plans;
};
constexpr size_t kMaxCachedPlans = 256;

// Every field of a Conv3dGeometry, as ConvGeometry::key() lists a 2-D one's.
using Conv3dKey = std::array<int64_t, 5 + 7 * kSpatial3d + 1>;
Conv3dKey KeyOf(const Conv3dGeometry& g) {
  Conv3dKey k{g.batch, g.in_c, g.filter_in_c, g.out_c, g.groups};
  size_t i = 5;
  for (const Dims3* d :
       {&g.in, &g.filter, &g.out, &g.stride, &g.dilation, &g.pad_before, &g.pad_after}) {
    for (int64_t v : *d) k[i++] = v;
  }
  k[i] = static_cast<int64_t>(g.data_format);
  return k;
}
ConvGeometry::Key KeyOf(const ConvGeometry& g) { return g.key(); }

template <class Geometry>
using CacheFor = PlanCache<decltype(KeyOf(std::declval<const Geometry&>()))>;

template <class Geometry>
CacheFor<Geometry>& Plans() {
  static auto* cache = new CacheFor<Geometry>();
  return *cache;
}

template <class Geometry>
Status PlanUncached(const Geometry& g, ConvPass pass, Algorithm algorithm, int real_bytes,
                    int64_t workspace_limit, CudaPlan* plan) {
  const std::string status = algorithm == kGpuDirect ? "" : CufftStatus();
  if (algorithm == kGpuDirect || !status.empty()) {
    return PlanGpuPass(g, pass, algorithm, real_bytes, workspace_limit, nullptr, status, plan);
  }
  const WorkBytesFn work = [](const TransformShape& s, Status* error) {
    return CufftWorkBytes(s, error);
  };
  return PlanGpuPass(g, pass, algorithm, real_bytes, workspace_limit, &work, "", plan);
}

template <class Geometry>
Status PlanCached(const Geometry& g, ConvPass pass, Algorithm algorithm, int real_bytes,
                  int64_t workspace_limit, CudaPlan* plan) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // no device: plan anyway (the direct kernels need none to plan)
    device = -1;
  }
  const typename CacheFor<Geometry>::Key key{KeyOf(g),        pass,  algorithm, real_bytes,
                                             workspace_limit, device};
  CacheFor<Geometry>& cache = Plans<Geometry>();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.plans.find(key);
    if (it != cache.plans.end()) {
      *plan = it->second;
      return OkStatus();
    }
  }
  LC_RETURN_IF_ERROR(PlanUncached(g, pass, algorithm, real_bytes, workspace_limit, plan));
  std::lock_guard<std::mutex> lock(cache.mu);
  if (cache.plans.size() >= kMaxCachedPlans) cache.plans.clear();
  cache.plans.emplace(key, *plan);
  return OkStatus();
}

// Inlined into RunCudaPass<T>, so that the direct kernels' driver is still called from the
// launch functions only (test_cuda_emulation reads the calls from the machine code).
template <typename T, class Geometry>
__attribute__((always_inline)) inline Status Run(const Geometry& g, const CudaPlan& plan,
                                                 const T* a, const T* b, T* out, void* workspace,
                                                 Stream stream) {
  if (g.no_products()) {  // zeros, or nothing at all; the tile kernels assume taps
    const size_t bytes = static_cast<size_t>(g.elements(RolesOf(plan.pass).out)) * sizeof(T);
    return CudaStatus("clearing the result", cudaMemsetAsync(out, 0, bytes, stream));
  }
  if (plan.workspace_bytes > 0 && workspace == nullptr) {
    return Internal("the planned pass needs a workspace of " +
                    std::to_string(plan.workspace_bytes) + " bytes");
  }
  DeviceRunner run{stream, plan.fft_work_bytes};
  RunListed(GpuAlgorithms{}, g, plan, a, b, out, static_cast<char*>(workspace), run);
  if (run.transform_failed) {
    // cuFFT failed at run time (e.g. no memory to re-create an evicted plan): the direct
    // kernels redo the whole pass, after whatever the FFT path had queued, and overwrite
    // every output it may have written.
    return DirectPass(g, plan.pass, plan.direct, a, b, out,
                      static_cast<char*>(workspace) + kFlagBytes, stream);
  }
  return run.error;
}

}  // namespace

Status PlanCudaPass(const ConvGeometry& g, ConvPass pass, Algorithm algorithm, int real_bytes,
                    int64_t workspace_limit, CudaPlan* plan) {
  return PlanCached(g, pass, algorithm, real_bytes, workspace_limit, plan);
}

Status PlanCudaPass(const Conv3dGeometry& g, ConvPass pass, Algorithm algorithm, int real_bytes,
                    int64_t workspace_limit, CudaPlan* plan) {
  return PlanCached(g, pass, algorithm, real_bytes, workspace_limit, plan);
}

template <typename T>
Status RunCudaPass(const ConvGeometry& g, const CudaPlan& plan, const T* a, const T* b, T* out,
                   void* workspace, Stream stream) {
  return Run(g, plan, a, b, out, workspace, stream);
}

template <typename T>
Status RunCudaPass(const Conv3dGeometry& g, const CudaPlan& plan, const T* a, const T* b, T* out,
                   void* workspace, Stream stream) {
  return Run(g, plan, a, b, out, workspace, stream);
}

#define LARGECONV_INSTANTIATE(T, NAME, TF_WORD)                                                  \
  template Status RunCudaPass<T>(const ConvGeometry&, const CudaPlan&, const T*, const T*, T*,   \
                                 void*, Stream);                                                 \
  template Status RunCudaPass<T>(const Conv3dGeometry&, const CudaPlan&, const T*, const T*, T*, \
                                 void*, Stream);
LARGECONV_FOR_EACH_FLOAT_DTYPE(LARGECONV_INSTANTIATE)
#undef LARGECONV_INSTANTIATE

}  // namespace cuda
}  // namespace largeconv
