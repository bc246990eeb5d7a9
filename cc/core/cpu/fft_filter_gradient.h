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
#include "cc/core/cpu/fft_layout.h"
#include "cc/core/cpu/fft_shared.h"
#include "cc/core/cpu/isa.h"

namespace largeconv {
LARGECONV_ISA_BEGIN
namespace fft_internal {

// Backprop-filter: dw[k] = sum over images and tiles of x_pad[p + k] dy_z[p], accumulated
// as spectra per (input, output) channel pair and read out once at the end. A unit of work
// is in_block x out_block channel pairs of vb groups. With one group, a unit sweeps the
// batch's tiles `sweep` (vec_block) at a time: it transforms the sweep's tiles of every
// channel, then adds their products to the accumulators a chunk of bins at a time, so
// that each accumulator is read and written once per sweep rather than once per tile
// (the accumulators of a 16 x 16 unit of 160 x 160 transforms take 26 MB, beyond the
// cache: their traffic was most of the pass).
template <typename T>
struct FilterGradient {
  using R = AccT<T>;
  using C = std::complex<R>;
  const ConvGeometry& g;
  const FftConfig& c;
  const T* input;
  const T* out_backprop;
  T* filter_backprop;
  Layout l;
  Workspace<R> ws;
  int64_t icpg, ocpg, vb, sweep, real_stride, spec_stride;
  // Strides in the spectrum: out_backprop's zero-stuffed tiles from decimated transforms.
  Decimation<R> dec;

  // The pairs of one unit: groups [g0, g0 + nb), input channels [ib0, ib0 + ib) and output
  // channels [ob0, ob0 + ob) of each.
  struct Unit {
    int64_t g0, nb, ib0, ib, ob0, ob;
  };

