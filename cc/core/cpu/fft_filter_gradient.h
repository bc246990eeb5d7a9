// The 2-D FFT's backprop-filter pass (fft.cc): per channel pair, the spectra of input and
// out_backprop tiles multiplied and accumulated over the batch, then read out as taps.
#ifndef TF_LARGECONV_CORE_CPU_FFT_FILTER_GRADIENT_H_
#define TF_LARGECONV_CORE_CPU_FFT_FILTER_GRADIENT_H_

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>

#include "cc/core/common/dtypes.h"
#include "cc/core/common/geometry.h"
#include "cc/core/common/parallel.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cpu/fft.h"
#include "cc/core/cpu/fft_decimation.h"
#include "cc/core/cpu/fft_gemm.h"
#include "cc/core/cpu/fft_layout.h"
#include "cc/core/cpu/fft_shared.h"
#include "cc/core/cpu/isa.h"

namespace largeconv {
LARGECONV_ISA_BEGIN
namespace fft_internal {

// Backprop-filter: dw[k] = sum over images and tiles of x_pad[p + k] dy_z[p], accumulated
// as spectra per (input, output) channel pair and read out once at the end. A unit of work
// is in_block x out_block channel pairs of group_batch groups. With one group, a unit
// sweeps the batch's tiles `sweep` (vec_block) at a time: it transforms the sweep's tiles
// of every channel, then adds their products to the accumulators a chunk of bins at a
// time, so that each accumulator is read and written once per sweep rather than once per
// tile (the accumulators of a 16 x 16 unit of 160 x 160 transforms take 26 MB, beyond the
// cache).
template <typename T>
struct FilterGradient {
  using R = AccT<T>;
  using C = std::complex<R>;
  const ConvGeometry& g;
  const FftConfig& c;
  const T* input;
  const T* out_backprop;
  T* filter_backprop;
  Layout layout;
  Workspace<R> ws;
  int64_t in_per_group, out_per_group;
  int64_t group_batch;  // groups transformed together, in batched calls
  int64_t sweep, real_stride, spec_stride;
  // Strides in the spectrum: out_backprop's zero-stuffed tiles from decimated transforms.
  Decimation<R> dec;

  // The pairs of one unit: groups [group0, group0 + group_count), input channels
  // [in0, in0 + in_count) and output channels [out0, out0 + out_count) of each.
  struct Unit {
    int64_t group0, group_count, in0, in_count, out0, out_count;
  };
  // One tile of one image, as a sweep transforms it: image n, its dense origin (p0_h, p0_w)
  // and the rows and columns of it that hold positions, into the sweep's spectra s.
  struct SweepTile {
    int64_t n, p0_h, p0_w, rows, cols, s;
  };

  void Run(const ParallelFor& pf) const {
    const FftTiling& t = c.tiling;
    const int64_t in_units = CeilDiv(in_per_group, c.in_block);
    const int64_t out_units = CeilDiv(out_per_group, c.out_block);
    const double fft_cost =
        5.0 * c.fft_h * c.fft_w * std::log2(static_cast<double>(c.fft_h * c.fft_w) + 2);
    const int64_t per_image = t.tiles_h * t.tiles_w, all_tiles = g.batch * per_image;
    const double unit_cost = all_tiles * (fft_cost * (c.in_block + c.out_block) +
                                          8.0 * layout.bins * c.in_block * c.out_block);
    const int64_t runs = CeilDiv(g.groups, group_batch);
    RunSlots(pf, c.slots, runs * in_units * out_units, unit_cost * group_batch,
             [&](int64_t slot, int64_t unit) {
               Unit u;
               u.group0 = unit / (in_units * out_units) * group_batch;
               u.group_count = std::min(group_batch, g.groups - u.group0);
               u.in0 = (unit / out_units) % in_units * c.in_block;
               u.out0 = unit % out_units * c.out_block;
               u.in_count = std::min(c.in_block, in_per_group - u.in0);
               u.out_count = std::min(c.out_block, out_per_group - u.out0);
               for (int64_t first = 0; first < all_tiles; first += sweep) {
                 const int64_t nt = std::min(sweep, all_tiles - first);
                 for (int64_t s = 0; s < nt; ++s) {
                   TransformTile(u, slot, (first + s) / per_image, (first + s) % per_image, s);
                 }
                 Multiply(u, slot, nt, first == 0);
               }
               StoreFilter(u, slot);
             });
  }

