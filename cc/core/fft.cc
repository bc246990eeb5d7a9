// FFT overlap-save convolution. All three passes are correlations computed tile by tile:
//   forward:         y[p]  = sum_k x_pad[p + k] w_dil[k]         (then keep every stride-th p)
//   backprop-input:  dx[p] = sum_k dy_z[p + pt - KE + 1 + k] w_dil[KE - 1 - k]
//   backprop-filter: dw[k] = sum_p x_pad[p + k] dy_z[p]          (summed over batch and tiles)
// where dy_z is out_backprop zero-stuffed by the stride and w_dil the dilated filter. A
// correlation of a tile with a short kernel is IFFT(FFT(tile) * conj(FFT(kernel))); the
// first tile - KE + 1 outputs of each transform are exact (overlap-save).
#include "cc/core/fft.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <functional>
#include <iterator>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cc/core/dtypes.h"
#include "cc/core/ducc.h"
#include "cc/core/fft_shared.h"
#include "cc/core/spectrum_cache.h"

namespace largeconv {
namespace {

Layout MakeLayout(const ConvGeometry& g, ConvPass pass, const FftConfig& c, int rb) {
  Layout l;
  l.bins = c.fft_h * (c.fft_w / 2 + 1);
  l.real_planes = c.vec_block;
  if (pass == ConvPass::kBackpropFilter) {
    // Per slot: the unit's accumulators, then one sweep's out_backprop and input spectra
    // (with one group, vec_block tiles of each channel; see FilterGradient), for each of
    // vb batched groups.
    const int64_t vb = BatchesTiles(g, c) ? 1 : c.vec_block;
    const int64_t sweep = BatchesTiles(g, c) ? c.vec_block : 1;
    l.shared_spectra = 0;
    l.slot_spectra = vb * (c.in_block * c.out_block + sweep * (c.in_block + c.out_block));
    l.real_planes = vb;
  } else {  // the block's filter spectra (source channels x out_block), shared by the slots
    l.shared_spectra = c.group_block * g.channels(pass).src_per_group * c.out_block;
    l.slot_spectra = c.vec_block * (c.in_block + c.out_block);
    // A run of tiles is loaded into and stored from its spectra (Correlation::InPlace):
    // one real plane, for the filter transforms.
    if (BatchesTiles(g, c)) l.real_planes = 1;
  }
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

// --- Strides in the spectrum --------------------------------------------------------------
//
// With a stride s dividing the transform's side f, a pass need not transform at full size
// what has data (or is wanted) at only every s-th position:
//   - a zero-stuffed tile x_z (out_backprop, in backprop-input and backprop-filter), with
//     data d[m] = x_z[sigma + s m] only, has the spectrum
//       X[k] = e^(-2 pi i k sigma / f) D[k mod f / s],
//     D the transform of d, of size f / s;
//   - the kept outputs z[m] = y[rho + s m] of a strided forward pass are the inverse of
//     size f / s of the folded spectrum
//       Z[k'] = sum over a < s of Y[k' + a f / s] e^(2 pi i (k' + a f / s) rho / f).
// Both hold per dimension; a real transform's half spectrum supplies the other half by
// Hermitian symmetry (Y[kh, kw] = conj(Y[-kh, -kw])). Transforms shrink by s per
// dimension, which for a stride of 2 takes three quarters of those transforms' work away.

// The factors (dh, dw) by which strides (sh, sw) shrink a pass's transforms of fh x fw.
std::pair<int64_t, int64_t> DecimationFactors(int64_t fh, int64_t fw, int64_t sh, int64_t sw) {
  // A side shrinks by its stride where the stride divides it.
  const int64_t dh = sh > 1 && fh % sh == 0 ? sh : 1, dw = sw > 1 && fw % sw == 0 ? sw : 1;
  // None where a decimated plane transformed in place (rows of 2 (fw / dw / 2 + 1) reals)
  // would not fit in a real plane of fh x fw.
  if (fh / dh * 2 * (fw / dw / 2 + 1) > fh * fw) return {1, 1};
  return {dh, dw};
}

std::pair<int64_t, int64_t> PassDecimation(const ConvGeometry& g, ConvPass pass,
                                           const FftConfig& c) {
  // Rows of height 1 run in batches of tiles (conv1d's runs), which DUCC vectorises across;
  // decimated, backprop-input's stuffed sources would be transformed a tile at a time
  // (TransformStuffedSource), slower than the batch of full rows (kLineBlock, plan.cc).
  if (pass == ConvPass::kBackpropInput && c.fft_h == 1 && BatchesTiles(g, c)) return {1, 1};
  return DecimationFactors(c.fft_h, c.fft_w, g.stride_h, g.stride_w);
}

// e^(sign 2 pi i k r / f) for k < f, one table per residue r < factor, row r at r * f.
template <typename R>
std::vector<std::complex<R>> Twiddles(int64_t f, int64_t factor, int sign) {
  std::vector<std::complex<R>> t;
  if (factor <= 1) return t;
  t.resize(size_t(factor * f));
  for (int64_t r = 0; r < factor; ++r) {
    for (int64_t k = 0; k < f; ++k) {
      const double a = sign * 2.0 * M_PI * static_cast<double>(Mod(k * r, f)) / f;
      t[size_t(r * f + k)] =
          std::complex<R>(static_cast<R>(std::cos(a)), static_cast<R>(std::sin(a)));
    }
  }
  return t;
}

// How a pass's stuffed sources or strided outputs map onto transforms of (fh / dh) x
// (fw / dw): the factors and the twiddle tables (sign -1 for sources, +1 for outputs).
template <typename R>
struct Decimation {
  int64_t fh = 0, fw = 0, dh = 1, dw = 1;
  std::vector<std::complex<R>> tw_h, tw_w;
  bool on() const { return dh > 1 || dw > 1; }
  int64_t mh() const { return fh / dh; }
  int64_t mw() const { return fw / dw; }
  int64_t bins_w() const { return mw() / 2 + 1; }  // of a decimated half spectrum row
  // Reals between the rows of a decimated plane transformed in place.
  int64_t pitch() const { return SpectrumPitch(mw()); }
  const std::complex<R>* twiddle_h(int64_t r) const { return r ? tw_h.data() + r * fh : nullptr; }
  const std::complex<R>* twiddle_w(int64_t r) const { return r ? tw_w.data() + r * fw : nullptr; }
};

// For a pass's transforms of fft_h x fft_w (see PassDecimation); sign -1 for stuffed
// sources, +1 for strided outputs.
template <typename R>
Decimation<R> MakeDecimation(const ConvGeometry& g, ConvPass pass, const FftConfig& c, int sign) {
  Decimation<R> d;
  d.fh = c.fft_h;
  d.fw = c.fft_w;
  std::tie(d.dh, d.dw) = PassDecimation(g, pass, c);
  const int64_t fh = d.fh, fw = d.fw;
  d.tw_h = Twiddles<R>(fh, d.dh, sign);
  d.tw_w = Twiddles<R>(fw, d.dw, sign);
  return d;
}

// a * b, without the library's handling of infinities (std::complex's operator* calls out
// of line for it unless compiled for limited range), which costs more than the rest here.
template <typename R>
inline std::complex<R> Times(std::complex<R> a, std::complex<R> b) {
  return {a.real() * b.real() - a.imag() * b.imag(), a.real() * b.imag() + a.imag() * b.real()};
}

// x (fh x (fw / 2 + 1)): the spectrum of a zero-stuffed plane from d (the decimated
// plane's half spectrum, rows d.bins_w() apart), its data at residues (sig_h, sig_w).
template <typename R>
void ExpandStuffed(const Decimation<R>& dec, const std::complex<R>* d, std::complex<R>* x,
                   int64_t sig_h, int64_t sig_w) {
  using C = std::complex<R>;
  const int64_t mh = dec.mh(), mw = dec.mw(), dbw = dec.bins_w(), bw = dec.fw / 2 + 1;
  const C* th = dec.twiddle_h(sig_h);
  const C* tw = dec.twiddle_w(sig_w);
  for (int64_t kh = 0; kh < dec.fh; ++kh) {
    const int64_t a = kh % mh;
    const C* row = d + a * dbw;
    const C* mirror = d + Mod(-a, mh) * dbw;  // row -a: the other half of row a
    C* out = x + kh * bw;
    // Columns kw = b + t mw for b < mw: b <= mw / 2 from the row, the rest mirrored.
    for (int64_t k0 = 0; k0 < bw; k0 += mw) {
      const int64_t direct = std::min(bw - k0, mw / 2 + 1), end = std::min(mw, bw - k0);
      std::copy_n(row, direct, out + k0);
      for (int64_t b = direct; b < end; ++b) out[k0 + b] = std::conj(mirror[mw - b]);
    }
    if (tw && th) {
      const C f = th[kh];
      for (int64_t kw = 0; kw < bw; ++kw) out[kw] = Times(out[kw], Times(tw[kw], f));
    } else if (tw) {
      for (int64_t kw = 0; kw < bw; ++kw) out[kw] = Times(out[kw], tw[kw]);
    } else if (th) {
      const C f = th[kh];
      for (int64_t kw = 0; kw < bw; ++kw) out[kw] = Times(out[kw], f);
    }
  }
}

// The spectra x + j * x_stride (j < planes) of zero-stuffed tiles whose decimated planes
// were loaded into their first reals (rows dec.pitch() apart, `data` the rows holding
// data), with data at residues (sig_h, sig_w): the planes are transformed in place in one
// batch, then each decimated spectrum, copied to `scratch` (room for one), expanded over
// its own spectrum. A decimated plane in place takes no more reals than a full spectrum
// (DecimationFactors' condition), so channels loaded together fit their own spectra.
template <typename R>
void TransformStuffedInPlace(const Decimation<R>& dec, std::complex<R>* x, int64_t planes,
                             int64_t x_stride, RowRange data, R* scratch, int64_t sig_h,
                             int64_t sig_w) {
  using C = std::complex<R>;
  R2CBatch(reinterpret_cast<const R*>(x), x, planes, 2 * x_stride, x_stride, dec.mh(), dec.mw(),
           dec.pitch(), data);
  C* small = reinterpret_cast<C*>(scratch);
  for (int64_t j = 0; j < planes; ++j) {
    std::copy_n(x + j * x_stride, dec.mh() * dec.bins_w(), small);
    ExpandStuffed(dec, small, x + j * x_stride, sig_h, sig_w);
  }
}

// z (the decimated half spectrum, rows dec.bins_w() apart): y (fh x (fw / 2 + 1)) folded so
// that its inverse of (fh / dh) x (fw / dw) is y's inverse at positions
// (rho_h + dh m, rho_w + dw n).
template <typename R>
void FoldStrided(const Decimation<R>& dec, const std::complex<R>* y, std::complex<R>* z,
                 int64_t rho_h, int64_t rho_w) {
  using C = std::complex<R>;
  const int64_t mh = dec.mh(), mw = dec.mw(), zbw = dec.bins_w(), bw = dec.fw / 2 + 1;
  const C* th = dec.twiddle_h(rho_h);
  const C* tw = dec.twiddle_w(rho_w);
  for (int64_t kh0 = 0; kh0 < mh; ++kh0) {
    R* out = reinterpret_cast<R*>(z + kh0 * zbw);
    std::fill(out, out + 2 * zbw, R(0));
    for (int64_t a = 0; a < dec.dh; ++a) {
      const int64_t kh = kh0 + a * mh;
      const R* row = reinterpret_cast<const R*>(y + kh * bw);
      // Y[kh, kw] = conj(Y[-kh, fw - kw]) for the columns beyond the half spectrum.
      const R* mirror = reinterpret_cast<const R*>(y + Mod(-kh, dec.fh) * bw);
      for (int64_t b = 0; b < dec.dw; ++b) {
        const int64_t kw0 = b * mw;
        const int64_t direct = std::clamp<int64_t>(bw - kw0, 0, zbw);
        if (!tw && !th) {  // the common case: sums of runs, the mirrored one reversed
          const R* in = row + 2 * kw0;
          for (int64_t k = 0; k < 2 * direct; ++k) out[k] += in[k];
          const R* m = mirror + 2 * (dec.fw - kw0);
          for (int64_t k = direct; k < zbw; ++k) {
            out[2 * k] += m[-2 * k];
            out[2 * k + 1] -= m[-2 * k + 1];
          }
          continue;
        }
        C* outc = reinterpret_cast<C*>(out);
        const C f = th ? th[kh] : C(1);
        for (int64_t k = 0; k < zbw; ++k) {
          const int64_t kw = kw0 + k;
          const C v = k < direct ? reinterpret_cast<const C*>(row)[kw]
                                 : std::conj(reinterpret_cast<const C*>(mirror)[dec.fw - kw]);
          outc[k] += Times(v, tw ? Times(tw[kw], f) : f);
        }
      }
    }
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

// p read at decimated size: in each dimension the decimation divides, the data positions
// are consecutive, without the stuffing.
template <typename T, typename R>
Plane<T> Unstuffed(Plane<T> p, const Decimation<R>& dec) {
  if (dec.dh > 1) p.stuff_h = 1;
  if (dec.dw > 1) p.stuff_w = 1;
  return p;
}

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

// Forward and backprop-input share this engine: dst[p] = sum_k src[p + off + k] filt[k],
// summed over the group's source channels, for every destination channel.
template <typename T>
struct Correlation {
  using R = AccT<T>;
  using C = std::complex<R>;
  const ConvGeometry& g;
  const FftConfig& c;
  FftTiling t;
  bool backprop_input;
  const T* src;
  const T* filter;
  T* dst;

  ConvPass pass() const { return backprop_input ? ConvPass::kBackpropInput : ConvPass::kForward; }

  // Writes the dilated filter for (source channel sc, destination channel dc) into rows
  // [0, keh) of real (the only rows its transform reads), flipped for backprop-input, where
  // the roles of input and output channels swap.
  void PlaceFilter(R* real, int64_t grp, int64_t sc, int64_t dc) const {
    const int64_t keh = DilatedExtent(g.filter_h, g.dilation_h),
                  kew = DilatedExtent(g.filter_w, g.dilation_w);
    std::fill(real, real + keh * c.fft_w, R(0));
    const int64_t ci = backprop_input ? dc : sc;
    const int64_t co = grp * g.out_c_per_group() + (backprop_input ? sc : dc);
    for (int64_t kh = 0; kh < g.filter_h; ++kh) {
      for (int64_t kw = 0; kw < g.filter_w; ++kw) {
        int64_t r = kh * g.dilation_h, q = kw * g.dilation_w;
        if (backprop_input) {
          r = keh - 1 - r;
          q = kew - 1 - q;
        }
        real[r * c.fft_w + q] = static_cast<R>(
            Load(filter[((kh * g.filter_w + kw) * g.filter_in_c + ci) * g.out_c + co]));
      }
    }
  }

  int64_t SourceChannelStride() const {
    return backprop_input ? g.output_strides().c : g.input_strides().c;
  }

  Plane<T> SourcePlane(int64_t n, int64_t channel) const {
    if (backprop_input) {
      const Strides4 s = g.output_strides();
      return {src + n * s.n + channel * s.c, s.h, s.w, g.out_h, g.out_w, g.stride_h, g.stride_w};
    }
    const Strides4 s = g.input_strides();
    return {src + n * s.n + channel * s.c, s.h, s.w, g.in_h, g.in_w, 1, 1};
  }

  // What every phase of a run reads: the workspace, the transform and the offsets between
  // dense positions of the source and the destination.
  struct Frame {
    Layout l;
    Workspace<R> ws;
    int64_t fh, fw, scpg, dcpg;
    int64_t off_h, off_w;    // dense output p reads source dense position p + off + k
    int64_t out_sh, out_sw;  // destination stride: dense positions kept (forward)
    Strides4 ds;             // destination element strides
    double fft_cost;
    int64_t real_stride, spec_stride;  // between a slot's batched planes / spectra
    // Strides in the spectrum: the backprop-input pass's zero-stuffed sources, or the
    // forward pass's strided outputs.
    Decimation<R> dec;
  };

  // One block of work: gb groups from g0 (several only when whole groups fit a block), and
  // destination channels [ob0, ob0 + ob) of each; vb groups share one batched transform,
  // or, with `tiles` (one group), vb consecutive tiles of an image do.
  struct Block {
    int64_t g0, gb, ob0, ob, per_group, vb;
    bool tiles;
    int64_t sb;  // source channels whose spectra a slot holds at once (in_block)
    // The block's filter spectra, read only: in the workspace, or kept from an earlier call.
    const C* spectra = nullptr;
  };

  // One item of a slot: nb batched planes, plane j holding group gi0 + j of tile `tile`
  // of image n; or with `tiles`, group gi0 of the j-th tile counted on from that one
  // through the batch (per_image tiles an image).
  struct Item {
    int64_t gi0, nb, n, tile, per_image;
    bool tiles;
    int64_t group(int64_t j) const { return tiles ? gi0 : gi0 + j; }
    int64_t image(int64_t j) const { return tiles ? n + (tile + j) / per_image : n; }
    int64_t tile_of(int64_t j) const { return tiles ? (tile + j) % per_image : tile; }
  };

  // The first dense position (row, column) of tile `tile`.
  std::pair<int64_t, int64_t> TileOrigin(int64_t tile) const {
    return {tile / t.tiles_w * t.tile_h, tile % t.tiles_w * t.tile_w};
  }

  Frame MakeFrame(void* workspace) const {
    Frame f;
    f.l = MakeLayout(g, pass(), c, sizeof(R));
    f.ws = Workspace<R>{static_cast<char*>(workspace), f.l};
    f.fh = c.fft_h;
    f.fw = c.fft_w;
    f.scpg = g.channels(pass()).src_per_group;
    f.dcpg = g.channels(pass()).dst_per_group;
    const int64_t keh = DilatedExtent(g.filter_h, g.dilation_h),
                  kew = DilatedExtent(g.filter_w, g.dilation_w);
    f.off_h = backprop_input ? g.pad_top - keh + 1 : -g.pad_top;
    f.off_w = backprop_input ? g.pad_left - kew + 1 : -g.pad_left;
    f.out_sh = backprop_input ? 1 : g.stride_h;
    f.out_sw = backprop_input ? 1 : g.stride_w;
    f.ds = backprop_input ? g.input_strides() : g.output_strides();
    f.fft_cost = 5.0 * f.fh * f.fw * std::log2(static_cast<double>(f.fh * f.fw) + 2);
    f.real_stride = f.l.plane_bytes / sizeof(R);
    f.spec_stride = f.l.spectrum_bytes / sizeof(C);
    f.dec = MakeDecimation<R>(g, pass(), c, backprop_input ? -1 : 1);
    return f;
  }

  // The residue modulo the stride of the transform positions holding tile `tile`'s data
  // (backprop-input's stuffed sources) or its kept outputs (forward), per dimension.
  std::pair<int64_t, int64_t> Residues(const Frame& f, int64_t tile) const {
    const auto [p0_h, p0_w] = TileOrigin(tile);
    if (backprop_input) {  // source dense q = origin + u holds data where q % stride == 0
      return {Mod(-(p0_h + f.off_h + t.shift_h), f.dec.dh),
              Mod(-(p0_w + f.off_w + t.shift_w), f.dec.dw)};
    }
    // Output p = p0 + r, kept where p % stride == 0, sits at transform position r - shift.
    return {Mod(-(p0_h + t.shift_h), f.dec.dh), Mod(-(p0_w + t.shift_w), f.dec.dw)};
  }

  void Run(void* workspace, const ParallelFor& pf) const {
    const Frame f = MakeFrame(workspace);
    const int64_t per_image = t.tiles_h * t.tiles_w;
    // Groups are taken group_block at a time (only with whole groups per block).
    const int64_t gblock = c.out_block >= f.dcpg ? std::max<int64_t>(1, c.group_block) : 1;
    KeptSpectra kept = FindKeptSpectra(f, gblock);
    int64_t offset = 0;  // of the block's filter spectra among the pass's, in complex values
    for (int64_t g0 = 0; g0 < g.groups; g0 += gblock) {
      const int64_t gb = std::min(gblock, g.groups - g0);
      for (int64_t ob0 = 0; ob0 < f.dcpg; ob0 += c.out_block) {
        const int64_t ob = std::min(c.out_block, f.dcpg - ob0);
        // vec_block batches groups, or for a single group consecutive tiles (the planner's
        // choice for rows of height 1, whose transforms vectorise across the batch).
        const bool tiles = BatchesTiles(g, c);
        const int64_t all_tiles = g.batch * per_image;
        const int64_t vb = std::max<int64_t>(1, std::min(c.vec_block, tiles ? all_tiles : gb));
        Block b{g0,          gb, ob0,   ob,
                f.scpg * ob, vb, tiles, std::max<int64_t>(1, std::min(c.in_block, f.scpg))};
        b.spectra = BlockSpectra(f, b, pf, kept, offset);
        offset += b.gb * b.per_group * f.l.bins;
        const double tile_cost = f.fft_cost * (f.scpg + ob) + 8.0 * f.l.bins * f.scpg * ob;
        if (tiles) {  // an item is vb consecutive tiles of the batch
          RunSlots(pf, c.slots, CeilDiv(all_tiles, vb), tile_cost * vb,
                   [&](int64_t slot, int64_t item) {
                     const int64_t first = item * vb;
                     CorrelateTile(f, b, slot,
                                   Item{0, std::min(vb, all_tiles - first), first / per_image,
                                        first % per_image, per_image, true});
                   });
          continue;
        }
        // An item is up to vb groups of one tile of one image. Group runs vary fastest, so
        // one image's tile is reused from cache by all of them.
        const int64_t group_runs = CeilDiv(gb, vb);
        RunSlots(pf, c.slots, group_runs * all_tiles, tile_cost * vb,
                 [&](int64_t slot, int64_t item) {
                   const int64_t gi0 = item % group_runs * vb;
                   item /= group_runs;
                   CorrelateTile(f, b, slot,
                                 Item{gi0, std::min(vb, gb - gi0), item / per_image,
                                      item % per_image, per_image, false});
                 });
      }
    }
    if (kept.fill) SpectrumCache::Global().Keep(std::move(kept.fill), kept.budget);
  }

  // The block's filter spectra are stored for the products' order of reading: in chunks
  // of kChunk bins, chunk by chunk; within a chunk, filter by filter, the filters of a
  // group ordered by destination channel, then source channel. A register block of the
  // products (two destinations, a chunk, every source) then reads two sequential runs,
  // and a whole chunk's products read the chunk's filter values front to back, where one
  // spectrum per (source, destination) pair made as many separate streams. Measured
  // against whole spectra read pair by pair: level on a 2-D pass, faster on conv1d's.
  static constexpr int64_t kChunk = 8;
  // Where filter (group offset gl, source sc, destination k) at bins [i0, i0 + kChunk)
  // sits among the block's spectra, i0 a multiple of kChunk.
  int64_t FilterOffset(const Frame& f, const Block& b, int64_t gl, int64_t sc, int64_t k,
                       int64_t i0) const {
    const int64_t width = std::min(kChunk, f.l.bins - i0);
    return i0 * b.gb * b.per_group + (gl * b.per_group + k * f.scpg + sc) * width;
  }
  // The chunk for the products, which only read it (Spectra views are untyped as to const).
  C* FilterChunk(const Frame& f, const Block& b, int64_t gl, int64_t sc, int64_t k,
                 int64_t i0) const {
    return const_cast<C*>(b.spectra) + FilterOffset(f, b, gl, sc, k, i0);
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
    if (!k.hit) {
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
      std::copy_n(f.ws.shared(0), b.gb * b.per_group * f.l.bins,
                  static_cast<C*>(kept.fill->to_fill()) + offset);
    }
    return f.ws.shared(0);
  }

  // Phase 1: the block's filter spectra, shared by every slot. Each is transformed into the
  // slot's first spectrum (free until the slot's items start; only the filter's rows
  // hold data) and spread over the chunks.
  void TransformFilters(const Frame& f, const Block& b, const ParallelFor& pf) const {
    const R scale = R(1) / static_cast<R>(f.fh * f.fw);
    RunSlots(pf, c.slots, b.gb * b.per_group, f.fft_cost, [&](int64_t slot, int64_t idx) {
      R* real = f.ws.real(slot);
      C* spectrum = f.ws.spectrum(slot, 0);
      const int64_t gl = idx / b.per_group, j = idx % b.per_group;
      const int64_t sc = j / b.ob, k = j % b.ob;
      PlaceFilter(real, b.g0 + gl, sc, b.ob0 + k);
      R2C(real, spectrum, f.fh, f.fw, DilatedExtent(g.filter_h, g.dilation_h), scale);
      for (int64_t i0 = 0; i0 < f.l.bins; i0 += kChunk) {
        std::copy(spectrum + i0, spectrum + std::min(f.l.bins, i0 + kChunk),
                  f.ws.shared(0) + FilterOffset(f, b, gl, sc, k, i0));
      }
    });
  }

  // Phase 2, one item.
  void CorrelateTile(const Frame& f, const Block& b, int64_t slot, const Item& it) const {
    AccumulateSources(f, b, slot, it);
    StoreTile(f, b, slot, it);
  }

  // Slot spectra: vb per source channel of a block (sb of them), then vb per destination
  // channel k.
  C* Source(const Frame& f, const Block& b, int64_t slot, int64_t s, int64_t j) const {
    return f.ws.spectrum(slot, s * b.vb + j);
  }
  C* Accumulator(const Frame& f, const Block& b, int64_t slot, int64_t k, int64_t j) const {
    return f.ws.spectrum(slot, (b.sb + k) * b.vb + j);
  }

  // Whether an item's spectra double as its real planes: with one group per tile (a single
  // group, or a run of tiles of one group) every (channel, tile) has spectra of its own, so
  // all of a block's source channels are loaded in one pass over the source (NHWC reads
  // whole runs of channels, however long the rows) into the spectra, transformed in place,
  // and the destination channels likewise inverse-transformed in place and stored in one
  // pass. Items of several groups at one tile go group-batched through the real planes.
  static bool InPlace(const Item& it) { return it.tiles || it.nb == 1; }

  // Loads source channel sc of the item's planes (consecutive groups at one tile) into the
  // slot's real planes; returns the rows that hold data.
  RowRange LoadSources(const Frame& f, const Block& b, int64_t slot, const Item& it,
                       int64_t sc) const {
    const auto [p0_h, p0_w] = TileOrigin(it.tile);
    return LoadTiles(f.ws.real(slot), f.real_stride, it.nb, f.scpg * SourceChannelStride(), f.fh,
                     f.fw, f.fw, SourcePlane(it.n, (b.g0 + it.gi0) * f.scpg + sc),
                     p0_h + f.off_h + t.shift_h, p0_w + f.off_w + t.shift_w, f.fh, f.fw);
  }

  // Loads source channels [sc0, sc0 + ns) of each of the item's tiles into their spectra
  // (InPlace items); returns the rows that hold data in any of them.
  RowRange LoadSourcesInPlace(const Frame& f, const Block& b, int64_t slot, const Item& it,
                              int64_t sc0, int64_t ns) const {
    RowRange all;
    for (int64_t j = 0; j < it.nb; ++j) {  // tiles start at different places: one each
      const auto [p0_h, p0_w] = TileOrigin(it.tile_of(j));
      const RowRange r =
          LoadTiles(reinterpret_cast<R*>(Source(f, b, slot, 0, j)), 2 * b.vb * f.spec_stride, ns,
                    SourceChannelStride(), f.fh, f.fw, SpectrumPitch(f.fw),
                    SourcePlane(it.image(j), (b.g0 + it.group(j)) * f.scpg + sc0),
                    p0_h + f.off_h + t.shift_h, p0_w + f.off_w + t.shift_w, f.fh, f.fw);
      if (r.last <= r.first) continue;
      all.first = all.last > all.first ? std::min(all.first, r.first) : r.first;
      all.last = std::max(all.last, r.last);
    }
    return all;
  }

  // Transforms the tile of each source channel, sb channels at a time, and accumulates
  // their products with the filter spectra into the destination channels' spectra (which
  // the first block of sources sets rather than adds to, every bin of every one).
  void AccumulateSources(const Frame& f, const Block& b, int64_t slot, const Item& it) const {
    for (int64_t sc0 = 0; sc0 < f.scpg; sc0 += b.sb) {
      const int64_t ns = std::min(b.sb, f.scpg - sc0);
      if (backprop_input && f.dec.on()) {
        TransformStuffedSources(f, b, slot, it, sc0, ns);
      } else if (InPlace(it)) {
        const RowRange data = LoadSourcesInPlace(f, b, slot, it, sc0, ns);
        for (int64_t s = 0; s < ns; ++s) {
          C* spec = Source(f, b, slot, s, 0);
          R2CBatch(reinterpret_cast<const R*>(spec), spec, it.nb, 2 * f.spec_stride, f.spec_stride,
                   f.fh, f.fw, SpectrumPitch(f.fw), data);
        }
      } else {
        for (int64_t s = 0; s < ns; ++s) {
          const RowRange data = LoadSources(f, b, slot, it, sc0 + s);
          R2CBatch(f.ws.real(slot), Source(f, b, slot, s, 0), it.nb, f.real_stride, f.spec_stride,
                   f.fh, f.fw, f.fw, data);
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
    const int64_t runs = it.tiles ? it.nb : 1, planes = it.tiles ? 1 : it.nb;
    for (int64_t run = 0; run < runs; ++run) {
      const int64_t tile = it.tile_of(run);
      const auto [p0_h, p0_w] = TileOrigin(tile);
      const auto [sig_h, sig_w] = Residues(f, tile);
      // Dense q = q0 + sig + d m holds plane element (q0 + sig) / d + m: a plane without
      // stuffing in each decimated dimension.
      int64_t q0_h = p0_h + f.off_h + t.shift_h, q0_w = p0_w + f.off_w + t.shift_w;
      if (dec.dh > 1) q0_h = (q0_h + sig_h) / dec.dh;
      if (dec.dw > 1) q0_w = (q0_w + sig_w) / dec.dw;
      auto plane = [&](int64_t sc) {
        return Unstuffed(SourcePlane(it.image(run), (b.g0 + it.group(run)) * f.scpg + sc), dec);
      };
      if (in_place) {
        C* first = Source(f, b, slot, 0, run);
        const int64_t stride = b.vb * f.spec_stride;  // between source channels
        const RowRange data =
            LoadTiles(reinterpret_cast<R*>(first), 2 * stride, ns, SourceChannelStride(), dec.mh(),
                      dec.mw(), dec.pitch(), plane(sc0), q0_h, q0_w, dec.mh(), dec.mw());
        TransformStuffedInPlace(dec, first, ns, stride, data, f.ws.real(slot), sig_h, sig_w);
        continue;
      }
      for (int64_t s = 0; s < ns; ++s) {
        R* real = f.ws.real(slot);
        const RowRange data =
            LoadTiles(real, f.real_stride, planes, f.scpg * SourceChannelStride(), dec.mh(),
                      dec.mw(), dec.pitch(), plane(sc0 + s), q0_h, q0_w, dec.mh(), dec.mw());
        R2CBatch(real, reinterpret_cast<C*>(real), planes, f.real_stride, f.real_stride / 2,
                 dec.mh(), dec.mw(), dec.pitch(), data);
        for (int64_t j = 0; j < planes; ++j) {
          ExpandStuffed(dec, reinterpret_cast<const C*>(real + j * f.real_stride),
                        Source(f, b, slot, s, run + j), sig_h, sig_w);
        }
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
    if (it.tiles) {
      // The item's tiles are of one group and share its filter spectra: each filter
      // spectrum (the shared operand) is applied to all the tiles at once.
      for (int64_t i0 = 0; i0 < f.l.bins; i0 += kChunk) {
        const int64_t width = std::min(kChunk, f.l.bins - i0);
        const Spectra<R> sources{Source(f, b, slot, 0, 0) + i0, ss, b.vb * ss};
        for (int64_t k = 0; k < b.ob; ++k) {
          MacSources<R, false>(0, width, ns, it.nb, {Accumulator(f, b, slot, k, 0) + i0, ss, 0},
                               {FilterChunk(f, b, it.gi0, sc0, k, i0), 0, width}, sources, assign);
        }
      }
      return;
    }
    for (int64_t j = 0; j < it.nb; ++j) {
      // One tile's source spectrum (the shared operand) is applied to every destination
      // channel's filter spectrum.
      for (int64_t i0 = 0; i0 < f.l.bins; i0 += kChunk) {
        const int64_t width = std::min(kChunk, f.l.bins - i0);
        MacSources<R, true>(0, width, ns, b.ob, {Accumulator(f, b, slot, 0, j) + i0, b.vb * ss, 0},
                            {Source(f, b, slot, 0, j) + i0, 0, b.vb * ss},
                            {FilterChunk(f, b, it.group(j), sc0, 0, i0), f.scpg * width, width},
                            assign);
      }
    }
  }

  // Inverse-transforms each destination channel's spectra and stores the item's wanted
  // (strided) outputs.
  void StoreTile(const Frame& f, const Block& b, int64_t slot, const Item& it) const {
    int64_t rows = 0;  // the most any of the item's tiles keeps
    for (int64_t j = 0; j < (it.tiles ? it.nb : 1); ++j) {
      rows = std::max(rows, std::min(t.tile_h, t.dense_h - TileOrigin(it.tile_of(j)).first));
    }
    // The inverse transforms' size, and the rows of them wanted: with strided outputs in
    // the spectrum, each accumulator is first folded to the decimated size.
    const bool folded = OutputsDecimated(f);
    const int64_t th = folded ? f.dec.mh() : f.fh, tw = folded ? f.dec.mw() : f.fw;
    int64_t row0 = -t.shift_h;
    if (folded) {
      for (int64_t k = 0; k < b.ob; ++k) {
        for (int64_t j = 0; j < it.nb; ++j) {
          const auto [rho_h, rho_w] = Residues(f, it.tile_of(j));
          C* acc = Accumulator(f, b, slot, k, j);
          C* scratch = reinterpret_cast<C*>(f.ws.real(slot));
          FoldStrided(f.dec, acc, scratch, rho_h, rho_w);
          std::copy_n(scratch, th * f.dec.bins_w(), acc);
        }
      }
      // Kept rows r of a tile (from the first, Mod(-p0, dh)) sit at decimated rows from
      // (r - shift - rho) / dh on; an item whose tiles start on different rows takes all.
      int64_t count = 0;
      bool same_start = true;
      for (int64_t j = 0; j < (it.tiles ? it.nb : 1); ++j) {
        const int64_t p0_h = TileOrigin(it.tile_of(j)).first;
        const int64_t first = Mod(-p0_h, f.dec.dh);
        const int64_t start =
            (Mod(first - t.shift_h, f.fh) - Residues(f, it.tile_of(j)).first) / f.dec.dh;
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
      for (int64_t k = 0; k < b.ob; ++k) {
        C* spec = Accumulator(f, b, slot, k, 0);
        C2RBatch(spec, reinterpret_cast<R*>(spec), it.nb, 2 * f.spec_stride, f.spec_stride, th, tw,
                 pitch, row0, rows);
      }
      for (int64_t j = 0; j < it.nb; ++j) {
        StorePlanes(f, reinterpret_cast<const R*>(Accumulator(f, b, slot, 0, j)), pitch, b.ob,
                    2 * b.vb * f.spec_stride, f.ds.c, (b.g0 + it.group(j)) * f.dcpg + b.ob0,
                    it.image(j), it.tile_of(j));
      }
      return;
    }
    for (int64_t k = 0; k < b.ob; ++k) {  // consecutive groups at one tile
      C2RBatch(Accumulator(f, b, slot, k, 0), f.ws.real(slot), it.nb, f.real_stride, f.spec_stride,
               th, tw, tw, row0, rows);
      StorePlanes(f, f.ws.real(slot), tw, it.nb, f.real_stride, f.dcpg * f.ds.c,
                  (b.g0 + it.gi0) * f.dcpg + b.ob0 + k, it.n, it.tile);
    }
  }

  // Whether the forward pass's strided outputs are taken from folded spectra (see
  // FoldStrided), whose inverse transforms hold only the kept outputs.
  bool OutputsDecimated(const Frame& f) const { return !backprop_input && f.dec.on(); }

  // Stores `planes` inverse-transformed real planes as tile `tile` of image n: plane j is
  // read from in + j * in_stride (rows `pitch` apart) and written to destination channel
  // channel0 + j * out_stride / ds.c.
  void StorePlanes(const Frame& f, const R* in0, int64_t pitch, int64_t planes, int64_t in_stride,
                   int64_t out_stride, int64_t channel0, int64_t n, int64_t tile) const {
    const auto [p0_h, p0_w] = TileOrigin(tile);
    const int64_t rows = std::min(t.tile_h, t.dense_h - p0_h);
    const int64_t cols = std::min(t.tile_w, t.dense_w - p0_w);
    int64_t c0 = 0;
    while (c0 < cols && (p0_w + c0) % f.out_sw != 0) ++c0;
    const int64_t ow0 = (p0_w + c0) / f.out_sw;
    const int64_t count = c0 < cols ? (cols - c0 + f.out_sw - 1) / f.out_sw : 0;
    // Output (r, c) sits at transform position (r - shift_h, c - shift_w) modulo the
    // transform size (the shift is 0 except for a wrap-around single tile); in a folded
    // transform, a kept position u at (u - rho) / d, in steps of out_sw / d.
    const bool folded = OutputsDecimated(f);
    const int64_t dh = folded ? f.dec.dh : 1, dw = folded ? f.dec.dw : 1;
    const auto [rho_h, rho_w] = folded ? Residues(f, tile) : std::pair<int64_t, int64_t>{0, 0};
    const int64_t width = f.fw / dw, step = f.out_sw / dw;
    const int64_t col0 = (Mod(c0 - t.shift_w, f.fw) - rho_w) / dw;
    const bool no_wrap = col0 + (count - 1) * step < width;
    T* out = dst + n * f.ds.n + channel0 * f.ds.c;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = p0_h + r;
      if (p % f.out_sh != 0) continue;
      T* orow = out + (p / f.out_sh) * f.ds.h + ow0 * f.ds.w;
      const R* in = in0 + (Mod(r - t.shift_h, f.fh) - rho_h) / dh * pitch;
      if (no_wrap && planes == 1 && step == 1 && f.ds.w == 1) {
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
            for (int64_t q = q0; q < q1; ++q) o[q * f.ds.w] = Store<T>(vq[q]);
            continue;
          }
          int64_t col = start;
          for (int64_t q = q0; q < q1; ++q) {
            o[q * f.ds.w] = Store<T>(v[col]);
            col += step;
            if (col >= width) col -= width;
          }
        }
      }
    }
  }
};

}  // namespace

int64_t FftWorkspaceBytes(const ConvGeometry& g, ConvPass pass, const FftConfig& c,
                          int real_bytes) {
  return MakeLayout(g, pass, c, real_bytes).total;
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
  const auto [dh, dw] = PassDecimation(g, pass, c);
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

namespace {

template <typename T>
void FftForward(const ConvGeometry& g, const FftConfig& c, const T* input, const T* filter,
                T* output, void* workspace, const ParallelFor& pf) {
  if (g.output_elements() == 0) return;
  Correlation<T> job{g, c, c.tiling, false, input, filter, output};
  job.Run(workspace, pf);
}

template <typename T>
void FftBackpropInput(const ConvGeometry& g, const FftConfig& c, const T* filter,
                      const T* out_backprop, T* in_backprop, void* workspace,
                      const ParallelFor& pf) {
  if (g.input_elements() == 0) return;
  Correlation<T> job{g, c, c.tiling, true, out_backprop, filter, in_backprop};
  job.Run(workspace, pf);
}

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

}  // namespace

template <typename T>
void FftPass(const ConvGeometry& g, ConvPass pass, const FftConfig& c, const T* a, const T* b,
             T* out, void* workspace, const ParallelFor& pf) {
  using Kernel = void (*)(const ConvGeometry&, const FftConfig&, const T*, const T*, T*, void*,
                          const ParallelFor&);
  constexpr Kernel kKernels[] = {FftForward<T>, FftBackpropInput<T>,  // by ConvPass
                                 FftBackpropFilter<T>};
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

}  // namespace largeconv
