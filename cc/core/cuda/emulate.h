// Host emulation of the CUDA tile kernels (tiles.h): every phase of a block runs for each of
// its threads before the next phase starts, which is what __syncthreads() guarantees on the
// device. Shared memory is refilled with NaN before every load phase and guarded by NaN on
// both sides, so a read of anything the block did not load in that step poisons the result.
// Used by the tests to check the device index arithmetic on machines without a GPU.
// The FFT path (fft_pipeline.h) runs here too, its element kernels as loops and its
// transforms through DUCC with cuFFT's in-place layout, in a workspace filled with NaN.
#ifndef TF_LARGECONV_CORE_CUDA_EMULATE_H_
#define TF_LARGECONV_CORE_CUDA_EMULATE_H_

#include <algorithm>
#include <complex>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "cc/core/common/ducc.h"
#include "cc/core/cuda/algorithms.h"
#include "cc/core/cuda/fft_pipeline.h"
#include "cc/core/cuda/fft_plan.h"
#include "cc/core/cuda/tiles.h"

namespace largeconv {
namespace cuda {

struct HostEmulator {
  const int* gate = nullptr;  // when set, nothing runs unless *gate != 0

  template <class K>
  void Tiles(const typename K::Params& p) {
    using A = typename K::A;
    if (gate != nullptr && *gate == 0) return;
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
    if (gate != nullptr && *gate == 0) return;
    for (int64_t i = 0; i < count; ++i) K::Reduce(p, i);
  }
};

// The runner of the GPU's algorithms (algorithms.h) on the host. Transforms are in place as
// cuFFT's are: real planes
// with rows padded to 2 (fft_w / 2 + 1), spectra in the same bytes. After a complex-to-real
// transform the padding columns (which cuFFT leaves undefined) are set to NaN.
struct HostFftRunner {
  // Few, so that the row kernels' lanes take several columns each on the tests' small
  // shapes, as they do on the device's large launches (fft_pipeline.h, RowLanes).
  static constexpr int64_t kRowThreads = 64;
  template <class F>
  void ForEach(int64_t count, const F& f) {
    if (count < kNarrowCount) {  // the index type the device would use
      for (int32_t i = 0; i < static_cast<int32_t>(count); ++i) f(i);
    } else {
      for (int64_t i = 0; i < count; ++i) f(i);
    }
  }
  void Transform(const TransformShape& s, void* data, void*) {
    if (s.real_bytes == 8) {
      Run(s, static_cast<double*>(data));
    } else {
      Run(s, static_cast<float*>(data));
    }
  }
  template <typename T, class Geometry>
  void Direct(const Geometry& g, ConvPass pass, const TileConfig& config, const T* a, const T* b,
              T* out, void* workspace, const int* gate) {
    HostEmulator run{gate};
    DispatchTiles(g, pass, config, a, b, out, workspace, run);
  }

 private:
  // Batches of fft_d x fft_h x fft_w volumes (planes when fft_d is 1: the depth axis, of
  // length 1, is then not transformed).
  template <typename R>
  static void Run(const TransformShape& s, R* data) {
    const size_t n = s.batch, d = s.fft_d, h = s.fft_h, w = s.fft_w, hw = w / 2 + 1, pitch = 2 * hw;
    const ptrdiff_t slice = h * pitch, plane = d * slice;
    const std::vector<size_t> axes =
        d > 1 ? std::vector<size_t>{1, 2, 3} : std::vector<size_t>{2, 3};
    std::vector<std::complex<R>> spec(n * d * h * hw);
    if (!s.inverse) {
      ducc0::cfmav<R> in(data, {n, d, h, w}, {plane, slice, ptrdiff_t(pitch), 1});
      ducc0::vfmav<std::complex<R>> out(spec.data(), {n, d, h, hw});
      ducc0::r2c(in, out, axes, true, R(1), 1);
      std::memcpy(static_cast<void*>(data), spec.data(), spec.size() * sizeof(spec[0]));
      return;
    }
    std::memcpy(static_cast<void*>(spec.data()), data, spec.size() * sizeof(spec[0]));
    ducc0::vfmav<std::complex<R>> in(spec.data(), {n, d, h, hw});
    ducc0::vfmav<R> out(data, {n, d, h, w}, {plane, slice, ptrdiff_t(pitch), 1});
    ducc0::c2r_mut(in, out, axes, false, R(1), 1);
    for (size_t i = 0; i < n * d * h; ++i) {
      std::fill(data + i * pitch + w, data + (i + 1) * pitch, std::numeric_limits<R>::quiet_NaN());
    }
  }
};

// Plans a pass as the device does, with the emulation's transforms (no work area), or
// with `work_area` standing for cuFFT's where given. Geometry: ConvGeometry or
// Conv3dGeometry, here and below.
template <class Geometry>
Status PlanEmulatedPass(const Geometry& g, ConvPass pass, Algorithm algorithm, int real_bytes,
                        int64_t workspace_limit, CudaPlan* plan,
                        const WorkBytesFn* work_area = nullptr) {
  const WorkBytesFn none = [](const TransformShape&, Status*) -> int64_t { return 0; };
  return PlanGpuPass(g, pass, algorithm, real_bytes, workspace_limit,
                     work_area != nullptr ? work_area : &none, "", plan);
}

// Plans a pass as the device does and runs it through the emulated kernels: algorithm
// kAutoAlgorithm, kGpuDirect or kGpuFft. Returns OK or the planner's error.
template <typename T, class Geometry>
Status EmulateCudaPass(const Geometry& g, ConvPass pass, Algorithm algorithm, const T* a,
                       const T* b, T* out, int64_t workspace_limit) {
  CudaPlan plan;
  LC_RETURN_IF_ERROR(
      PlanEmulatedPass(g, pass, algorithm, kComputeBytes<T>, workspace_limit, &plan));
  if (g.no_products()) {  // as RunCudaPass: zeros, or nothing at all
    std::fill_n(out, g.elements(RolesOf(pass).out), T{});
    return OkStatus();
  }
  // All bits set: a NaN in float and in double, so a read of anything never written shows.
  std::vector<double> ws(static_cast<size_t>(plan.workspace_bytes + 7) / 8 + 1);
  std::memset(ws.data(), 0xff, ws.size() * sizeof(double));
  char* workspace = reinterpret_cast<char*>(ws.data());
  HostFftRunner run;
  RunListed(GpuAlgorithms{}, g, plan, a, b, out, workspace, run);
  return OkStatus();
}

}  // namespace cuda
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CUDA_EMULATE_H_
