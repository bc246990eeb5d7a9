// Many channels' spectral products of the 2-D FFT as one complex matrix product per
// frequency bin, by Eigen's matrix product kernel, run single-threaded inside the kernels'
// own parallel loop (where fft.h's UsesGemm holds):
//  forward and backprop-input (fft_products.h): [destinations x sources] x
//                  [sources x tiles], the filter spectra conjugated;
//  backprop-filter (fft_filter_gradient.h): [input channels x tiles] x [tiles x output
//                  channels], over the tiles of one sweep, the out_backprop spectra
//                  conjugated.
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

// Bins of one gather: the forward filter spectra's chunk (CorrelationFrame::kChunk).
constexpr int64_t kGemmBins = 8;
// Each product's rows and columns are padded with zeros to multiples of these: Eigen's
// register blocks (2 packets of rows, 4 columns at every level here), so every output is
// computed by the same micro-kernel in the same order, wherever it sits in the product and
// however many rows or columns the plan (whose blocks follow the thread count) gives an
// item. The depth (the forward passes' block of sources, the filter gradient's sweep of
// tiles) never follows the thread count.
constexpr int64_t kGemmRowAlign = 16, kGemmColAlign = 8;

// A pass's products: rows, columns and depth of its configuration's largest product.
struct GemmShape {
  int64_t rows, cols, depth;
};
inline GemmShape GemmShapeOf(ConvPass pass, const FftConfig& c) {
  if (WritesFilter(pass)) return {c.in_block, c.out_block, c.vec_block};
  return {c.out_block, c.vec_block, c.in_block};
}

// Complex values of a slot's scratch for the products (0 where UsesGemm does not hold):
// kGemmBins bins of both operands, gathered, and of their products.
inline int64_t GemmScratchValues(const ConvGeometry& g, ConvPass pass, const FftConfig& c) {
  if (!UsesGemm(g, pass, c)) return 0;
  const GemmShape s = GemmShapeOf(pass, c);
  const int64_t rows = AlignUp(s.rows, kGemmRowAlign), cols = AlignUp(s.cols, kGemmColAlign);
  return kGemmBins * (s.depth * (rows + cols) + rows * cols);
}

// acc(r, q) = (or += with !assign) the sum over d < depth of left(r, d) * right(q, d), one
// of the two conjugated (kConjLeft: the left), over the `width` bins (at most kGemmBins)
// at each spectrum's start, for r < rows and q < cols. `scratch` holds GemmScratchValues
// for these rows, columns and depth at least.
template <typename R, bool kConjLeft>
void GemmProducts(int64_t width, int64_t depth, int64_t rows, int64_t cols, const Spectra<R>& acc,
                  const Spectra<R>& left, const Spectra<R>& right, std::complex<R>* scratch,
                  bool assign) {
  using C = std::complex<R>;
  using RowMajor = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using ColMajor = Eigen::Matrix<C, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>;
  const int64_t pr = AlignUp(rows, kGemmRowAlign), pc = AlignUp(cols, kGemmColAlign);
  // Per bin: the left [pr x depth] row by row, the right [depth x pc] column by column,
  // the products [pr x pc] column by column.
  C* lhs = scratch;
  C* rhs = lhs + kGemmBins * pr * depth;
  C* prod = rhs + kGemmBins * depth * pc;
  for (int64_t bin = 0; bin < width; ++bin) {
    std::fill(lhs + (bin * pr + rows) * depth, lhs + (bin + 1) * pr * depth, C(0));
    std::fill(rhs + (bin * pc + cols) * depth, rhs + (bin + 1) * pc * depth, C(0));
  }
  const auto gather = [&](const Spectra<R>& from, int64_t count, int64_t padded, C* to) {
    for (int64_t r = 0; r < count; ++r) {
      for (int64_t d = 0; d < depth; ++d) {
        const C* in = from.at(r, d);
        for (int64_t bin = 0; bin < width; ++bin) to[(bin * padded + r) * depth + d] = in[bin];
      }
    }
  };
  gather(left, rows, pr, lhs);
  gather(right, cols, pc, rhs);
  for (int64_t bin = 0; bin < width; ++bin) {
    const Eigen::Map<const RowMajor> a(lhs + bin * pr * depth, pr, depth);
    const Eigen::Map<const ColMajor> b(rhs + bin * depth * pc, depth, pc);
    Eigen::Map<ColMajor> p(prod + bin * pr * pc, pr, pc);
    if constexpr (kConjLeft) {
      p.noalias() = a.conjugate() * b;
    } else {
      p.noalias() = a * b.conjugate();
    }
  }
  for (int64_t q = 0; q < cols; ++q) {
    for (int64_t r = 0; r < rows; ++r) {
      C* out = acc.at(r, q);
      const C* in = prod + q * pr + r;
      for (int64_t bin = 0; bin < width; ++bin) {
        const C v = in[bin * pr * pc];
        out[bin] = assign ? v : out[bin] + v;
      }
    }
  }
}

// GemmProducts over bins [0, bins), kGemmBins at a time, each spectrum whole.
template <typename R, bool kConjLeft>
void GemmOverBins(int64_t bins, int64_t depth, int64_t rows, int64_t cols, const Spectra<R>& acc,
                  const Spectra<R>& left, const Spectra<R>& right, std::complex<R>* scratch,
                  bool assign) {
  for (int64_t i0 = 0; i0 < bins; i0 += kGemmBins) {
    const auto at = [i0](const Spectra<R>& s) {
      return Spectra<R>{s.base + i0, s.o_stride, s.s_stride};
    };
    GemmProducts<R, kConjLeft>(std::min(kGemmBins, bins - i0), depth, rows, cols, at(acc), at(left),
                               at(right), scratch, assign);
  }
}

}  // namespace fft_internal
LARGECONV_ISA_END
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CPU_FFT_GEMM_H_
