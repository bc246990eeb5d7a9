// Overlap-save tiling of the FFT passes and the transform sizes the planners try, in two
// dimensions and three: what the CPU's FFT kernels (cpu/fft.cc, cpu/fft3d.cc), the CUDA
// FFT path (cuda/fft_pipeline.h) and both planners (plan/cpu_fft.cc, cuda/fft_plan.cc)
// share about how a pass is cut into tiles. No transform library here, so every build
// links it (tiling.cc).
#ifndef TF_LARGECONV_CORE_PLAN_TILING_H_
#define TF_LARGECONV_CORE_PLAN_TILING_H_

#include <array>
#include <cstdint>
#include <vector>

#include "cc/core/common/geometry.h"
#include "cc/core/common/status.h"
#include "cc/core/common/vocabulary.h"

namespace largeconv {

// The tiling a transform size implies for a pass: `tile_*` dense positions per tile and
// the number of tiles per image. Returns false if the transform is smaller than the
// (dilated) filter.
// shift_* is set when one tile covers the whole dimension by wrapping around: the transform
// then holds the whole source from its first non-zero position, and output p sits at
// position p - shift modulo the transform size. That is exact whenever no unwanted output
// of the correlation aliases onto a wanted one, which needs far less than overlap-save's
// output + filter - 1 (e.g. a VALID backprop-input fits the input's own size, a SAME
// forward the input plus half the filter).
struct FftTiling {
  int64_t dense_h = 0, dense_w = 0;  // stride-1 positions the pass produces or consumes
  int64_t tile_h = 0, tile_w = 0;
  int64_t tiles_h = 0, tiles_w = 0;
  int64_t shift_h = 0, shift_w = 0;
};
bool MakeFftTiling(const ConvGeometry& g, ConvPass pass, int64_t fft_h, int64_t fft_w,
                   FftTiling* t);

// The largest transform side either FFT path considers.
constexpr int64_t kMaxFftSide = 4096;

// Transform sizes in [lo, hi] whose only prime factors are 2, 3, 5 and 7, in increasing
// order, plus the first such size above hi (so one tile covering everything is always a
// candidate).
std::vector<int64_t> SmoothSizes(int64_t lo, int64_t hi);

// The transform sizes the planners (CPU and GPU) try for a pass: smooth sizes from the
// dilated filter (and at least min_side) up to one tile covering everything, per dimension.
// False when the FFT cannot run the pass (nothing to compute, or a filter beyond
// kMaxFftSide).
bool FftSizeCandidates(const ConvGeometry& g, ConvPass pass, int64_t min_side,
                       std::vector<int64_t>* heights, std::vector<int64_t>* widths);

// The planners' refusal of an explicit FFT request: min_bytes is the smallest workspace any
// candidate needed (< 0 when there was no candidate at all).
Status FftUnavailable(int64_t limit, int64_t min_bytes, ConvPass pass);

// --- Three spatial dimensions ---------------------------------------------------------------
//
// In each dimension a tile keeps fft - (dilated filter) + 1 dense positions, as the 2-D
// tiling does, without the wrap-around single tiles.

struct Fft3dTiling {
  Dims3 dense{}, tile{}, tiles{};
  int64_t count() const { return Volume(tiles); }
};
// The dilated filter's extent in each dimension.
Dims3 DilatedExtents(const Conv3dGeometry& g);

// False when the transform is smaller than the dilated filter in some dimension.
bool MakeFftTiling(const Conv3dGeometry& g, ConvPass pass, const Dims3& fft, Fft3dTiling* t);

// The largest transform side the 3-D FFT considers (a 512^3 float transform is 512 MiB).
constexpr int64_t kMaxFftSide3d = 512;

// Per dimension, the transform sizes the planner tries (SmoothSizes from the dilated
// filter up to one tile covering everything). False when the FFT cannot run the pass.
bool FftSizeCandidates(const Conv3dGeometry& g, ConvPass pass,
                       std::array<std::vector<int64_t>, kSpatial3d>* sizes);

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_PLAN_TILING_H_
