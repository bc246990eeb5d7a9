// FFT overlap-save convolution on the CPU (DUCC0 transforms): forward, backprop-input and
// backprop-filter. Every temporary lives in one caller-provided workspace whose size is
// FftWorkspaceBytes(); nothing here allocates in proportion to the tensors, except the
// filter spectra the forward and backprop-input passes keep for the next call, within the
// budget spectrum_cache.h describes.
#ifndef TF_LARGECONV_CORE_CPU_FFT_H_
#define TF_LARGECONV_CORE_CPU_FFT_H_

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cc/core/common/geometry.h"
#include "cc/core/common/parallel.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cpu/isa.h"
#include "cc/core/plan/tiling.h"

namespace largeconv {

// How a pass is cut up. fft_h x fft_w is the transform (tile plus filter halo).
//  forward:         out_block = output channels whose filter spectra are held at once;
//                   when it is the whole group, group_block groups are held at once (many
//                   small groups, as in depthwise convolution, then run as one batch).
//  backprop-input:  out_block / group_block likewise, for input channels.
// vec_block (with group_block > 1) = groups a slot transforms in one batched call, which
// amortises per-transform overhead and reads channel-interleaved (NHWC) data in runs;
// with one group (forward and backprop-input), consecutive tiles of the batch a slot
// takes as one item: rows of height 1 (conv1d) transform 3-4x faster 8 at a time, which
// DUCC vectorises across, and the products read each filter value once per run, which
// the planner counts (2-D passes run tiles where a block's filter spectra outgrow the
// cache).
//  backprop-filter: a work unit accumulates in_block x out_block (input, output) channel
//                   pairs of filter gradient spectra; vec_block = groups a unit takes at once
//                   (whole groups), or with one group, the tiles of a sweep: the unit
//                   transforms vec_block tiles of its channels, then adds their products to
//                   the accumulators, which are read and written once per sweep.
// slots = workers that run at once, each with its own buffers.
// The most source channels whose spectra a slot holds at once in the forward and
// input-gradient passes (their in_block): their products with the filter spectra then run
// a block of bins at a time over all of them (fft_products.h), so a destination spectrum
// is read and written once per block of sources, not once per source. Sixteen take the
// accumulators' traffic down to a sixteenth; the split-plane products kernel (MacSplit)
// keeps a block's sources on the stack.
constexpr int64_t kSourceBlock = 16;

struct FftConfig {
  int64_t fft_h = 0, fft_w = 0;
  FftTiling tiling{};  // what fft_h x fft_w implies (MakeFftTiling), set by the planner
  int64_t in_block = 1, out_block = 1;
  int64_t group_block = 1;
  int64_t vec_block = 1;
  int64_t slots = 1;
  // Not the planner's: whether the call may keep its filter spectra for later calls
  // (spectrum_cache.h; the op's keep_memory attribute). Either way it uses spectra an
  // earlier call kept.
  bool keep_spectra = true;
};

// Exact workspace bytes of a pass for a given config and real type size (4 for float,
// f16 and bf16, which compute in float; 8 for double).
int64_t FftWorkspaceBytes(const ConvGeometry& g, ConvPass pass, const FftConfig& c, int real_bytes);

// Whether a configuration batches tiles (not groups): one group and vec_block > 1 (see
// FftConfig).
inline bool BatchesTiles(const ConvGeometry& g, const FftConfig& c) {
  return g.groups == 1 && c.vec_block > 1;
}

// Many channels' spectral products as matrix products (cpu/fft_gemm.h) run at the
// instruction-set levels where they were measured faster than the hand-blocked kernels
// (docs/benchmarks.md): the forward and backprop-input passes' with FMA (AVX2 and
// AVX-512; at AVX they were level), the filter gradient's at AVX-512 (at AVX2 level).
constexpr CpuIsa kGemmLevels[] = {CpuIsa::kAvx2, CpuIsa::kAvx512};
constexpr CpuIsa kGemmFilterLevels[] = {CpuIsa::kAvx512};
inline bool GemmAtLevel(CpuIsa level, ConvPass pass) {
  const auto listed = [level](const auto& levels) {
    for (const CpuIsa l : levels) {
      if (l == level) return true;
    }
    return false;
  };
  return WritesFilter(pass) ? listed(kGemmFilterLevels) : listed(kGemmLevels);
}

// Where a pass's spectral products are matrix products: from kGemmChannels source and
// destination channels per group (input and output channels, for the filter gradient),
// both, over at least kGemmTiles tiles (images x tiles per image). The forward and
// backprop-input passes also need more filter spectra than kGemmFilterValues complex
// values (8 MiB of float: beyond the cache, where the planner runs tiles in runs, each a
// product's columns); the filter gradient, one group and sweeps of kGemmSweep tiles (the
// depth of its products, which the planner fixes whatever the thread count: cpu_fft.cc).
// Measured (docs/benchmarks.md): 64 x 64 channels over 64 tiles gain with the matrix
// products, over 4 tiles (one 160 x 160 transform per image, k63c64_forward) they lose,
// and fewer channels keep the hand-blocked kernels (fft_shared.h's MacSplit, MacSources,
// MacSweep).
constexpr int64_t kGemmChannels = 64, kGemmTiles = 16, kGemmFilterValues = 1 << 20;
constexpr int64_t kGemmSweep = 8;

// Whether a pass's products are matrix products at instruction-set level `level`: from the
// level, the geometry and the transform's size and tiling, and for the filter gradient the
// sweep, none of which follow the thread count, so every thread count computes the same
// sums the same way.
inline bool UsesGemmAt(CpuIsa level, const ConvGeometry& g, ConvPass pass, const FftConfig& c) {
  if (!GemmAtLevel(level, pass)) return false;
  const int64_t tiles = g.batch * c.tiling.tiles_h * c.tiling.tiles_w;
  if (WritesFilter(pass)) {
    return g.groups == 1 && g.in_c_per_group() >= kGemmChannels &&
           g.out_c_per_group() >= kGemmChannels && tiles >= kGemmTiles && c.vec_block == kGemmSweep;
  }
  const PassChannels ch = g.channels(pass);
  const int64_t filter_values =
      g.groups * ch.src_per_group * ch.dst_per_group * c.fft_h * (c.fft_w / 2 + 1);
  return ch.src_per_group >= kGemmChannels && ch.dst_per_group >= kGemmChannels &&
         tiles >= kGemmTiles && filter_values > kGemmFilterValues;
}
// The same at the level the kernels run (ActiveCpuIsa): what the planner, the workspace
// layout and the kernels ask.
inline bool UsesGemm(const ConvGeometry& g, ConvPass pass, const FftConfig& c) {
  return UsesGemmAt(ActiveCpuIsa().level, g, pass, c);
}

// Number of real transforms (each fft_h x fft_w) a pass performs; the planner's cost model.
double FftTransformCount(const ConvGeometry& g, ConvPass pass, const FftConfig& c);
// Their points: those of FftTransformCount's, less what strides take out of the transforms
// of zero-stuffed tiles and strided outputs, which shrink by the stride in each dimension
// whose side it divides (fft_decimation.h, PassDecimation).
double FftTransformPoints(const ConvGeometry& g, ConvPass pass, const FftConfig& c);

// The count both dimensionalities share: `tiles` (images x tiles x groups) each transform a
// block's source channels and inverse its destination channels, and every channel pair's
// filter is transformed once (forward, backprop-input: out_block destination channels at
// a time; backprop-filter: in_block x out_block pairs at a time). The transforms of
// out_backprop (the gradients') or of the output (forward) count `strided` each (a share
// of a full transform's points; 1 for a count of transforms).
double TransformCountOf(ConvPass pass, double tiles, int64_t groups, int64_t icpg, int64_t ocpg,
                        int64_t in_block, int64_t out_block, double strided = 1.0);
// The filter transforms among them: one per channel pair, whatever the blocks.
inline double FilterTransformCount(int64_t groups, int64_t icpg, int64_t ocpg) {
  return static_cast<double>(groups) * icpg * ocpg;
}

// Complex values of every channel pair's filter spectrum of a forward or backprop-input
// pass: what the spectrum cache (spectrum_cache.h) keeps of a filter, besides its copy.
int64_t KeptSpectraValues(const ConvGeometry& g, ConvPass pass, const FftConfig& c);

// Runs `pass` by overlap-save transforms as `c` cuts it up (operands in the pass's order,
// as DirectPass takes them). `workspace` must hold FftWorkspaceBytes(g, pass, c,
// sizeof(real)) bytes, 64-byte aligned.
template <typename T>
void FftPass(const ConvGeometry& g, ConvPass pass, const FftConfig& c, const T* a, const T* b,
             T* out, void* workspace, const ParallelFor& pf);

// True when no element is Inf or NaN. A transform spreads a non-finite input over its whole
// tile (Inf - Inf = NaN), so callers take the direct path for such inputs, which propagates
// them exactly as a direct sum (and TensorFlow) does.
template <typename T>
bool AllFinite(const T* p, int64_t n, const ParallelFor& pf);

// --- Three spatial dimensions (fft3d.cc) ---------------------------------------------------
//
// Overlap-save over volumes with 3-D real transforms, tiled by plan/tiling.h.

// How a 3-D pass is cut up. forward / backprop-input: out_block destination channels of a
// group whose filter spectra are held at once; backprop-filter: units of in_block x
// out_block channel pairs. slots: workers that run at once, each with its own buffers.
struct Fft3dConfig {
  Dims3 fft{};
  Fft3dTiling tiling{};
  int64_t in_block = 1, out_block = 1;
  int64_t slots = 1;
};

// Exact workspace bytes, the one formula the planner and the kernels share.
int64_t FftWorkspaceBytes(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c,
                          int real_bytes);
double FftTransformCount(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c);

template <typename T>
void FftPass(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c, const T* a, const T* b,
             T* out, void* workspace, const ParallelFor& pf);

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CPU_FFT_H_
