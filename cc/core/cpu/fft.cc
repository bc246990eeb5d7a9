// FFT overlap-save convolution. All three passes are correlations computed tile by tile:
//   forward:         y[p]  = sum_k x_pad[p + k] w_dil[k]         (then keep every stride-th p)
//   backprop-input:  dx[p] = sum_k dy_z[p + pt - KE + 1 + k] w_dil[KE - 1 - k]
//   backprop-filter: dw[k] = sum_p x_pad[p + k] dy_z[p]          (summed over batch and tiles)
// where dy_z is out_backprop zero-stuffed by the stride and w_dil the dilated filter. A
// correlation of a tile with a short kernel is IFFT(FFT(tile) * conj(FFT(kernel))); the
// first tile - KE + 1 outputs of each transform are exact (overlap-save).
// This file runs the two image-writing correlations (the stages in fft_correlation.h,
// fft_products.h and fft_outputs.h) and dispatches the three passes; the filter gradient's
// correlation is fft_filter_gradient.h, and fft_layout.h and fft_decimation.h hold what
// they all share.
#include "cc/core/cpu/fft.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <iterator>
#include <memory>
#include <type_traits>
#include <utility>

#include "cc/core/common/dtypes.h"
#include "cc/core/cpu/fft_correlation.h"
#include "cc/core/cpu/fft_decimation.h"
#include "cc/core/cpu/fft_filter_gradient.h"
#include "cc/core/cpu/fft_layout.h"
#include "cc/core/cpu/fft_outputs.h"
#include "cc/core/cpu/fft_shared.h"
#include "cc/core/cpu/isa.h"
#include "cc/core/cpu/spectrum_cache.h"

namespace largeconv {
LARGECONV_ISA_BEGIN
namespace fft_internal {
namespace {

// A forward or backprop-input correlation run block by block: the block's filter
// spectra (kept from an earlier call, or transformed), then every item through the
// sources' and the outputs' stages.
template <typename T>
struct Correlation : CorrelationOutputs<T> {
  using R = typename CorrelationOutputs<T>::R;
  using C = typename CorrelationOutputs<T>::C;
  using Frame = typename CorrelationOutputs<T>::Frame;
  using Block = typename CorrelationOutputs<T>::Block;
  using Item = typename CorrelationOutputs<T>::Item;
  using CorrelationOutputs<T>::g;
  using CorrelationOutputs<T>::c;
  using CorrelationOutputs<T>::tiling;
  using CorrelationOutputs<T>::backprop_input;
  using CorrelationOutputs<T>::filter;
  using CorrelationOutputs<T>::kChunk;
  using CorrelationOutputs<T>::pass;
  using CorrelationOutputs<T>::GatherFilters;
  using CorrelationOutputs<T>::PlaceFilter;
  using CorrelationOutputs<T>::MakeFrame;
  using CorrelationOutputs<T>::FilterOffset;
  using CorrelationOutputs<T>::AccumulateSources;
  using CorrelationOutputs<T>::StoreTile;

  void Run(void* workspace, const ParallelFor& pf) const {
    const Frame f = MakeFrame(workspace);
    const int64_t per_image = tiling.tiles_h * tiling.tiles_w;
    // Groups are taken group_block at a time (only with whole groups per block).
    const int64_t gblock = c.out_block >= f.dst_per_group ? std::max<int64_t>(1, c.group_block) : 1;
    KeptSpectra kept = FindKeptSpectra(f, gblock);
    int64_t offset = 0;  // of the block's filter spectra among the pass's, in complex values
    for (int64_t g0 = 0; g0 < g.groups; g0 += gblock) {
      const int64_t gb = std::min(gblock, g.groups - g0);
      for (int64_t ob0 = 0; ob0 < f.dst_per_group; ob0 += c.out_block) {
        const int64_t ob = std::min(c.out_block, f.dst_per_group - ob0);
        // vec_block batches groups, or for a single group consecutive tiles (the planner's
        // choice for rows of height 1, whose transforms vectorise across the batch).
        const bool tiles = BatchesTiles(g, c);
        const int64_t all_tiles = g.batch * per_image;
        const int64_t batch = std::max<int64_t>(1, std::min(c.vec_block, tiles ? all_tiles : gb));
        Block b{g0,
                gb,
                ob0,
                ob,
                f.src_per_group * ob,
                batch,
                tiles,
                std::max<int64_t>(1, std::min(c.in_block, f.src_per_group))};
        b.spectra = BlockSpectra(f, b, pf, kept, offset);
        offset += b.group_count * b.per_group * f.layout.bins;
        const double tile_cost =
            f.fft_cost * (f.src_per_group + ob) + 8.0 * f.layout.bins * f.src_per_group * ob;
        if (tiles) {  // an item is batch consecutive tiles of the batch
          RunSlots(pf, c.slots, CeilDiv(all_tiles, batch), tile_cost * batch,
                   [&](int64_t slot, int64_t item) {
                     const int64_t first = item * batch;
                     CorrelateTile(f, b, slot,
                                   Item{0, std::min(batch, all_tiles - first), first / per_image,
                                        first % per_image, per_image, true});
                   });
          continue;
        }
        // An item is up to batch groups of one tile of one image. Group runs vary fastest, so
        // one image's tile is reused from cache by all of them.
        const int64_t group_runs = CeilDiv(gb, batch);
        RunSlots(pf, c.slots, group_runs * all_tiles, tile_cost * batch,
                 [&](int64_t slot, int64_t item) {
                   const int64_t group0 = item % group_runs * batch;
                   item /= group_runs;
                   CorrelateTile(f, b, slot,
                                 Item{group0, std::min(batch, gb - group0), item / per_image,
                                      item % per_image, per_image, false});
                 });
      }
    }
    if (kept.fill) SpectrumCache::Global().Keep(std::move(kept.fill), kept.budget);
  }