  // Slot spectra: accumulators (i, k, j), then out_backprop (k, s, j), then input
  // (i, s, j), for pair (i, k), tile s of the sweep and batched group j.
  C* Accumulator(int64_t slot, int64_t i, int64_t k, int64_t j) const {
    return ws.spectrum(slot, (i * c.out_block + k) * group_batch + j);
  }
  C* GradientSpectrum(int64_t slot, int64_t k, int64_t s, int64_t j) const {
    return ws.spectrum(slot, (c.in_block * c.out_block + k * sweep + s) * group_batch + j);
  }
  C* InputSpectrum(int64_t slot, int64_t i, int64_t s, int64_t j) const {
    return ws.spectrum(slot,
                       ((c.in_block + sweep) * c.out_block + i * sweep + s) * group_batch + j);
  }
  // Spectra between consecutive channels of one operand (the same for both).
  int64_t ChannelStride() const { return sweep * group_batch * spec_stride; }

  // Transforms the unit's out_backprop and input channels over tile `tile` of image n into
  // the sweep's spectra s. With one group in the unit, each operand's channels are loaded
  // in one pass over the tile (NHWC reads whole runs of channels) into their own spectra
  // and transformed in place; batched groups go one channel at a time through the slot's
  // real planes.
  void TransformTile(const Unit& u, int64_t slot, int64_t n, int64_t tile, int64_t s) const {
    const FftTiling& t = c.tiling;
    const int64_t p0_h = tile / t.tiles_w * t.tile_h, p0_w = tile % t.tiles_w * t.tile_w;
    const int64_t rows = std::min(t.tile_h, t.dense_h - p0_h);
    const SweepTile at{n, p0_h, p0_w, rows, std::min(t.tile_w, t.dense_w - p0_w), s};
    if (!dec.on()) {
      TransformGradient(u, slot, at);
    } else {
      TransformDecimatedGradient(u, slot, at);
    }
    TransformInput(u, slot, at);
  }

  // Output channel k of the unit's first group in image n, as its tiles load it.
  Plane<T> GradientPlane(const Unit& u, int64_t n, int64_t k) const {
    const Strides4 ys = g.output_strides();
    const T* base = out_backprop + n * ys.n + (u.group0 * out_per_group + u.out0 + k) * ys.c;
    return Plane<T>{base, ys.h, ys.w, g.out_h, g.out_w, g.stride_h, g.stride_w};
  }

  // out_backprop's tile, transformed at full size.
  void TransformGradient(const Unit& u, int64_t slot, const SweepTile& at) const {
    const int64_t fh = c.fft_h, fw = c.fft_w, ys_c = g.output_strides().c;
    if (u.group_count == 1) {
      const int64_t channel_stride = ChannelStride(), spectrum_pitch = SpectrumPitch(fw);
      R* first = reinterpret_cast<R*>(GradientSpectrum(slot, 0, at.s, 0));
      const RowRange data =
          LoadTiles(first, 2 * channel_stride, u.out_count, ys_c, fh, fw, spectrum_pitch,
                    GradientPlane(u, at.n, 0), at.p0_h, at.p0_w, at.rows, at.cols);
      R2CBatch(first, GradientSpectrum(slot, 0, at.s, 0), u.out_count, 2 * channel_stride,
               channel_stride, fh, fw, spectrum_pitch, data);
      return;
    }
    for (int64_t k = 0; k < u.out_count; ++k) {
      const RowRange data =
          LoadTiles(ws.real(slot), real_stride, u.group_count, out_per_group * ys_c, fh, fw, fw,
                    GradientPlane(u, at.n, k), at.p0_h, at.p0_w, at.rows, at.cols);
      R2CBatch(ws.real(slot), GradientSpectrum(slot, k, at.s, 0), u.group_count, real_stride,
               spec_stride, fh, fw, fw, data);
    }
  }

