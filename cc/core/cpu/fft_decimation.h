// Strides in the spectrum of the 2-D FFT passes (fft.cc): a zero-stuffed source
// transformed at the decimated size and expanded, a strided output folded before its
// inverse transform.
#ifndef TF_LARGECONV_CORE_CPU_FFT_DECIMATION_H_
#define TF_LARGECONV_CORE_CPU_FFT_DECIMATION_H_

#include <cmath>
#include <complex>
#include <cstdint>
#include <utility>
#include <vector>

#include "cc/core/common/geometry.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cpu/fft.h"
#include "cc/core/cpu/fft_layout.h"
#include "cc/core/cpu/isa.h"

namespace largeconv {
LARGECONV_ISA_BEGIN
namespace fft_internal {

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
inline std::pair<int64_t, int64_t> DecimationFactors(int64_t fh, int64_t fw, int64_t sh,
                                                     int64_t sw) {
  // A side shrinks by its stride where the stride divides it.
  const int64_t dh = sh > 1 && fh % sh == 0 ? sh : 1, dw = sw > 1 && fw % sw == 0 ? sw : 1;
  // None where a decimated plane transformed in place (rows of 2 (fw / dw / 2 + 1) reals)
  // would not fit in a real plane of fh x fw.
  if (fh / dh * 2 * (fw / dw / 2 + 1) > fh * fw) return {1, 1};
  return {dh, dw};
}

inline std::pair<int64_t, int64_t> PassDecimation(const ConvGeometry& g, ConvPass pass,
                                                  const FftConfig& c) {
  // Rows of height 1 run in batches of tiles (conv1d's runs), which DUCC vectorises across;
  // decimated, backprop-input's stuffed sources would be transformed a tile at a time
  // (TransformStuffedSource), slower than the batch of full rows (kLineBlock, plan/cost_model.h).
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
// plane's half spectrum, rows d.bins_w() apart), its data at residues (residue_h, residue_w).
template <typename R>
void ExpandStuffed(const Decimation<R>& dec, const std::complex<R>* d, std::complex<R>* x,
                   int64_t residue_h, int64_t residue_w) {
  using C = std::complex<R>;
  const int64_t mh = dec.mh(), mw = dec.mw(), dbw = dec.bins_w(), bw = dec.fw / 2 + 1;
  const C* th = dec.twiddle_h(residue_h);
  const C* tw = dec.twiddle_w(residue_w);
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
// data), with data at residues (residue_h, residue_w): the planes are transformed in place in one
// batch, then each decimated spectrum, copied to `scratch` (room for one), expanded over
// its own spectrum. A decimated plane in place takes no more reals than a full spectrum
// (DecimationFactors' condition), so channels loaded together fit their own spectra.
template <typename R>
void TransformStuffedInPlace(const Decimation<R>& dec, std::complex<R>* x, int64_t planes,
                             int64_t x_stride, RowRange data, R* scratch, int64_t residue_h,
                             int64_t residue_w) {
  using C = std::complex<R>;
  R2CBatch(reinterpret_cast<const R*>(x), x, planes, 2 * x_stride, x_stride, dec.mh(), dec.mw(),
           dec.pitch(), data);
  C* small = reinterpret_cast<C*>(scratch);
  for (int64_t j = 0; j < planes; ++j) {
    std::copy_n(x + j * x_stride, dec.mh() * dec.bins_w(), small);
    ExpandStuffed(dec, small, x + j * x_stride, residue_h, residue_w);
  }
}

// z (the decimated half spectrum, rows dec.bins_w() apart): y (fh x (fw / 2 + 1)) folded so
// that its inverse of (fh / dh) x (fw / dw) is y's inverse at positions
// (residue_h + dh m, residue_w + dw n).
template <typename R>
void FoldStrided(const Decimation<R>& dec, const std::complex<R>* y, std::complex<R>* z,
                 int64_t residue_h, int64_t residue_w) {
  using C = std::complex<R>;
  const int64_t mh = dec.mh(), mw = dec.mw(), zbw = dec.bins_w(), bw = dec.fw / 2 + 1;
  const C* th = dec.twiddle_h(residue_h);
  const C* tw = dec.twiddle_w(residue_w);
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

// p read at decimated size: in each dimension the decimation divides, the data positions
// are consecutive, without the stuffing.
template <typename T, typename R>
Plane<T> Unstuffed(Plane<T> p, const Decimation<R>& dec) {
  if (dec.dh > 1) p.stuff_h = 1;
  if (dec.dw > 1) p.stuff_w = 1;
  return p;
}

}  // namespace fft_internal
LARGECONV_ISA_END
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CPU_FFT_DECIMATION_H_