  // The pass's filter spectra kept from an earlier call (`hit`), or, where this call's
  // are to be kept, the entry they are copied into block by block (`fill`). One entry holds
  // every block's spectra, in the blocks' order, so a call compares and fingerprints its
  // filter once however many blocks it takes.
  struct KeptSpectra {
    int64_t budget = 0;
    std::shared_ptr<const SpectrumCache::Entry> hit;
    std::shared_ptr<SpectrumCache::Entry> fill;
  };
  KeptSpectra FindKeptSpectra(const Frame& f, int64_t gblock) const {
    KeptSpectra k;
    k.budget = SpectrumCache::BudgetFromEnvironment();
    // What fixes the spectra besides the filter's bytes: the element type, the pass, the
    // transform, the filter's shape and dilation, and the blocks.
    static const char type_tag = 0;  // one per instantiation
    const SpectrumCache::Source source{
        {reinterpret_cast<intptr_t>(&type_tag), backprop_input, f.fh, f.fw, g.filter_h, g.filter_w,
         g.dilation_h, g.dilation_w, g.filter_in_c, g.out_c, g.groups, gblock, c.out_block, kChunk},
        filter,
        size_t(g.filter_elements()) * sizeof(T)};
    SpectrumCache& cache = SpectrumCache::Global();
    k.hit = cache.Find(source, k.budget);
    if (!k.hit && c.keep_spectra) {
      const int64_t values = KeptSpectraValues(g, pass(), c);  // every block's
      k.fill = cache.Begin(source, size_t(values) * sizeof(C), k.budget);
    }
    return k;
  }

  // The block's filter spectra: kept, or transformed into the workspace (and copied into
  // the entry being filled).
  const C* BlockSpectra(const Frame& f, const Block& b, const ParallelFor& pf,
                        const KeptSpectra& kept, int64_t offset) const {
    if (kept.hit) return static_cast<const C*>(kept.hit->spectra()) + offset;
    TransformFilters(f, b, pf);
    if (kept.fill) {
      std::copy_n(f.ws.shared(0), b.group_count * b.per_group * f.layout.bins,
                  static_cast<C*>(kept.fill->to_fill()) + offset);
    }
    return f.ws.shared(0);
  }

