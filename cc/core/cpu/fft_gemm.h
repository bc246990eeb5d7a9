// The spectral products of the 2-D FFT's forward and backprop-input correlations for many
// channels (fft_products.h, where fft.h's UsesGemm holds): the products of an item's tiles
// with the filter spectra as one complex matrix product per frequency bin,
// [destinations x sources] x [sources x tiles], by Eigen's matrix product kernel, run
// single-threaded inside the kernels' own parallel loop.
#ifndef TF_LARGECONV_CORE_CPU_FFT_GEMM_H_
#define TF_LARGECONV_CORE_CPU_FFT_GEMM_H_

#include <algorithm>
#include <complex>
#include <cstdint>

#include "cc/core/common/eigen.h"
#include "cc/core/common/geometry.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cpu/fft.h"
#include "cc/core/cpu/fft_shared.h"
#include "cc/core/cpu/isa.h"

namespace largeconv {
LARGECONV_ISA_BEGIN
namespace fft_internal {

// Bins of one gather: the filter spectra's chunk (CorrelationFrame::kChunk).
constexpr int64_t kGemmBins = 8;
// Each product's rows (destinations) and columns (tiles) are padded with zeros to multiples
// of these: Eigen's register blocks (2 packets of rows, 4 or 8 columns at every level here),
// so every output is computed by the same micro-kernel in the same order, wherever it sits
// in the product and however many tiles or destinations the plan (which follows the thread
// count) gives a run. The depth, the block of sources, never follows the thread count.
constexpr int64_t kGemmRowAlign = 16, kGemmColAlign = 8;

// Complex values of a slot's scratch for the products (0 where UsesGemm does not hold):
// a gather of kGemmBins bins of the block's filter spectra and of the run's source spectra,
// and the products of those bins.
inline int64_t GemmScratchValues(const ConvGeometry& g, ConvPass pass, const FftConfig& c) {
  if (!UsesGemm(g, pass, c)) return 0;
  const int64_t rows = AlignUp(c.out_block, kGemmRowAlign);
  const int64_t cols = AlignUp(c.vec_block, kGemmColAlign);
  return kGemmBins * (c.in_block * (rows + cols) + rows * cols);
}

// acc(k, m) = (or += with !assign) the sum over sources s < ns of sources(m, s) *
// conj(filters(k, s)), over the `width` bins (at most kGemmBins) at each spectrum's start,
// for destinations k < outs and tiles m < tiles: the filters in the chunk layout
// (filters.at(k, s), `width` bins each), the accumulators and sources whole spectra.
// `scratch` holds GemmScratchValues for outs, tiles and ns at most.
template <typename R>
void GemmProducts(int64_t width, int64_t ns, int64_t tiles, int64_t outs, const Spectra<R>& acc,
                  const Spectra<R>& filters, const Spectra<R>& sources, std::complex<R>* scratch,
                  bool assign) {
  using C = std::complex<R>;
  using RowMajor = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using ColMajor = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
  const int64_t rows = AlignUp(outs, kGemmRowAlign), cols = AlignUp(tiles, kGemmColAlign);
  // Per bin: the filters [rows x ns] row by row, the sources [ns x cols] column by column
  // (each tile's sources side by side), the products [rows x cols] column by column.
  C* filt = scratch;
  C* src = filt + kGemmBins * rows * ns;
  C* prod = src + kGemmBins * ns * cols;
  for (int64_t bin = 0; bin < width; ++bin) {
    std::fill(filt + (bin * rows + outs) * ns, filt + (bin + 1) * rows * ns, C(0));
    std::fill(src + (bin * cols + tiles) * ns, src + (bin + 1) * cols * ns, C(0));
  }
  for (int64_t k = 0; k < outs; ++k) {
    for (int64_t s = 0; s < ns; ++s) {
      const C* in = filters.at(k, s);
      for (int64_t bin = 0; bin < width; ++bin) filt[(bin * rows + k) * ns + s] = in[bin];
    }
  }
  for (int64_t m = 0; m < tiles; ++m) {
    for (int64_t s = 0; s < ns; ++s) {
      const C* in = sources.at(m, s);
      for (int64_t bin = 0; bin < width; ++bin) src[(bin * cols + m) * ns + s] = in[bin];
    }
  }
  for (int64_t bin = 0; bin < width; ++bin) {
    const Eigen::Map<const RowMajor> f(filt + bin * rows * ns, rows, ns);
    const Eigen::Map<const ColMajor> x(src + bin * ns * cols, ns, cols);
    Eigen::Map<ColMajor> p(prod + bin * rows * cols, rows, cols);
    p.noalias() = f.conjugate() * x;
  }
  for (int64_t m = 0; m < tiles; ++m) {
    for (int64_t k = 0; k < outs; ++k) {
      C* out = acc.at(k, m);
      const C* in = prod + m * rows + k;
      for (int64_t bin = 0; bin < width; ++bin) {
        const C v = in[bin * rows * cols];
        out[bin] = assign ? v : out[bin] + v;
      }
    }
  }
}

}  // namespace fft_internal
LARGECONV_ISA_END
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CPU_FFT_GEMM_H_
