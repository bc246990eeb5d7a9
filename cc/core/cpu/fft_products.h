// The products of the 2-D FFT's forward and backprop-input correlations (fft.cc): source
// tiles into spectra, multiplied by the filter spectra and summed over source channels.
#ifndef TF_LARGECONV_CORE_CPU_FFT_PRODUCTS_H_
#define TF_LARGECONV_CORE_CPU_FFT_PRODUCTS_H_

#include <algorithm>
#include <complex>
#include <cstdint>
#include <type_traits>

#include "cc/core/cpu/fft_correlation.h"
#include "cc/core/cpu/fft_decimation.h"
#include "cc/core/cpu/fft_gemm.h"
#include "cc/core/cpu/fft_layout.h"
#include "cc/core/cpu/fft_shared.h"
#include "cc/core/cpu/isa.h"

namespace largeconv {
LARGECONV_ISA_BEGIN
namespace fft_internal {

// The sources' stage of a correlation: each item's source tiles loaded and transformed
// (through the decimated size where strides stuff them), and their products with the
// filter spectra accumulated into the destination channels' spectra.
template <typename T>
struct CorrelationSources : CorrelationFrame<T> {
  using R = typename CorrelationFrame<T>::R;
  using C = typename CorrelationFrame<T>::C;
  using Frame = typename CorrelationFrame<T>::Frame;
  using Block = typename CorrelationFrame<T>::Block;
  using Item = typename CorrelationFrame<T>::Item;
  using CorrelationFrame<T>::tiling;
  using CorrelationFrame<T>::backprop_input;
  using CorrelationFrame<T>::kChunk;
  using CorrelationFrame<T>::SourceChannelStride;
  using CorrelationFrame<T>::SourcePlane;
  using CorrelationFrame<T>::TileOrigin;
  using CorrelationFrame<T>::Residues;
  using CorrelationFrame<T>::FilterChunk;
  using CorrelationFrame<T>::Source;
  using CorrelationFrame<T>::Accumulator;
  using CorrelationFrame<T>::InPlace;
  using CorrelationFrame<T>::g;
  using CorrelationFrame<T>::c;
  using CorrelationFrame<T>::pass;

  // Loads source channel sc of the item's planes (consecutive groups at one tile) into the
  // slot's real planes; returns the rows that hold data.
  RowRange LoadSources(const Frame& f, const Block& b, int64_t slot, const Item& it,
                       int64_t sc) const {
    const auto [p0_h, p0_w] = TileOrigin(it.tile);
    return LoadTiles(f.ws.real(slot), f.real_stride, it.planes,
                     f.src_per_group * SourceChannelStride(), f.fh, f.fw, f.fw,
                     SourcePlane(it.n, (b.group0 + it.group0) * f.src_per_group + sc),
                     p0_h + f.off_h + tiling.shift_h, p0_w + f.off_w + tiling.shift_w, f.fh, f.fw);
  }

  // Loads source channels [sc0, sc0 + ns) of each of the item's tiles into their spectra
  // (InPlace items); returns the rows that hold data in any of them.
  RowRange LoadSourcesInPlace(const Frame& f, const Block& b, int64_t slot, const Item& it,
                              int64_t sc0, int64_t ns) const {
    RowRange all;
    for (int64_t j = 0; j < it.planes; ++j) {  // tiles start at different places: one each
      const auto [p0_h, p0_w] = TileOrigin(it.tile_of(j));
      const RowRange r =
          LoadTiles(reinterpret_cast<R*>(Source(f, b, slot, 0, j)), 2 * b.batch * f.spec_stride, ns,
                    SourceChannelStride(), f.fh, f.fw, SpectrumPitch(f.fw),
                    SourcePlane(it.image(j), (b.group0 + it.group(j)) * f.src_per_group + sc0),
                    p0_h + f.off_h + tiling.shift_h, p0_w + f.off_w + tiling.shift_w, f.fh, f.fw);
      if (r.last <= r.first) continue;
      all.first = all.last > all.first ? std::min(all.first, r.first) : r.first;
      all.last = std::max(all.last, r.last);
    }
    return all;
  }

