// Device drivers of the direct tile kernels (tiles.h): one CUDA block per logical block
// (grid-strided), phases separated by __syncthreads(), shared memory sized by the config.
#include <cuda_runtime.h>

#include <algorithm>

#include "cc/core/cuda/cuda_status.h"
#include "cc/core/cuda/launch.h"
#include "cc/core/cuda/tiles.h"

namespace largeconv {
namespace cuda {
namespace {

constexpr int64_t kMaxGrid = int64_t{1} << 30;
// Grid of a gated launch: blocks stride over the work (as always), so this only bounds what
// a closed gate costs (every block starts, reads the flag and leaves).
constexpr int64_t kGatedGrid = 4096;

// `gate`: when set, the kernel does nothing unless *gate != 0 (see RunFftPass).
template <class K>
__global__ void __launch_bounds__(256) TileKernel(const typename K::Params p, const int* gate) {
  using A = typename K::A;
  if (gate != nullptr && *gate == 0) return;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  A* smem = reinterpret_cast<A*>(shared_raw);
  const int tid = static_cast<int>(threadIdx.x), threads = static_cast<int>(blockDim.x);
  for (int64_t b = blockIdx.x; b < p.c.blocks; b += gridDim.x) {
    const typename K::Block k = K::Decode(p, b);
    A acc[K::kAcc];
    for (int i = 0; i < K::kAcc; ++i) acc[i] = A(0);
    const int64_t steps = K::Steps(p, k);
    for (int64_t s = 0; s < steps; ++s) {
      K::LoadTile(p, k, s, tid, threads, smem);
      __syncthreads();
      K::Accumulate(p, k, s, tid, smem, acc);
      __syncthreads();
    }
    K::StoreResult(p, k, tid, acc);
  }
}

template <class K>
__global__ void ReduceKernel(const typename K::Params p, int64_t count, const int* gate) {
  if (gate != nullptr && *gate == 0) return;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += step) {
    K::Reduce(p, i);
  }
}

struct DeviceLauncher {
  cudaStream_t stream;
  const int* gate;
  cudaError_t error = cudaSuccess;

  template <class K>
  void Tiles(const typename K::Params& p) {
    if (error != cudaSuccess || p.c.blocks == 0) return;
    const unsigned grid =
        static_cast<unsigned>(std::min(p.c.blocks, gate != nullptr ? kGatedGrid : kMaxGrid));
    const size_t smem = static_cast<size_t>(p.c.smem_elems) * sizeof(typename K::A);
    TileKernel<K><<<grid, static_cast<unsigned>(p.c.threads()), smem, stream>>>(p, gate);
    error = cudaGetLastError();
  }
  template <class K>
  void Reduce(const typename K::Params& p, int64_t count) {
    if (error != cudaSuccess || count == 0) return;
    const unsigned grid = static_cast<unsigned>(
        std::min<int64_t>((count + 255) / 256, gate != nullptr ? kGatedGrid : kMaxGrid));
    ReduceKernel<K><<<grid, 256, 0, stream>>>(p, count, gate);
    error = cudaGetLastError();
  }
};

// Geometry: ConvGeometry or Conv3dGeometry.
template <typename T, class Geometry>
Status Launch(const Geometry& g, ConvPass pass, const TileConfig& c, const T* a, const T* b, T* out,
              void* workspace, Stream stream, const int* gate) {
  if (c.workspace_bytes > 0 && workspace == nullptr) {
    return Internal("the direct backprop-filter kernels need a workspace of " +
                    std::to_string(c.workspace_bytes) + " bytes");
  }
  DeviceLauncher run{stream, gate};
  DispatchTiles(g, pass, c, a, b, out, workspace, run);
  return CudaStatus("CUDA kernel launch failed", run.error);
}

}  // namespace

template <typename T>
Status DirectPass(const ConvGeometry& g, ConvPass pass, const TileConfig& c, const T* a, const T* b,
                  T* out, void* workspace, Stream stream, const int* gate) {
  return Launch(g, pass, c, a, b, out, workspace, stream, gate);
}

template <typename T>
Status DirectPass(const Conv3dGeometry& g, ConvPass pass, const TileConfig& c, const T* a,
                  const T* b, T* out, void* workspace, Stream stream, const int* gate) {
  return Launch(g, pass, c, a, b, out, workspace, stream, gate);
}

#define LARGECONV_INSTANTIATE(T, NAME, TF_WORD)                                               \
  template Status DirectPass<T>(const ConvGeometry&, ConvPass, const TileConfig&, const T*,   \
                                const T*, T*, void*, Stream, const int*);                     \
  template Status DirectPass<T>(const Conv3dGeometry&, ConvPass, const TileConfig&, const T*, \
                                const T*, T*, void*, Stream, const int*);
LARGECONV_FOR_EACH_FLOAT_DTYPE(LARGECONV_INSTANTIATE)
#undef LARGECONV_INSTANTIATE

}  // namespace cuda
}  // namespace largeconv
