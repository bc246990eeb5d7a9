// Where the 2-D FFT passes keep their data (fft.cc): the workspace layout of a pass, the
// tiles loaded from a tensor into real planes, and DUCC's batched transforms over them,
// pruned to the rows that hold data or are wanted.
#ifndef TF_LARGECONV_CORE_CPU_FFT_LAYOUT_H_
#define TF_LARGECONV_CORE_CPU_FFT_LAYOUT_H_

#include <algorithm>
#include <complex>
#include <cstdint>
#include <utility>

#include "cc/core/common/ducc.h"
#include "cc/core/common/geometry.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cpu/fft.h"
#include "cc/core/cpu/fft_gemm.h"
#include "cc/core/cpu/fft_shared.h"
#include "cc/core/cpu/isa.h"

namespace largeconv {
LARGECONV_ISA_BEGIN
namespace fft_internal {

// How a pass's workspace is carved up for a configuration (FftWorkspaceBytes: its total):
// by what the pass writes (WritesFilter), not by which pass it is.
inline Layout MakeLayout(const ConvGeometry& g, ConvPass pass, const FftConfig& c, int rb) {
  Layout l;
  l.bins = c.fft_h * (c.fft_w / 2 + 1);
  l.real_planes = c.vec_block;
  if (WritesFilter(pass)) {
    // Per slot: the unit's accumulators, then one sweep's out_backprop and input spectra
    // (with one group, vec_block tiles of each channel; see FilterGradient), for each of
    // group_batch batched groups.
    const int64_t group_batch = BatchesTiles(g, c) ? 1 : c.vec_block;
    const int64_t sweep = BatchesTiles(g, c) ? c.vec_block : 1;
    l.shared_spectra = 0;
    l.slot_spectra = group_batch * (c.in_block * c.out_block + sweep * (c.in_block + c.out_block));
    l.real_planes = group_batch;
  } else {  // the block's filter spectra (source channels x out_block), shared by the slots
    l.shared_spectra = c.group_block * g.channels(pass).src_per_group * c.out_block;
    l.slot_spectra = c.vec_block * (c.in_block + c.out_block);
    // A run of tiles is loaded into and stored from its spectra (CorrelationFrame::InPlace):
    // one real plane, for the filter transforms.
    if (BatchesTiles(g, c)) l.real_planes = 1;
  }
  l.slot_scratch = GemmScratchValues(g, pass, c);
  return FinishLayout(l, c.fft_h * c.fft_w, c.slots, rb);
}

// Reals between the rows of a half spectrum of width fw read as a real plane: a row's
// spectrum takes exactly its real row's place in a transform in place.
inline int64_t SpectrumPitch(int64_t fw) { return 2 * (fw / 2 + 1); }

// Rows [first, last) of a loaded tile hold data; the others are all zero.
struct RowRange {
  int64_t first = 0, last = 0;
};

// Batched versions over `count` planes laid out `real_stride` / `spec_stride` elements
// apart, real rows `pitch` reals apart (fw, or the spectrum's row of 2 * (fw / 2 + 1)
// reals for a transform in place, where each row's spectrum takes the row's own place):
// one DUCC call vectorises across the planes' lines.
//
// The forward transforms are pruned to the rows holding data: the width pass (real to
// complex) runs only over `data` (the spectrum rows of all-zero rows are zero), then the
// height pass over every frequency column, in place.
template <typename R>
void R2CBatch(const R* real, std::complex<R>* spec, int64_t count, int64_t real_stride,
              int64_t spec_stride, int64_t fh, int64_t fw, int64_t pitch, RowRange data,
              R fct = R(1)) {
  const int64_t bins_w = fw / 2 + 1;
  const int64_t first = std::max<int64_t>(0, data.first), last = std::min(fh, data.last);
  for (int64_t j = 0; j < count; ++j) {
    std::complex<R>* plane = spec + j * spec_stride;
    std::fill(plane, plane + first * bins_w, std::complex<R>(0));
    std::fill(plane + std::max(first, last) * bins_w, plane + fh * bins_w, std::complex<R>(0));
  }
  if (last > first) {
    ducc0::cfmav<R> in(real + first * pitch, {size_t(count), size_t(last - first), size_t(fw)},
                       {ptrdiff_t(real_stride), ptrdiff_t(pitch), 1});
    ducc0::vfmav<std::complex<R>> out(spec + first * bins_w,
                                      {size_t(count), size_t(last - first), size_t(bins_w)},
                                      {ptrdiff_t(spec_stride), ptrdiff_t(bins_w), 1});
    ducc0::r2c(in, out, size_t(2), true, fct, 1);
  }
  // A height of 1 (conv1d's geometry) needs no height pass, which DUCC would still run as a
  // copy over the whole spectrum (measured: 40% of a long row's transform).
  if (fh == 1) return;
  ducc0::vfmav<std::complex<R>> freq(spec, {size_t(count), size_t(fh), size_t(bins_w)},
                                     {ptrdiff_t(spec_stride), ptrdiff_t(bins_w), 1});
  ducc0::c2c(freq, freq, {1}, true, R(1), 1);
}

// One plane's forward transform, scaled by fct, of which only rows [0, rows) hold data.
template <typename R>
void R2C(const R* real, std::complex<R>* spec, int64_t fh, int64_t fw, int64_t rows, R fct) {
  R2CBatch(real, spec, 1, 0, 0, fh, fw, fw, RowRange{0, rows}, fct);
}

// Inverse transforms of `count` planes, pruned: only the `rows` output rows from `row0` on
// (modulo fh; the caller reads no others) are computed. The height pass runs over every
// frequency column, in place; the width pass (complex to real) only over the wanted rows,
// which saves (fh - rows) / fh of it. Destroys `spec`.
template <typename R>
void C2RBatch(std::complex<R>* spec, R* real, int64_t count, int64_t real_stride,
              int64_t spec_stride, int64_t fh, int64_t fw, int64_t pitch, int64_t row0,
              int64_t rows) {
  const int64_t bins_w = fw / 2 + 1;
  ducc0::vfmav<std::complex<R>> freq(spec, {size_t(count), size_t(fh), size_t(bins_w)},
                                     {ptrdiff_t(spec_stride), ptrdiff_t(bins_w), 1});
  if (fh > 1) ducc0::c2c(freq, freq, {1}, false, R(1), 1);  // no height pass at 1 (see R2CBatch)
  rows = std::min(rows, fh);
  row0 = Mod(row0, fh);
  // At most two runs of rows: [row0, fh) and the part that wraps round to 0.
  for (const auto& [first, n] : {std::pair<int64_t, int64_t>{row0, std::min(rows, fh - row0)},
                                 {0, rows - std::min(rows, fh - row0)}}) {
    if (n <= 0) continue;
    ducc0::cfmav<std::complex<R>> in(spec + first * bins_w,
                                     {size_t(count), size_t(n), size_t(bins_w)},
                                     {ptrdiff_t(spec_stride), ptrdiff_t(bins_w), 1});
    ducc0::vfmav<R> out(real + first * pitch, {size_t(count), size_t(n), size_t(fw)},
                        {ptrdiff_t(real_stride), ptrdiff_t(pitch), 1});
    ducc0::c2r(in, out, size_t(2), false, R(1), 1);
  }
}

// A 2-D plane of one (image, channel) of a tensor seen at "dense" positions q: the element
// at q is plane[q / stuff] when q >= 0 and q % stuff == 0 (zero-stuffing for strides),
// zero outside the plane.
template <typename T>
struct Plane {
  const T* base;  // element (n, 0, 0, channel)
  int64_t row_stride, col_stride, rows, cols, stuff_h, stuff_w;
};

// Fills `planes` tiles real + j * real_stride (each fh rows of fw, rows `pitch` apart) with
// the values of planes p.base + j * plane_stride at dense positions (q0_h + r, q0_w + c)
// for r < max_rows, c < max_cols; zero elsewhere.
template <typename T, typename R>
RowRange LoadTiles(R* real, int64_t real_stride, int64_t planes, int64_t plane_stride, int64_t fh,
                   int64_t fw, int64_t pitch, const Plane<T>& p, int64_t q0_h, int64_t q0_w,
                   int64_t max_rows, int64_t max_cols) {
  const int64_t rows = std::min(fh, max_rows), cols = std::min(fw, max_cols);
  int64_t c_first = std::max<int64_t>(0, -q0_w);
  while (c_first < cols && (q0_w + c_first) % p.stuff_w != 0) ++c_first;
  // Plane columns j_first, j_first + 1, ... land at tile columns c_first, + stuff_w, ...
  const int64_t j_first = c_first < cols ? (q0_w + c_first) / p.stuff_w : 0;
  const int64_t count =
      c_first < cols ? std::max<int64_t>(0, std::min(p.cols - j_first,
                                                     (cols - c_first + p.stuff_w - 1) / p.stuff_w))
                     : 0;
  // Zero what the copy below leaves: whole rows without data, and (without column
  // stuffing) the row ends around the copied run.
  auto row_has_data = [&](int64_t r) {
    const int64_t q = q0_h + r;
    return count > 0 && r < rows && q >= 0 && q % p.stuff_h == 0 && q / p.stuff_h < p.rows;
  };
  for (int64_t j = 0; j < planes; ++j) {
    R* plane = real + j * real_stride;
    for (int64_t r = 0; r < fh; ++r) {
      R* row = plane + r * pitch;
      if (!row_has_data(r) || p.stuff_w != 1) {
        std::fill(row, row + fw, R(0));
      } else {
        std::fill(row, row + c_first, R(0));
        std::fill(row + c_first + count, row + fw, R(0));
      }
    }
  }
  RowRange data;
  if (count == 0) return data;
  for (int64_t r = 0; r < rows; ++r) {
    if (!row_has_data(r)) continue;
    if (data.last == 0) data.first = r;
    data.last = r + 1;
    const int64_t i = (q0_h + r) / p.stuff_h;
    const T* src = p.base + i * p.row_stride + j_first * p.col_stride;
    R* out = real + r * pitch + c_first;
    if (planes == 1 && p.stuff_w == 1 && p.col_stride == 1) {
      for (int64_t k = 0; k < count; ++k) out[k] = static_cast<R>(Load(src[k]));
      continue;
    }
    // A run of kRun columns at a time, plane by plane: each output row is written in runs,
    // while the run's source segment (kRun x planes channels, interleaved in NHWC) stays in
    // L1 across the planes however long the row.
    constexpr int64_t kRun = 64;
    for (int64_t k0 = 0; k0 < count; k0 += kRun) {
      const int64_t k1 = std::min(count, k0 + kRun);
      for (int64_t j = 0; j < planes; ++j) {
        const T* s = src + j * plane_stride;
        R* o = out + j * real_stride;
        for (int64_t k = k0; k < k1; ++k) {
          o[k * p.stuff_w] = static_cast<R>(Load(s[k * p.col_stride]));
        }
      }
    }
  }
  return data;
}

}  // namespace fft_internal
LARGECONV_ISA_END
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CPU_FFT_LAYOUT_H_