  // Transforms the tile of each source channel, b.sources channels at a time, and accumulates
  // their products with the filter spectra into the destination channels' spectra (which
  // the first block of sources sets rather than adds to, every bin of every one).
  void AccumulateSources(const Frame& f, const Block& b, int64_t slot, const Item& it) const {
    for (int64_t sc0 = 0; sc0 < f.src_per_group; sc0 += b.sources) {
      const int64_t ns = std::min(b.sources, f.src_per_group - sc0);
      if (backprop_input && f.dec.on()) {
        TransformStuffedSources(f, b, slot, it, sc0, ns);
      } else if (InPlace(it)) {
        const RowRange data = LoadSourcesInPlace(f, b, slot, it, sc0, ns);
        for (int64_t s = 0; s < ns; ++s) {
          C* spec = Source(f, b, slot, s, 0);
          R2CBatch(reinterpret_cast<const R*>(spec), spec, it.planes, 2 * f.spec_stride,
                   f.spec_stride, f.fh, f.fw, SpectrumPitch(f.fw), data);
        }
      } else {
        for (int64_t s = 0; s < ns; ++s) {
          const RowRange data = LoadSources(f, b, slot, it, sc0 + s);
          R2CBatch(f.ws.real(slot), Source(f, b, slot, s, 0), it.planes, f.real_stride,
                   f.spec_stride, f.fh, f.fw, f.fw, data);
        }
      }
      MultiplySources(f, b, slot, it, sc0, ns);
    }
  }

  // Backprop-input with strides in the spectrum: source channels [sc0, sc0 + ns) of the
  // item's planes into their spectra, each from the transform of its decimated plane
  // (ExpandStuffed). InPlace items load each tile's channels in one pass over the source
  // into their own spectra (TransformStuffedInPlace); batched groups go one channel at a
  // time through the slot's real planes.
  void TransformStuffedSources(const Frame& f, const Block& b, int64_t slot, const Item& it,
                               int64_t sc0, int64_t ns) const {
    const Decimation<R>& dec = f.dec;
    const bool in_place = InPlace(it);
    const int64_t runs = it.tiles ? it.planes : 1, planes = it.tiles ? 1 : it.planes;
    for (int64_t run = 0; run < runs; ++run) {
      const int64_t tile = it.tile_of(run);
      const auto [p0_h, p0_w] = TileOrigin(tile);
      const auto [residue_h, residue_w] = Residues(f, tile);
      // Dense q = q0 + sig + d m holds plane element (q0 + sig) / d + m: a plane without
      // stuffing in each decimated dimension.
      int64_t q0_h = p0_h + f.off_h + tiling.shift_h, q0_w = p0_w + f.off_w + tiling.shift_w;
      if (dec.dh > 1) q0_h = (q0_h + residue_h) / dec.dh;
      if (dec.dw > 1) q0_w = (q0_w + residue_w) / dec.dw;
      auto plane = [&](int64_t sc) {
        return Unstuffed(
            SourcePlane(it.image(run), (b.group0 + it.group(run)) * f.src_per_group + sc), dec);
      };
      if (in_place) {
        C* first = Source(f, b, slot, 0, run);
        const int64_t stride = b.batch * f.spec_stride;  // between source channels
        const RowRange data =
            LoadTiles(reinterpret_cast<R*>(first), 2 * stride, ns, SourceChannelStride(), dec.mh(),
                      dec.mw(), dec.pitch(), plane(sc0), q0_h, q0_w, dec.mh(), dec.mw());
        TransformStuffedInPlace(dec, first, ns, stride, data, f.ws.real(slot), residue_h,
                                residue_w);
        continue;
      }
      for (int64_t s = 0; s < ns; ++s) {
        R* real = f.ws.real(slot);
        const RowRange data = LoadTiles(
            real, f.real_stride, planes, f.src_per_group * SourceChannelStride(), dec.mh(),
            dec.mw(), dec.pitch(), plane(sc0 + s), q0_h, q0_w, dec.mh(), dec.mw());
        R2CBatch(real, reinterpret_cast<C*>(real), planes, f.real_stride, f.real_stride / 2,
                 dec.mh(), dec.mw(), dec.pitch(), data);
        for (int64_t j = 0; j < planes; ++j) {
          ExpandStuffed(dec, reinterpret_cast<const C*>(real + j * f.real_stride),
                        Source(f, b, slot, s, run + j), residue_h, residue_w);
        }
      }
    }
  }

