// The outputs of the 2-D FFT's forward and backprop-input correlations (fft.cc): inverse
// transforms of the accumulated spectra and the store of their wanted positions.
#ifndef TF_LARGECONV_CORE_CPU_FFT_OUTPUTS_H_
#define TF_LARGECONV_CORE_CPU_FFT_OUTPUTS_H_

#include <algorithm>
#include <complex>
#include <cstdint>
#include <utility>

#include "cc/core/common/dtypes.h"
#include "cc/core/cpu/fft_correlation.h"
#include "cc/core/cpu/fft_decimation.h"
#include "cc/core/cpu/fft_layout.h"
#include "cc/core/cpu/fft_products.h"
#include "cc/core/cpu/isa.h"

namespace largeconv {
LARGECONV_ISA_BEGIN
namespace fft_internal {

// The outputs' stage of a correlation: each destination channel's spectra inverse-
// transformed (folded first where the forward pass's strides decimate them) and the
// wanted positions stored.
template <typename T>
struct CorrelationOutputs : CorrelationSources<T> {
  using R = typename CorrelationSources<T>::R;
  using C = typename CorrelationSources<T>::C;
  using Frame = typename CorrelationSources<T>::Frame;
  using Block = typename CorrelationSources<T>::Block;
  using Item = typename CorrelationSources<T>::Item;
  using CorrelationSources<T>::tiling;
  using CorrelationSources<T>::dst;
  using CorrelationSources<T>::TileOrigin;
  using CorrelationSources<T>::Residues;
  using CorrelationSources<T>::Accumulator;
  using CorrelationSources<T>::InPlace;
  using CorrelationSources<T>::OutputsDecimated;

  // Inverse-transforms each destination channel's spectra and stores the item's wanted
  // (strided) outputs.
  void StoreTile(const Frame& f, const Block& b, int64_t slot, const Item& it) const {
    int64_t rows = 0;  // the most any of the item's tiles keeps
    for (int64_t j = 0; j < (it.tiles ? it.planes : 1); ++j) {
      rows =
          std::max(rows, std::min(tiling.tile_h, tiling.dense_h - TileOrigin(it.tile_of(j)).first));
    }
    // The inverse transforms' size, and the rows of them wanted: with strided outputs in
    // the spectrum, each accumulator is first folded to the decimated size.
    const bool folded = OutputsDecimated(f);
    const int64_t th = folded ? f.dec.mh() : f.fh, tw = folded ? f.dec.mw() : f.fw;
    int64_t row0 = -tiling.shift_h;
    if (folded) {
      for (int64_t k = 0; k < b.out_count; ++k) {
        for (int64_t j = 0; j < it.planes; ++j) {
          const auto [residue_h, residue_w] = Residues(f, it.tile_of(j));
          C* acc = Accumulator(f, b, slot, k, j);
          C* scratch = reinterpret_cast<C*>(f.ws.real(slot));
          FoldStrided(f.dec, acc, scratch, residue_h, residue_w);
          std::copy_n(scratch, th * f.dec.bins_w(), acc);
        }
      }
      // Kept rows r of a tile (from the first, Mod(-p0, dh)) sit at decimated rows from
      // (r - shift - rho) / dh on; an item whose tiles start on different rows takes all.
      int64_t count = 0;
      bool same_start = true;
      for (int64_t j = 0; j < (it.tiles ? it.planes : 1); ++j) {
        const int64_t p0_h = TileOrigin(it.tile_of(j)).first;
        const int64_t first = Mod(-p0_h, f.dec.dh);
        const int64_t start =
            (Mod(first - tiling.shift_h, f.fh) - Residues(f, it.tile_of(j)).first) / f.dec.dh;
        same_start = same_start && (j == 0 || start == row0);
        row0 = start;
        count = std::max(count, CeilDiv(std::max<int64_t>(0, rows - first), f.dec.dh));
      }
      if (!same_start) {
        row0 = 0;
        count = th;
      }
      rows = std::min(count, th);
    }
    if (InPlace(it)) {  // every destination channel in place, then all stored in one pass
      const int64_t pitch = folded ? f.dec.pitch() : SpectrumPitch(f.fw);
      for (int64_t k = 0; k < b.out_count; ++k) {
        C* spec = Accumulator(f, b, slot, k, 0);
        C2RBatch(spec, reinterpret_cast<R*>(spec), it.planes, 2 * f.spec_stride, f.spec_stride, th,
                 tw, pitch, row0, rows);
      }
      for (int64_t j = 0; j < it.planes; ++j) {
        StorePlanes(f, reinterpret_cast<const R*>(Accumulator(f, b, slot, 0, j)), pitch,
                    b.out_count, 2 * b.batch * f.spec_stride, f.dst_strides.c,
                    (b.group0 + it.group(j)) * f.dst_per_group + b.out0, it.image(j),
                    it.tile_of(j));
      }
      return;
    }
    for (int64_t k = 0; k < b.out_count; ++k) {  // consecutive groups at one tile
      C2RBatch(Accumulator(f, b, slot, k, 0), f.ws.real(slot), it.planes, f.real_stride,
               f.spec_stride, th, tw, tw, row0, rows);
      StorePlanes(f, f.ws.real(slot), tw, it.planes, f.real_stride,
                  f.dst_per_group * f.dst_strides.c,
                  (b.group0 + it.group0) * f.dst_per_group + b.out0 + k, it.n, it.tile);
    }
  }