  // Phase 1: the block's filter spectra, shared by every slot. An item is a run of ns
  // source channels x nd destination channels of one group, whose taps are gathered into
  // the slot's spectra past the first `spread` (kSpread, or fewer in a slot of fewer
  // spectra; all free until the slot's items start). Each filter is placed in the slot's
  // real plane and transformed into one of those `spread` spectra; that many consecutive
  // sources' spectra are then spread over the chunks together, where their values of a
  // chunk lie side by side.
  static constexpr int64_t kSpread = 4;
  void TransformFilters(const Frame& f, const Block& b, const ParallelFor& pf) const {
    const R scale = R(1) / static_cast<R>(f.fh * f.fw);
    const int64_t rows = DilatedExtent(g.filter_h, g.dilation_h);
    const int64_t per = g.filter_h * g.filter_w;
    const int64_t spread = std::max<int64_t>(1, std::min(kSpread, f.layout.slot_spectra - 1));
    // Filters whose taps fit the slot's other spectra (a slot holds vec_block * (in_block +
    // out_block) spectra, at least ob + 1, and a filter's taps are fewer than a spectrum's
    // reals), in runs of whole destinations where they fit; the sources are cut into more
    // runs, up to one each, while there are fewer than two items a slot.
    const int64_t fit =
        std::max<int64_t>(1, (f.layout.slot_spectra - spread) * f.spec_stride * 2 / per);
    const int64_t nd = std::min(b.out_count, fit);
    const int64_t d_runs = CeilDiv(b.out_count, nd);
    int64_t s_runs = CeilDiv(f.src_per_group, std::max<int64_t>(1, fit / nd));
    while (b.group_count * s_runs * d_runs < 2 * c.slots && s_runs < f.src_per_group) ++s_runs;
    const int64_t ns = CeilDiv(f.src_per_group, s_runs);
    s_runs = CeilDiv(f.src_per_group, ns);
    RunSlots(pf, c.slots, b.group_count * s_runs * d_runs, f.fft_cost * ns * nd,
             [&](int64_t slot, int64_t idx) {
               const int64_t gl = idx / (s_runs * d_runs), run = idx % (s_runs * d_runs);
               const int64_t s0 = run / d_runs * ns, d0 = run % d_runs * nd;
               const int64_t sn = std::min(ns, f.src_per_group - s0),
                             dn = std::min(nd, b.out_count - d0);
               R* taps = reinterpret_cast<R*>(f.ws.spectrum(slot, spread));
               GatherFilters(taps, b.group0 + gl, s0, sn, b.out0 + d0, dn);
               for (int64_t d = 0; d < dn; ++d) {
                 for (int64_t s1 = 0; s1 < sn; s1 += spread) {
                   const int64_t m = std::min(spread, sn - s1);
                   for (int64_t s = 0; s < m; ++s) {
                     PlaceFilter(f.ws.real(slot), taps + ((s1 + s) * dn + d) * per);
                     R2C(f.ws.real(slot), f.ws.spectrum(slot, s), f.fh, f.fw, rows, scale);
                   }
                   SpreadSpectra(f, b, slot, m, gl, s0 + s1, d0 + d);
                 }
               }
               StreamFence();
             });
  }

  // Copies the slot's first m spectra, those of sources [sc, sc + m) to destination k of
  // group offset gl, into the block's chunks.
  void SpreadSpectra(const Frame& f, const Block& b, int64_t slot, int64_t m, int64_t gl,
                     int64_t sc, int64_t k) const {
    for (int64_t i0 = 0; i0 < f.layout.bins; i0 += kChunk) {
      const int64_t width = std::min(kChunk, f.layout.bins - i0);
      C* out = f.ws.shared(0) + FilterOffset(f, b, gl, sc, k, i0);
      for (int64_t s = 0; s < m; ++s) {
        StreamCopy(f.ws.spectrum(slot, s) + i0, width, out + s * width);
      }
    }
  }