  // out_backprop's tile, strided: only the dense positions p = p0 + q with p % stride == 0
  // hold data, at q = residue + d m in a decimated dimension, plane element
  // (p0 + residue) / d + m; the decimated transforms are expanded to full spectra.
  void TransformDecimatedGradient(const Unit& u, int64_t slot, const SweepTile& at) const {
    const int64_t ys_c = g.output_strides().c;
    const int64_t residue_h = Mod(-at.p0_h, dec.dh), residue_w = Mod(-at.p0_w, dec.dw);
    int64_t q0_h = at.p0_h, q0_w = at.p0_w, dense_rows = at.rows, dense_cols = at.cols;
    if (dec.dh > 1) {
      q0_h = (at.p0_h + residue_h) / dec.dh;
      dense_rows = CeilDiv(std::max<int64_t>(0, at.rows - residue_h), dec.dh);
    }
    if (dec.dw > 1) {
      q0_w = (at.p0_w + residue_w) / dec.dw;
      dense_cols = CeilDiv(std::max<int64_t>(0, at.cols - residue_w), dec.dw);
    }
    auto decimated = [&](int64_t k) { return Unstuffed(GradientPlane(u, at.n, k), dec); };
    if (u.group_count == 1) {
      const int64_t channel_stride = ChannelStride();
      C* first = GradientSpectrum(slot, 0, at.s, 0);
      const RowRange data =
          LoadTiles(reinterpret_cast<R*>(first), 2 * channel_stride, u.out_count, ys_c, dec.mh(),
                    dec.mw(), dec.pitch(), decimated(0), q0_h, q0_w, dense_rows, dense_cols);
      TransformStuffedInPlace(dec, first, u.out_count, channel_stride, data, ws.real(slot),
                              residue_h, residue_w);
      return;
    }
    for (int64_t k = 0; k < u.out_count; ++k) {
      R* real = ws.real(slot);
      const RowRange data =
          LoadTiles(real, real_stride, u.group_count, out_per_group * ys_c, dec.mh(), dec.mw(),
                    dec.pitch(), decimated(k), q0_h, q0_w, dense_rows, dense_cols);
      R2CBatch(real, reinterpret_cast<C*>(real), u.group_count, real_stride, real_stride / 2,
               dec.mh(), dec.mw(), dec.pitch(), data);
      for (int64_t j = 0; j < u.group_count; ++j) {
        ExpandStuffed(dec, reinterpret_cast<const C*>(real + j * real_stride),
                      GradientSpectrum(slot, k, at.s, j), residue_h, residue_w);
      }
    }
  }

  // The input's window of the tile: the whole transform, from the padded origin.
  void TransformInput(const Unit& u, int64_t slot, const SweepTile& at) const {
    const FftTiling& t = c.tiling;
    const int64_t fh = c.fft_h, fw = c.fft_w;
    const Strides4 xs = g.input_strides();
    auto x_plane = [&](int64_t i) {
      const T* base = input + at.n * xs.n + (u.group0 * in_per_group + u.in0 + i) * xs.c;
      return Plane<T>{base, xs.h, xs.w, g.in_h, g.in_w, 1, 1};
    };
    const int64_t x0_h = at.p0_h - g.pad_top + t.shift_h, x0_w = at.p0_w - g.pad_left + t.shift_w;
    if (u.group_count == 1) {
      const int64_t channel_stride = ChannelStride(), spectrum_pitch = SpectrumPitch(fw);
      R* first = reinterpret_cast<R*>(InputSpectrum(slot, 0, at.s, 0));
      const RowRange data = LoadTiles(first, 2 * channel_stride, u.in_count, xs.c, fh, fw,
                                      spectrum_pitch, x_plane(0), x0_h, x0_w, fh, fw);
      R2CBatch(first, InputSpectrum(slot, 0, at.s, 0), u.in_count, 2 * channel_stride,
               channel_stride, fh, fw, spectrum_pitch, data);
      return;
    }
    for (int64_t i = 0; i < u.in_count; ++i) {
      const RowRange data =
          LoadTiles(ws.real(slot), real_stride, u.group_count, in_per_group * xs.c, fh, fw, fw,
                    x_plane(i), x0_h, x0_w, fh, fw);
      R2CBatch(ws.real(slot), InputSpectrum(slot, i, at.s, 0), u.group_count, real_stride,
               spec_stride, fh, fw, fw, data);
    }
  }