  // Stores `planes` inverse-transformed real planes as tile `tile` of image n: plane j is
  // read from in + j * in_stride (rows `pitch` apart) and written to destination channel
  // channel0 + j * out_stride / ds.c.
  void StorePlanes(const Frame& f, const R* in0, int64_t pitch, int64_t planes, int64_t in_stride,
                   int64_t out_stride, int64_t channel0, int64_t n, int64_t tile) const {
    const auto [p0_h, p0_w] = TileOrigin(tile);
    const int64_t rows = std::min(tiling.tile_h, tiling.dense_h - p0_h);
    const int64_t cols = std::min(tiling.tile_w, tiling.dense_w - p0_w);
    int64_t c0 = 0;
    while (c0 < cols && (p0_w + c0) % f.out_sw != 0) ++c0;
    const int64_t ow0 = (p0_w + c0) / f.out_sw;
    const int64_t count = c0 < cols ? (cols - c0 + f.out_sw - 1) / f.out_sw : 0;
    // Output (r, c) sits at transform position (r - shift_h, c - shift_w) modulo the
    // transform size (the shift is 0 except for a wrap-around single tile); in a folded
    // transform, a kept position u at (u - rho) / d, in steps of out_sw / d.
    const bool folded = OutputsDecimated(f);
    const int64_t dh = folded ? f.dec.dh : 1, dw = folded ? f.dec.dw : 1;
    const auto [residue_h, residue_w] =
        folded ? Residues(f, tile) : std::pair<int64_t, int64_t>{0, 0};
    const int64_t width = f.fw / dw, step = f.out_sw / dw;
    const int64_t col0 = (Mod(c0 - tiling.shift_w, f.fw) - residue_w) / dw;
    const bool no_wrap = col0 + (count - 1) * step < width;
    T* out = dst + n * f.dst_strides.n + channel0 * f.dst_strides.c;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = p0_h + r;
      if (p % f.out_sh != 0) continue;
      T* orow = out + (p / f.out_sh) * f.dst_strides.h + ow0 * f.dst_strides.w;
      const R* in = in0 + (Mod(r - tiling.shift_h, f.fh) - residue_h) / dh * pitch;
      if (no_wrap && planes == 1 && step == 1 && f.dst_strides.w == 1) {
        for (int64_t q = 0; q < count; ++q) orow[q] = Store<T>(in[col0 + q]);
        continue;
      }
      // A run of kRun outputs at a time, plane by plane: reads run along each plane's row,
      // and the run's output (kRun x planes channels, interleaved in NHWC) stays in L1
      // across the planes however long the row.
      constexpr int64_t kRun = 64;
      for (int64_t q0 = 0; q0 < count; q0 += kRun) {
        const int64_t q1 = std::min(count, q0 + kRun);
        const int64_t start = Mod(col0 + q0 * step, width);
        for (int64_t j = 0; j < planes; ++j) {
          T* o = orow + j * out_stride;
          const R* v = in + j * in_stride;
          if (no_wrap && step == 1) {  // the common case, without the wrap test
            const R* vq = v + start - q0;
            for (int64_t q = q0; q < q1; ++q) o[q * f.dst_strides.w] = Store<T>(vq[q]);
            continue;
          }
          int64_t col = start;
          for (int64_t q = q0; q < q1; ++q) {
            o[q * f.dst_strides.w] = Store<T>(v[col]);
            col += step;
            if (col >= width) col -= width;
          }
        }
      }
    }
  }
};

}  // namespace fft_internal
LARGECONV_ISA_END
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CPU_FFT_OUTPUTS_H_