  // Phase 2, one item.
  void CorrelateTile(const Frame& f, const Block& b, int64_t slot, const Item& it) const {
    AccumulateSources(f, b, slot, it);
    StoreTile(f, b, slot, it);
  }
};

template <typename T>
void FftForward(const ConvGeometry& g, const FftConfig& c, const T* input, const T* filter,
                T* output, void* workspace, const ParallelFor& pf) {
  if (g.output_elements() == 0) return;
  Correlation<T> job{{{{g, c, c.tiling, false, input, filter, output}}}};
  job.Run(workspace, pf);
}

template <typename T>
void FftBackpropInput(const ConvGeometry& g, const FftConfig& c, const T* filter,
                      const T* out_backprop, T* in_backprop, void* workspace,
                      const ParallelFor& pf) {
  if (g.input_elements() == 0) return;
  Correlation<T> job{{{{g, c, c.tiling, true, out_backprop, filter, in_backprop}}}};
  job.Run(workspace, pf);
}

}  // namespace
}  // namespace fft_internal

#ifndef LARGECONV_ISA_NS  // the planner's share, compiled once (isa.h)
int64_t FftWorkspaceBytes(const ConvGeometry& g, ConvPass pass, const FftConfig& c,
                          int real_bytes) {
  return fft_internal::MakeLayout(g, pass, c, real_bytes).total;
}

double TransformCountOf(ConvPass pass, double tiles, int64_t groups, int64_t icpg_count,
                        int64_t ocpg_count, int64_t in_block, int64_t out_block, double strided) {
  const double icpg = icpg_count, ocpg = ocpg_count;
  switch (pass) {
    case ConvPass::kForward: {
      const double blocks = CeilDiv(ocpg_count, out_block);
      return FilterTransformCount(groups, icpg_count, ocpg_count) +
             tiles * (icpg * blocks + ocpg * strided);
    }
    case ConvPass::kBackpropInput: {
      const double blocks = CeilDiv(icpg_count, out_block);
      return FilterTransformCount(groups, icpg_count, ocpg_count) +
             tiles * (ocpg * blocks * strided + icpg);
    }
    case ConvPass::kBackpropFilter: {
      const double ib = CeilDiv(icpg_count, in_block);
      const double ob = CeilDiv(ocpg_count, out_block);
      return tiles * (icpg * ob + ocpg * ib * strided) +
             FilterTransformCount(groups, icpg_count, ocpg_count);
    }
  }
  return 0;
}

int64_t KeptSpectraValues(const ConvGeometry& g, ConvPass pass, const FftConfig& c) {
  const PassChannels ch = g.channels(pass);
  return g.groups * ch.src_per_group * ch.dst_per_group * (c.fft_h * (c.fft_w / 2 + 1));
}

// Both count the pass's transforms with TransformCountOf: the points weigh the strided
// ones (the forward pass's inverse transforms, the gradients' stuffed out_backprop tiles)
// at their decimated share.
double FftTransformPoints(const ConvGeometry& g, ConvPass pass, const FftConfig& c) {
  const FftTiling& t = c.tiling;
  const double tiles = static_cast<double>(g.batch) * t.tiles_h * t.tiles_w * g.groups;
  const auto [dh, dw] = fft_internal::PassDecimation(g, pass, c);
  return TransformCountOf(pass, tiles, g.groups, g.in_c_per_group(), g.out_c_per_group(),
                          c.in_block, c.out_block, 1.0 / static_cast<double>(dh * dw)) *
         static_cast<double>(c.fft_h) * c.fft_w;
}

double FftTransformCount(const ConvGeometry& g, ConvPass pass, const FftConfig& c) {
  const FftTiling& t = c.tiling;
  const double tiles = static_cast<double>(g.batch) * t.tiles_h * t.tiles_w * g.groups;
  return TransformCountOf(pass, tiles, g.groups, g.in_c_per_group(), g.out_c_per_group(),
                          c.in_block, c.out_block);
}

#else  // a level's kernels
template <typename T>
void FftPass(const ConvGeometry& g, ConvPass pass, const FftConfig& c, const T* a, const T* b,
             T* out, void* workspace, const ParallelFor& pf) {
  using Kernel = void (*)(const ConvGeometry&, const FftConfig&, const T*, const T*, T*, void*,
                          const ParallelFor&);
  constexpr Kernel kKernels[] = {fft_internal::FftForward<T>,  // by ConvPass
                                 fft_internal::FftBackpropInput<T>,
                                 fft_internal::FftBackpropFilter<T>};
  static_assert(std::size(kKernels) == std::size(kPasses), "a kernel for every pass");
  kKernels[static_cast<int>(pass)](g, c, a, b, out, workspace, pf);
}

template <typename T>
bool AllFinite(const T* p, int64_t n, const ParallelFor& pf) {
  return ParallelAll(
      p, n,
      [](const T* q, int64_t count) {
        if constexpr (std::is_floating_point_v<T>) {
          // v * 0 is 0 for a finite v and NaN for an infinite or NaN one, so a sum of them
          // is 0 exactly when all are finite. Float arithmetic vectorises with AVX alone;
          // the test of the exponent bits needs the 256-bit integer operations of AVX2.
          constexpr int kLanes = 32 / sizeof(T);
          T acc[kLanes] = {};
          int64_t i = 0;
          for (; i + kLanes <= count; i += kLanes) {
            for (int l = 0; l < kLanes; ++l) acc[l] += q[i + l] * T(0);
          }
          for (; i < count; ++i) acc[0] += q[i] * T(0);
          T sum = 0;
          for (T a : acc) sum += a;
          return sum == T(0);
        } else {
          int64_t failures = 0;  // an integer sum vectorises where a bool chain does not
          for (int64_t i = 0; i < count; ++i) failures += IsFinite(q[i]) ? 0 : 1;
          return failures == 0;
        }
      },
      pf);
}

#define LARGECONV_INSTANTIATE_FFT(T, NAME, TF_WORD)                                             \
  template bool AllFinite<T>(const T*, int64_t, const ParallelFor&);                            \
  template void FftPass<T>(const ConvGeometry&, ConvPass, const FftConfig&, const T*, const T*, \
                           T*, void*, const ParallelFor&);
LARGECONV_FOR_EACH_FLOAT_DTYPE(LARGECONV_INSTANTIATE_FFT)
#undef LARGECONV_INSTANTIATE_FFT
#endif  // LARGECONV_ISA_NS

LARGECONV_ISA_END
}  // namespace largeconv