  void Run(const ParallelFor& pf) const {
    const FftTiling& t = c.tiling;
    const int64_t nib = CeilDiv(icpg, c.in_block), nob = CeilDiv(ocpg, c.out_block);
    const double fft_cost =
        5.0 * c.fft_h * c.fft_w * std::log2(static_cast<double>(c.fft_h * c.fft_w) + 2);
    const int64_t per_image = t.tiles_h * t.tiles_w, all_tiles = g.batch * per_image;
    const double unit_cost = all_tiles * (fft_cost * (c.in_block + c.out_block) +
                                          8.0 * l.bins * c.in_block * c.out_block);
    const int64_t runs = CeilDiv(g.groups, vb);
    RunSlots(pf, c.slots, runs * nib * nob, unit_cost * vb, [&](int64_t slot, int64_t unit) {
      Unit u;
      u.g0 = unit / (nib * nob) * vb;
      u.nb = std::min(vb, g.groups - u.g0);
      u.ib0 = (unit / nob) % nib * c.in_block;
      u.ob0 = unit % nob * c.out_block;
      u.ib = std::min(c.in_block, icpg - u.ib0);
      u.ob = std::min(c.out_block, ocpg - u.ob0);
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
    return ws.spectrum(slot, (i * c.out_block + k) * vb + j);
  }
  C* GradientSpectrum(int64_t slot, int64_t k, int64_t s, int64_t j) const {
    return ws.spectrum(slot, (c.in_block * c.out_block + k * sweep + s) * vb + j);
  }
  C* InputSpectrum(int64_t slot, int64_t i, int64_t s, int64_t j) const {
    return ws.spectrum(slot, ((c.in_block + sweep) * c.out_block + i * sweep + s) * vb + j);
  }

  // Transforms the unit's out_backprop and input channels over tile `tile` of image n into
  // the sweep's spectra s. With one group in the unit, each operand's channels are loaded
  // in one pass over the tile (NHWC reads whole runs of channels) into their own spectra
  // and transformed in place; batched groups go one channel at a time through the slot's
  // real planes.
  void TransformTile(const Unit& u, int64_t slot, int64_t n, int64_t tile, int64_t s) const {
    const FftTiling& t = c.tiling;
    const int64_t fh = c.fft_h, fw = c.fft_w;
    const int64_t p0_h = tile / t.tiles_w * t.tile_h, p0_w = tile % t.tiles_w * t.tile_w;
    const Strides4 xs = g.input_strides(), ys = g.output_strides();
    const int64_t rows = std::min(t.tile_h, t.dense_h - p0_h);
    const int64_t cols = std::min(t.tile_w, t.dense_w - p0_w);
    const bool in_place = u.nb == 1;
    const int64_t spectrum_pitch = SpectrumPitch(fw);
    // Spectra between consecutive channels of one operand (the same for both).
    const int64_t channel_stride = sweep * vb * spec_stride;
    // Dense p = p0 + u holds data where p % stride == 0: at u = sig + d m in a decimated
    // dimension, plane element (p0 + sig) / d + m.
    const int64_t sig_h = Mod(-p0_h, dec.dh), sig_w = Mod(-p0_w, dec.dw);
    auto dy_plane = [&](int64_t k) {
      return Plane<T>{out_backprop + n * ys.n + (u.g0 * ocpg + u.ob0 + k) * ys.c,
                      ys.h,
                      ys.w,
                      g.out_h,
                      g.out_w,
                      g.stride_h,
                      g.stride_w};
    };
    if (!dec.on()) {
      if (in_place) {
        R* first = reinterpret_cast<R*>(GradientSpectrum(slot, 0, s, 0));
        const RowRange data = LoadTiles(first, 2 * channel_stride, u.ob, ys.c, fh, fw,
                                        spectrum_pitch, dy_plane(0), p0_h, p0_w, rows, cols);
        R2CBatch(first, GradientSpectrum(slot, 0, s, 0), u.ob, 2 * channel_stride, channel_stride,
                 fh, fw, spectrum_pitch, data);
      } else {
        for (int64_t k = 0; k < u.ob; ++k) {
          const RowRange data = LoadTiles(ws.real(slot), real_stride, u.nb, ocpg * ys.c, fh, fw, fw,
                                          dy_plane(k), p0_h, p0_w, rows, cols);
          R2CBatch(ws.real(slot), GradientSpectrum(slot, k, s, 0), u.nb, real_stride, spec_stride,
                   fh, fw, fw, data);
        }
      }
    } else {
      int64_t q0_h = p0_h, q0_w = p0_w, dense_rows = rows, dense_cols = cols;
      if (dec.dh > 1) {
        q0_h = (p0_h + sig_h) / dec.dh;
        dense_rows = CeilDiv(std::max<int64_t>(0, rows - sig_h), dec.dh);
      }
      if (dec.dw > 1) {
        q0_w = (p0_w + sig_w) / dec.dw;
        dense_cols = CeilDiv(std::max<int64_t>(0, cols - sig_w), dec.dw);
      }
      auto decimated = [&](int64_t k) { return Unstuffed(dy_plane(k), dec); };
      if (in_place) {
        C* first = GradientSpectrum(slot, 0, s, 0);
        const RowRange data =
            LoadTiles(reinterpret_cast<R*>(first), 2 * channel_stride, u.ob, ys.c, dec.mh(),
                      dec.mw(), dec.pitch(), decimated(0), q0_h, q0_w, dense_rows, dense_cols);
        TransformStuffedInPlace(dec, first, u.ob, channel_stride, data, ws.real(slot), sig_h,
                                sig_w);
      } else {
        for (int64_t k = 0; k < u.ob; ++k) {
          R* real = ws.real(slot);
          const RowRange data =
              LoadTiles(real, real_stride, u.nb, ocpg * ys.c, dec.mh(), dec.mw(), dec.pitch(),
                        decimated(k), q0_h, q0_w, dense_rows, dense_cols);
          R2CBatch(real, reinterpret_cast<C*>(real), u.nb, real_stride, real_stride / 2, dec.mh(),
                   dec.mw(), dec.pitch(), data);
          for (int64_t j = 0; j < u.nb; ++j) {
            ExpandStuffed(dec, reinterpret_cast<const C*>(real + j * real_stride),
                          GradientSpectrum(slot, k, s, j), sig_h, sig_w);
          }
        }
      }
    }
    auto x_plane = [&](int64_t i) {
      return Plane<T>{
          input + n * xs.n + (u.g0 * icpg + u.ib0 + i) * xs.c, xs.h, xs.w, g.in_h, g.in_w, 1, 1};
    };
    const int64_t x0_h = p0_h - g.pad_top + t.shift_h, x0_w = p0_w - g.pad_left + t.shift_w;
    if (in_place) {
      R* first = reinterpret_cast<R*>(InputSpectrum(slot, 0, s, 0));
      const RowRange data = LoadTiles(first, 2 * channel_stride, u.ib, xs.c, fh, fw, spectrum_pitch,
                                      x_plane(0), x0_h, x0_w, fh, fw);
      R2CBatch(first, InputSpectrum(slot, 0, s, 0), u.ib, 2 * channel_stride, channel_stride, fh,
               fw, spectrum_pitch, data);
      return;
    }
    for (int64_t i = 0; i < u.ib; ++i) {
      const RowRange data = LoadTiles(ws.real(slot), real_stride, u.nb, icpg * xs.c, fh, fw, fw,
                                      x_plane(i), x0_h, x0_w, fh, fw);
      R2CBatch(ws.real(slot), InputSpectrum(slot, i, s, 0), u.nb, real_stride, spec_stride, fh, fw,
               fw, data);
    }
  }

  // Adds the products of the sweep's nt tiles to the accumulators (sets them, on the first
  // sweep): a chunk of bins at a time, so that the chunk's spectra of every channel and
  // tile stay in cache while each accumulator chunk is read and written once, held in
  // registers across the tiles (MacSweep: tile by tile, so any sweep length gives the
  // same sums).
  void Multiply(const Unit& u, int64_t slot, int64_t nt, bool assign) const {
    // Chunks whose spectra (every channel of every tile) fill about half of L2.
    constexpr int64_t kChunkBytes = 256 << 10;
    const int64_t chunk = std::clamp<int64_t>(
        kChunkBytes / ((u.ib + u.ob) * nt * int64_t{sizeof(C)}) / 8 * 8, 16, 1024);
    const int64_t ss = spec_stride;
    for (int64_t j = 0; j < u.nb; ++j) {
      const Spectra<R> dys{GradientSpectrum(slot, 0, 0, j), sweep * vb * ss, vb * ss};
      for (int64_t i0 = 0; i0 < l.bins; i0 += chunk) {
        const int64_t i1 = std::min(l.bins, i0 + chunk);
        for (int64_t i = 0; i < u.ib; ++i) {
          // Two output channels at a time along the chunk: a few streams, each read in runs.
          for (int64_t k = 0; k < u.ob; k += 2) {
            MacSweep<R>(i0, i1, nt, std::min<int64_t>(2, u.ob - k),
                        {Accumulator(slot, i, k, j), vb * ss, 0},
                        {InputSpectrum(slot, i, 0, j), 0, vb * ss},
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
    for (int64_t i = 0; i < u.ib; ++i) {
      for (int64_t k = 0; k < u.ob; ++k) {
        C2RBatch(Accumulator(slot, i, k, 0), ws.real(slot), u.nb, real_stride, spec_stride, fh, fw,
                 fw, -t.shift_h, DilatedExtent(g.filter_h, g.dilation_h));
        for (int64_t j = 0; j < u.nb; ++j) {
          const R* real = ws.real(slot, j);
          const int64_t grp = u.g0 + j;
          for (int64_t kh = 0; kh < g.filter_h; ++kh) {
            const R* row = real + Mod(kh * g.dilation_h - t.shift_h, fh) * fw;
            for (int64_t kw = 0; kw < g.filter_w; ++kw) {
              filter_backprop[((kh * g.filter_w + kw) * icpg + u.ib0 + i) * g.out_c + grp * ocpg +
                              u.ob0 + k] =
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
  const Layout l = MakeLayout(g, ConvPass::kBackpropFilter, c, sizeof(R));
  const int64_t icpg = g.in_c_per_group(), ocpg = g.out_c_per_group();
  // With one group, vec_block tiles per sweep; whole groups per unit (depthwise and other
  // many-group cases) are taken vec_block at a time, transformed in batched calls and
  // loaded channel-innermost.
  const bool tiles = BatchesTiles(g, c);
  const bool whole = c.in_block >= icpg && c.out_block >= ocpg;
  const int64_t vb = !tiles && whole ? std::max<int64_t>(1, std::min(c.vec_block, g.groups)) : 1;
  const int64_t sweep = tiles ? c.vec_block : 1;
  const FilterGradient<T> job{g,
                              c,
                              input,
                              out_backprop,
                              filter_backprop,
                              l,
                              Workspace<R>{static_cast<char*>(workspace), l},
                              icpg,
                              ocpg,
                              vb,
                              sweep,
                              static_cast<int64_t>(l.plane_bytes / sizeof(R)),
                              static_cast<int64_t>(l.spectrum_bytes / sizeof(C)),
                              MakeDecimation<R>(g, ConvPass::kBackpropFilter, c, -1)};
  job.Run(pf);
}

}  // namespace fft_internal
LARGECONV_ISA_END
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CPU_FFT_FILTER_GRADIENT_H_