  // The products of an item's tiles at the whole chunk from bin i0 through MacSplit (float,
  // AVX), the same sums as MacSources' bit for bit. False where MacSplit does not apply
  // and MacSources computes the chunk: another type, the last chunk cut short, more
  // sources than MacSplit takes.
  bool MultiplySplit(const Frame& f, const Block& b, int64_t slot, const Item& it, int64_t sc0,
                     int64_t ns, int64_t i0, bool assign) const {
#ifdef __AVX__
    if constexpr (std::is_same_v<R, float>) {
      if (i0 + kChunk > f.layout.bins || ns > kSourceBlock) return false;
      static_assert(kChunk == 8, "MacSplit computes eight bins");
      const int64_t ss = f.spec_stride;
      // The filters' chunks follow each other at a whole block's filters per chunk; the
      // prefetch reaches two chunks on.
      const int64_t chunk_values = kChunk * b.group_count * b.per_group;
      MacSplit(ns, it.planes, b.out_count, {Accumulator(f, b, slot, 0, 0) + i0, b.batch * ss, ss},
               {FilterChunk(f, b, it.group0, sc0, 0, i0), f.src_per_group * kChunk, kChunk},
               {Source(f, b, slot, 0, 0) + i0, ss, b.batch * ss}, 2 * chunk_values, assign);
      return true;
    }
#endif
    return false;
  }

  // MultiplySources for many channels (UsesGemm), a chunk of bins at a time: a run of
  // tiles of one group as one matrix product per bin, or each plane of an item of one tile
  // (a single tile, or batched groups) as a product of one column, which computes each
  // output as the run's do (fft_gemm.h).
  void MultiplyGemm(const Frame& f, const Block& b, int64_t slot, const Item& it, int64_t sc0,
                    int64_t ns) const {
    static_assert(kChunk == kGemmBins, "the products gather the filters' chunks");
    const int64_t ss = f.spec_stride;
    for (int64_t i0 = 0; i0 < f.layout.bins; i0 += kChunk) {
      const int64_t width = std::min(kChunk, f.layout.bins - i0);
      const int64_t runs = it.tiles ? 1 : it.planes, tiles = it.tiles ? it.planes : 1;
      for (int64_t j = 0; j < runs; ++j) {
        GemmProducts<R, true>(
            width, ns, b.out_count, tiles, {Accumulator(f, b, slot, 0, j) + i0, b.batch * ss, ss},
            {FilterChunk(f, b, it.group(j), sc0, 0, i0), f.src_per_group * width, width},
            {Source(f, b, slot, 0, j) + i0, ss, b.batch * ss}, f.ws.scratch(slot), sc0 == 0);
      }
    }
  }

  // Accumulates the products of the slot's source spectra (channels [sc0, sc0 + ns)) with
  // the filter spectra, a chunk of bins at a time (the filters' storage order), so that
  // the chunk's source spectra stay in cache across the destination channels; within a
  // chunk the sums over the sources are formed in registers (MacSources) and each
  // accumulator is read and written once.
  void MultiplySources(const Frame& f, const Block& b, int64_t slot, const Item& it, int64_t sc0,
                       int64_t ns) const {
    const int64_t ss = f.spec_stride;
    const bool assign = sc0 == 0;
    if (UsesGemm(g, pass(), c)) return MultiplyGemm(f, b, slot, it, sc0, ns);
    if (it.tiles) {
      // The item's tiles are of one group and share its filter spectra: each filter
      // spectrum (the shared operand) is applied to all the tiles at once.
      for (int64_t i0 = 0; i0 < f.layout.bins; i0 += kChunk) {
        if (MultiplySplit(f, b, slot, it, sc0, ns, i0, assign)) continue;
        const int64_t width = std::min(kChunk, f.layout.bins - i0);
        const Spectra<R> sources{Source(f, b, slot, 0, 0) + i0, ss, b.batch * ss};
        for (int64_t k = 0; k < b.out_count; ++k) {
          MacSources<R, false>(0, width, ns, it.planes, {Accumulator(f, b, slot, k, 0) + i0, ss, 0},
                               {FilterChunk(f, b, it.group0, sc0, k, i0), 0, width}, sources,
                               assign);
        }
      }
      return;
    }
    for (int64_t j = 0; j < it.planes; ++j) {
      // One tile's source spectrum (the shared operand) is applied to every destination
      // channel's filter spectrum.
      for (int64_t i0 = 0; i0 < f.layout.bins; i0 += kChunk) {
        const int64_t width = std::min(kChunk, f.layout.bins - i0);
        MacSources<R, true>(
            0, width, ns, b.out_count, {Accumulator(f, b, slot, 0, j) + i0, b.batch * ss, 0},
            {Source(f, b, slot, 0, j) + i0, 0, b.batch * ss},
            {FilterChunk(f, b, it.group(j), sc0, 0, i0), f.src_per_group * width, width}, assign);
      }
    }
  }
};

}  // namespace fft_internal
LARGECONV_ISA_END
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CPU_FFT_PRODUCTS_H_
