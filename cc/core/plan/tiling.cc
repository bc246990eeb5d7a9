// Overlap-save tiling of the FFT passes and the transform sizes they may use (tiling.h).
#include "cc/core/plan/tiling.h"

#include <algorithm>
#include <array>
#include <string>
#include <vector>

namespace largeconv {
namespace {

// Whether one transform of size f computes the wanted outputs [0, dense) of the correlation
// out[p] = sum_k src[p + off + k] kern[k] (k < ke, src non-zero only in [src_lo, src_hi))
// exactly despite wrapping around. Non-zero outputs lie in [u0, u1); with the whole source
// in the transform from src_lo on, output p lands at p - shift modulo f (shift = src_lo -
// off), and no unwanted non-zero output lands on a wanted one when f >= u1 and
// f >= dense - u0.
bool WrapFits(int64_t f, int64_t ke, int64_t dense, int64_t off, int64_t src_lo, int64_t src_hi,
              int64_t* shift) {
  const int64_t u0 = src_lo - off - ke + 1, u1 = src_hi - off;
  const int64_t lo = std::min<int64_t>(0, u0), hi = std::max<int64_t>(dense, u1);
  if (std::max({hi, dense - lo, src_hi - src_lo}) > f) return false;
  *shift = src_lo - off;
  return true;
}

// One dimension of a tiling: overlap-save tiles of f - ke + 1 outputs, or (wrap allowed)
// a single wrap-around tile when WrapFits.
bool TileDim(int64_t f, int64_t ke, int64_t dense, bool wrap, int64_t off, int64_t src_lo,
             int64_t src_hi, int64_t* tile, int64_t* tiles, int64_t* shift) {
  if (f < ke) return false;
  *shift = 0;
  *tile = f - ke + 1;
  *tiles = CeilDiv(dense, *tile);
  if (wrap && *tiles > 1 && WrapFits(f, ke, dense, off, src_lo, src_hi, shift)) {
    *tile = dense;
    *tiles = 1;
  }
  return true;
}

// Backprop-filter as a correlation of the input with out_backprop: lags k < ke are the
// outputs, out_backprop (dense positions) the kernel. One wrap-around tile covers all of
// out_backprop when WrapFits with those roles.
void FilterWrapDim(int64_t f, int64_t ke, int64_t dense, int64_t pad, int64_t in, int64_t* tile,
                   int64_t* tiles, int64_t* shift) {
  if (*tiles > 1 && WrapFits(f, dense, ke, -pad, 0, in, shift)) {
    *tile = dense;
    *tiles = 1;
  }
}

}  // namespace

bool MakeFftTiling(const ConvGeometry& g, ConvPass pass, int64_t fft_h, int64_t fft_w,
                   FftTiling* t) {
  const int64_t keh = DilatedExtent(g.filter_h, g.dilation_h),
                kew = DilatedExtent(g.filter_w, g.dilation_w);
  const int64_t out_dense_h = g.out_h > 0 ? (g.out_h - 1) * g.stride_h + 1 : 0;
  const int64_t out_dense_w = g.out_w > 0 ? (g.out_w - 1) * g.stride_w + 1 : 0;
  // The tiling follows the tensor the pass writes: the input (a correlation with the
  // flipped filter), the output, or the filter (lags of a correlation of the two images).
  const ConvTensor result = RolesOf(pass).out;
  if (result == ConvTensor::kInput) {
    t->dense_h = g.in_h;
    t->dense_w = g.in_w;
    return TileDim(fft_h, keh, t->dense_h, true, g.pad_top - keh + 1, 0, out_dense_h, &t->tile_h,
                   &t->tiles_h, &t->shift_h) &&
           TileDim(fft_w, kew, t->dense_w, true, g.pad_left - kew + 1, 0, out_dense_w, &t->tile_w,
                   &t->tiles_w, &t->shift_w);
  }
  t->dense_h = out_dense_h;
  t->dense_w = out_dense_w;
  const bool forward = result == ConvTensor::kOutput;
  if (!TileDim(fft_h, keh, t->dense_h, forward, -g.pad_top, 0, g.in_h, &t->tile_h, &t->tiles_h,
               &t->shift_h) ||
      !TileDim(fft_w, kew, t->dense_w, forward, -g.pad_left, 0, g.in_w, &t->tile_w, &t->tiles_w,
               &t->shift_w)) {
    return false;
  }
  if (!forward) {
    FilterWrapDim(fft_h, keh, t->dense_h, g.pad_top, g.in_h, &t->tile_h, &t->tiles_h, &t->shift_h);
    FilterWrapDim(fft_w, kew, t->dense_w, g.pad_left, g.in_w, &t->tile_w, &t->tiles_w, &t->shift_w);
  }
  return true;
}

std::vector<int64_t> SmoothSizes(int64_t lo, int64_t hi) {
  hi = std::max(hi, lo);
  const int64_t top = 2 * hi + 8;
  std::vector<int64_t> all;
  for (int64_t a = 1; a <= top; a *= 2) {
    for (int64_t b = a; b <= top; b *= 3) {
      for (int64_t c = b; c <= top; c *= 5) {
        for (int64_t d = c; d <= top; d *= 7) all.push_back(d);
      }
    }
  }
  std::sort(all.begin(), all.end());
  std::vector<int64_t> out;
  for (int64_t v : all) {
    if (v < lo) continue;
    out.push_back(v);
    if (v >= hi) break;
  }
  return out;
}

// The longest transform a 1-D geometry (what conv1d makes: one filter row, one dense row)
// may use, when the transforms may have height 1 (min_side 1: the CPU planner, and the GPU
// planner for 1-D geometries, whose height-1 transforms are rank-1 cuFFT plans). Its
// transforms are then single rows of height exactly 1, so a side of 4096 would leave a
// 4095-tap filter 2 outputs per transform; a row of up to 2^20 points (4 MiB in float) has
// the area of a 1024 x 1024 tile and lets filters of 65,536 taps and more run with large
// tiles. The workspace limit still bounds every configuration (the planners' fit).
constexpr int64_t kMaxFftWidth1d = int64_t{1} << 20;

bool FftSizeCandidates(const ConvGeometry& g, ConvPass pass, int64_t min_side,
                       std::vector<int64_t>* heights, std::vector<int64_t>* widths) {
  const int64_t keh = DilatedExtent(g.filter_h, g.dilation_h),
                kew = DilatedExtent(g.filter_w, g.dilation_w);
  FftTiling probe;
  if (!MakeFftTiling(g, pass, keh, kew, &probe) || probe.dense_h <= 0 || probe.dense_w <= 0) {
    return false;
  }
  const bool one_d = keh == 1 && probe.dense_h == 1 && min_side <= 1;
  const int64_t max_w = one_d ? kMaxFftWidth1d : kMaxFftSide;
  if (keh > kMaxFftSide || kew > max_w) return false;
  *heights = SmoothSizes(std::max(keh, min_side), std::min(kMaxFftSide, probe.dense_h + keh - 1));
  *widths = SmoothSizes(std::max(kew, min_side), std::min(max_w, probe.dense_w + kew - 1));
  return true;
}

// --- Three spatial dimensions ---------------------------------------------------------------

Dims3 DilatedExtents(const Conv3dGeometry& g) {
  Dims3 e;
  for (int i = 0; i < kSpatial3d; ++i) e[i] = DilatedExtent(g.filter[i], g.dilation[i]);
  return e;
}

namespace {

// The dense positions a pass tiles: the input's for backprop-input (the tensor it writes),
// otherwise out_backprop's or the output's stride-1 positions.
Dims3 DenseOf(const Conv3dGeometry& g, ConvPass pass) {
  Dims3 d;
  for (int i = 0; i < kSpatial3d; ++i) {
    d[i] = RolesOf(pass).out == ConvTensor::kInput ? g.in[i]
           : g.out[i] > 0                          ? (g.out[i] - 1) * g.stride[i] + 1
                                                   : 0;
  }
  return d;
}

}  // namespace

bool MakeFftTiling(const Conv3dGeometry& g, ConvPass pass, const Dims3& fft, Fft3dTiling* t) {
  const Dims3 ke = DilatedExtents(g);
  t->dense = DenseOf(g, pass);
  for (int i = 0; i < kSpatial3d; ++i) {
    if (fft[i] < ke[i]) return false;
    t->tile[i] = fft[i] - ke[i] + 1;
    t->tiles[i] = CeilDiv(t->dense[i], t->tile[i]);
  }
  return true;
}

bool FftSizeCandidates(const Conv3dGeometry& g, ConvPass pass,
                       std::array<std::vector<int64_t>, kSpatial3d>* sizes) {
  if (g.no_products()) return false;
  const Dims3 ke = DilatedExtents(g), dense = DenseOf(g, pass);
  for (int i = 0; i < kSpatial3d; ++i) {
    if (dense[i] <= 0 || ke[i] > kMaxFftSide3d) return false;
    (*sizes)[i] = SmoothSizes(ke[i], std::min(kMaxFftSide3d, dense[i] + ke[i] - 1));
  }
  return true;
}

Status FftUnavailable(int64_t limit, int64_t min_bytes, ConvPass pass) {
  if (min_bytes < 0) return InvalidArgument("algorithm='fft' is not available for this geometry");
  return InvalidArgument("workspace_limit " + std::to_string(limit) +
                         " bytes is too small for the FFT algorithm: it needs at least " +
                         std::to_string(min_bytes) + " bytes for this " + PassName(pass) + " pass");
}

}  // namespace largeconv
