// Host emulation of the CUDA tile kernels (tiles.h): every phase of a block runs for each of
// its threads before the next phase starts, which is what __syncthreads() guarantees on the
// device. Shared memory is refilled with NaN before every load phase and guarded by NaN on
// both sides, so a read of anything the block did not load in that step poisons the result.
// Used by the tests to check the device index arithmetic on machines without a GPU.
#ifndef TF_LARGECONV_CORE_CUDA_EMULATE_H_
#define TF_LARGECONV_CORE_CUDA_EMULATE_H_

#include <algorithm>
#include <limits>
#include <vector>

#include "cc/core/cuda/tiles.h"

namespace largeconv {
namespace cuda {

struct HostEmulator {
  template <class K>
  void Tiles(const typename K::Params& p) {
    using A = typename K::A;
    constexpr int64_t kGuard = 1 << 14;
    const int threads = static_cast<int>(p.c.threads());
    std::vector<A> smem(static_cast<size_t>(p.c.smem_elems + 2 * kGuard));
    A* shared = smem.data() + kGuard;
    std::vector<A> acc(static_cast<size_t>(threads) * K::kAcc);
    for (int64_t b = 0; b < p.c.blocks; ++b) {
      const typename K::Block k = K::Decode(p, b);
      std::fill(acc.begin(), acc.end(), A(0));
      const int64_t steps = K::Steps(p, k);
      for (int64_t s = 0; s < steps; ++s) {
        std::fill(smem.begin(), smem.end(), std::numeric_limits<A>::quiet_NaN());
        for (int t = 0; t < threads; ++t) K::LoadTile(p, k, s, t, threads, shared);
        for (int t = 0; t < threads; ++t) K::Accumulate(p, k, s, t, shared, &acc[t * K::kAcc]);
      }
      for (int t = 0; t < threads; ++t) K::StoreResult(p, k, t, &acc[t * K::kAcc]);
    }
  }
  template <class K>
  void Reduce(const typename K::Params& p, int64_t count) {
    for (int64_t i = 0; i < count; ++i) K::Reduce(p, i);
  }
};

// Runs a pass through the emulated device kernels, with the configuration the device
// launcher would use. Operands in RunPass's order.
template <typename T>
void EmulateTilesPass(const ConvGeometry& g, ConvPass pass, const T* a, const T* b, T* out,
                      int64_t workspace_limit) {
  const TileConfig c = MakeTileConfig(g, pass, sizeof(AccT<T>), workspace_limit);
  std::vector<AccT<T>> partials(static_cast<size_t>(c.workspace_bytes / sizeof(AccT<T>)));
  HostEmulator run;
  DispatchTiles(g, pass, c, a, b, out, partials.data(), run);
}

}  // namespace cuda
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CUDA_EMULATE_H_