  // Adds the products of the sweep's nt tiles to the accumulators (sets them, on the first
  // sweep): a chunk of bins at a time, so that the chunk's spectra of every channel and
  // tile stay in cache while each accumulator chunk is read and written once, held in
  // registers across the tiles (MacSweep: tile by tile, so any sweep length gives the
  // same sums). Where UsesGemm holds, the sweep's products are matrix products instead, per
  // bin the unit's input spectra [input channels x tiles] by its out_backprop spectra
  // conjugated [tiles x output channels] (fft_gemm.h), over a sweep the planner fixes.
  void Multiply(const Unit& u, int64_t slot, int64_t nt, bool assign) const {
    const int64_t ss = spec_stride;
    if (UsesGemm(g, ConvPass::kBackpropFilter, c)) {  // one group: accumulators (i, k)
      return GemmOverBins<R, false>(layout.bins, nt, u.in_count, u.out_count,
                                    {Accumulator(slot, 0, 0, 0), c.out_block * ss, ss},
                                    {InputSpectrum(slot, 0, 0, 0), sweep * ss, ss},
                                    {GradientSpectrum(slot, 0, 0, 0), sweep * ss, ss},
                                    ws.scratch(slot), assign);
    }
    // Chunks whose spectra (every channel of every tile) fill about half of L2.
    constexpr int64_t kChunkBytes = 256 << 10;
    const int64_t chunk = std::clamp<int64_t>(
        kChunkBytes / ((u.in_count + u.out_count) * nt * int64_t{sizeof(C)}) / 8 * 8, 16, 1024);
    for (int64_t j = 0; j < u.group_count; ++j) {
      const Spectra<R> dys{GradientSpectrum(slot, 0, 0, j), sweep * group_batch * ss,
                           group_batch * ss};
      for (int64_t i0 = 0; i0 < layout.bins; i0 += chunk) {
        const int64_t i1 = std::min(layout.bins, i0 + chunk);
        for (int64_t i = 0; i < u.in_count; ++i) {
          // Two output channels at a time along the chunk: a few streams, each read in runs.
          for (int64_t k = 0; k < u.out_count; k += 2) {
            MacSweep<R>(i0, i1, nt, std::min<int64_t>(2, u.out_count - k),
                        {Accumulator(slot, i, k, j), group_batch * ss, 0},
                        {InputSpectrum(slot, i, 0, j), 0, group_batch * ss},
                        {dys.at(k, 0), dys.o_stride, dys.s_stride}, assign);
          }
        }
      }
    }
  }

  // Inverse-transforms the accumulated spectra and stores the filter taps.
  void StoreFilter(const Unit& u, int64_t slot) const {
    const FftTiling& t = c.tiling;
    const int64_t fh = c.fft_h, fw = c.fft_w;
    const R scale = R(1) / static_cast<R>(fh * fw);  // applied on the final read-out
    for (int64_t i = 0; i < u.in_count; ++i) {
      for (int64_t k = 0; k < u.out_count; ++k) {
        C2RBatch(Accumulator(slot, i, k, 0), ws.real(slot), u.group_count, real_stride, spec_stride,
                 fh, fw, fw, -t.shift_h, DilatedExtent(g.filter_h, g.dilation_h));
        for (int64_t j = 0; j < u.group_count; ++j) {
          const R* real = ws.real(slot, j);
          const int64_t grp = u.group0 + j;
          for (int64_t kh = 0; kh < g.filter_h; ++kh) {
            const R* row = real + Mod(kh * g.dilation_h - t.shift_h, fh) * fw;
            for (int64_t kw = 0; kw < g.filter_w; ++kw) {
              filter_backprop[((kh * g.filter_w + kw) * in_per_group + u.in0 + i) * g.out_c +
                              grp * out_per_group + u.out0 + k] =
                  Store<T>(scale * row[Mod(kw * g.dilation_w - t.shift_w, fw)]);
            }
          }
        }
      }
    }
  }
};

template <typename T>
void FftBackpropFilter(const ConvGeometry& g, const FftConfig& c, const T* input,
                       const T* out_backprop, T* filter_backprop, void* workspace,
                       const ParallelFor& pf) {
  using R = AccT<T>;
  using C = std::complex<R>;
  if (g.filter_elements() == 0) return;
  const Layout layout = MakeLayout(g, ConvPass::kBackpropFilter, c, sizeof(R));
  const int64_t in_per_group = g.in_c_per_group(), out_per_group = g.out_c_per_group();
  // With one group, vec_block tiles per sweep; whole groups per unit (depthwise and other
  // many-group cases) are taken vec_block at a time, transformed in batched calls and
  // loaded channel-innermost.
  const bool tiles = BatchesTiles(g, c);
  const bool whole = c.in_block >= in_per_group && c.out_block >= out_per_group;
  const int64_t group_batch =
      !tiles && whole ? std::max<int64_t>(1, std::min(c.vec_block, g.groups)) : 1;
  const int64_t sweep = tiles ? c.vec_block : 1;
  const FilterGradient<T> job{g,
                              c,
                              input,
                              out_backprop,
                              filter_backprop,
                              layout,
                              Workspace<R>{static_cast<char*>(workspace), layout},
                              in_per_group,
                              out_per_group,
                              group_batch,
                              sweep,
                              static_cast<int64_t>(layout.plane_bytes / sizeof(R)),
                              static_cast<int64_t>(layout.spectrum_bytes / sizeof(C)),
                              MakeDecimation<R>(g, ConvPass::kBackpropFilter, c, -1)};
  job.Run(pf);
}

}  // namespace fft_internal
LARGECONV_ISA_END
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CPU_FFT_FILTER_GRADIENT_H_
