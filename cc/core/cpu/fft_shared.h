// What the CPU's FFT kernels (2-D fft.cc, 3-D fft3d.cc) share: running items in slots,
// and the spectral multiply-add every overlap-save correlation is made of.
#ifndef TF_LARGECONV_CORE_CPU_FFT_SHARED_H_
#define TF_LARGECONV_CORE_CPU_FFT_SHARED_H_

#include <algorithm>
#include <atomic>
#include <complex>
#include <cstdint>
#include <functional>

#ifdef __AVX__
#include <immintrin.h>
#endif

#include "cc/core/common/parallel.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cpu/fft.h"
#include "cc/core/cpu/isa.h"

namespace largeconv {
LARGECONV_ISA_BEGIN

// How a pass's workspace is carved up: spectra shared by all slots (a block's filter
// spectra), then per slot its spectra and real planes (a plane: one transform's real
// points).
struct Layout {
  int64_t bins = 0;            // complex bins of one spectrum
  int64_t shared_spectra = 0;  // filter spectra shared by all slots
  int64_t slot_spectra = 0;    // spectra owned by each slot
  int64_t slot_scratch = 0;    // complex values of each slot's scratch (fft_gemm.h), if any
  int64_t spectrum_bytes = 0, plane_bytes = 0, real_planes = 1;
  int64_t slot_bytes = 0, shared_bytes = 0, total = 0;
};

// The byte sizes of a layout whose counts (bins, spectra, real planes) are set, for planes
// of `plane_points` reals of `rb` bytes and `slots` slots.
inline Layout FinishLayout(Layout l, int64_t plane_points, int64_t slots, int rb) {
  constexpr int64_t kAlign = 64;
  l.spectrum_bytes = AlignUp(l.bins * 2 * rb, kAlign);
  l.plane_bytes = AlignUp(plane_points * rb, kAlign);
  l.shared_bytes = l.shared_spectra * l.spectrum_bytes;
  l.slot_bytes = l.slot_spectra * l.spectrum_bytes + l.real_planes * l.plane_bytes +
                 AlignUp(l.slot_scratch * 2 * rb, kAlign);
  // Whole multiples of 256 bytes, the granule TF's CPU allocator counts in, so the planned
  // number is exactly what the allocator reports.
  l.total = (l.shared_bytes + slots * l.slot_bytes + 255) / 256 * 256;
  return l;
}

// Typed views of the workspace.
template <typename R>
struct Workspace {
  using C = std::complex<R>;
  char* base;
  Layout layout;
  C* shared(int64_t i) const { return reinterpret_cast<C*>(base + i * layout.spectrum_bytes); }
  char* slot_base(int64_t s) const { return base + layout.shared_bytes + s * layout.slot_bytes; }
  C* spectrum(int64_t s, int64_t i) const {
    return reinterpret_cast<C*>(slot_base(s) + i * layout.spectrum_bytes);
  }
  R* real(int64_t s, int64_t plane = 0) const {
    return reinterpret_cast<R*>(slot_base(s) + layout.slot_spectra * layout.spectrum_bytes +
                                plane * layout.plane_bytes);
  }
  C* scratch(int64_t s) const { return reinterpret_cast<C*>(real(s, layout.real_planes)); }
};

// Runs fn(slot, item) for items [0, items) in at most `slots` slots that execute
// concurrently; a slot's buffers are touched by one thread only. Each slot takes the next
// item not yet taken, so a slot whose core runs slower (another process on it) takes
// fewer: every item computes its own outputs whole, in a fixed order, so which slot runs it
// changes no result.
inline void RunSlots(const ParallelFor& pf, int64_t slots, int64_t items, double cost_per_item,
                     const std::function<void(int64_t, int64_t)>& fn) {
  if (items <= 0) return;
  const int64_t s = std::max<int64_t>(1, std::min(slots, items));
  const double cost = cost_per_item * static_cast<double>(CeilDiv(items, s));
  std::atomic<int64_t> next{0};
  pf(s, static_cast<int64_t>(std::min(cost, 1e15)) + 1, [&](int64_t b, int64_t e) {
    for (int64_t slot = b; slot < e; ++slot) {
      for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < items;
           i = next.fetch_add(1, std::memory_order_relaxed)) {
        fn(slot, i);
      }
    }
  });
}

// Copies n complex values from src to dst. Where dst is 32-byte aligned and the values
// fill whole 32-byte registers, with non-temporal stores: the block's filter spectra are
// written once, far apart, and read back after the whole block's are, so a cache line read
// for ownership before each store would only double their traffic. StreamFence orders such
// stores before the writer's later ones (the end of an item, before other slots read).
template <typename R>
void StreamCopy(const std::complex<R>* src, int64_t n, std::complex<R>* dst) {
#ifdef __AVX__
  const int64_t bytes = n * static_cast<int64_t>(sizeof(std::complex<R>));
  if (reinterpret_cast<uintptr_t>(dst) % 32 == 0 && bytes % 32 == 0) {
    const char* s = reinterpret_cast<const char*>(src);
    char* d = reinterpret_cast<char*>(dst);
    for (int64_t i = 0; i < bytes; i += 32) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    }
    return;
  }
#endif
  std::copy_n(src, n, dst);
}
inline void StreamFence() {
#ifdef __AVX__
  _mm_sfence();
#endif
}

// acc += a * conj(b) over n complex bins, written on interleaved reals so it vectorises.
template <typename R>
void MacConj(std::complex<R>* acc, const std::complex<R>* a, const std::complex<R>* b, int64_t n) {
  R* __restrict o = reinterpret_cast<R*>(acc);
  const R* __restrict x = reinterpret_cast<const R*>(a);
  const R* __restrict y = reinterpret_cast<const R*>(b);
  for (int64_t i = 0; i < n; ++i) {
    const R xr = x[2 * i], xi = x[2 * i + 1], yr = y[2 * i], yi = y[2 * i + 1];
    o[2 * i] += xr * yr + xi * yi;
    o[2 * i + 1] += xi * yr - xr * yi;
  }
}

// A set of spectra at a fixed stride: spectrum (o, s) starts at base + o * o_stride +
// s * s_stride complex values.
template <typename R>
struct Spectra {
  std::complex<R>* base;
  int64_t o_stride, s_stride;
  std::complex<R>* at(int64_t o, int64_t s) const { return base + o * o_stride + s * s_stride; }
};

// The spectral products of a block of sources into a block of outputs, over bins [i0, i1):
// for each output o,
//   acc(o) += sum over s of per(o, s) * conj(shared(s))   (kConjPer false), or
//   acc(o) += sum over s of shared(s) * conj(per(o, s))   (kConjPer true),
// the sum over the ns sources formed first, in source order, then added to acc(o); with
// `assign`, acc(o) = that sum (the first block of sources: no zeroing pass, no read). The
// shared operand is what the outputs have in common (a filter spectrum applied to several
// tiles, or a tile's spectrum applied to several filters). Each product is formed from the
// shared value's real and imaginary parts broadcast to both halves of a complex value
// (x * re(y) and x * im(y), combined once per block of sources), so the bins never need
// de-interleaving, and a register block of outputs and bins stays in registers across the
// sources: each per-output value is loaded once, each shared value once per output pair.
template <typename R, bool kConjPer>
void MacScalar(int64_t i0, int64_t i1, int64_t ns, int64_t o0, int64_t o1, const Spectra<R>& acc,
               const Spectra<R>& shared, const Spectra<R>& per, bool assign) {
  for (int64_t o = o0; o < o1; ++o) {
    R* out = reinterpret_cast<R*>(acc.at(o, 0));
    for (int64_t i = i0; i < i1; ++i) {
      R re = 0, im = 0;
      for (int64_t s = 0; s < ns; ++s) {
        const R* y = reinterpret_cast<const R*>(shared.at(0, s) + i);
        const R* x = reinterpret_cast<const R*>(per.at(o, s) + i);
        // x * conj(y), or its conjugate y * conj(x).
        re += x[0] * y[0] + x[1] * y[1];
        im += kConjPer ? x[0] * y[1] - x[1] * y[0] : x[1] * y[0] - x[0] * y[1];
      }
      out[2 * i] = assign ? re : out[2 * i] + re;
      out[2 * i + 1] = assign ? im : out[2 * i + 1] + im;
    }
  }
}

#ifdef __AVX__
// One AVX register of interleaved complex values, float or double.
template <typename R>
struct AvxLanes;
template <>
struct AvxLanes<float> {
  using V = __m256;
  static constexpr int kComplex = 4;
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V Zero() { return _mm256_setzero_ps(); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V DupRe(V v) { return _mm256_moveldup_ps(v); }
  static V DupIm(V v) { return _mm256_movehdup_ps(v); }
  static V Swap(V v) { return _mm256_permute_ps(v, 0xB1); }
  static V NegIm(V v) {
    return _mm256_xor_ps(v, _mm256_set_ps(-0.f, 0.f, -0.f, 0.f, -0.f, 0.f, -0.f, 0.f));
  }
  static V Neg(V v) { return _mm256_xor_ps(v, _mm256_set1_ps(-0.f)); }
  // (a.re - b.re, a.im + b.im) for each complex value.
  static V AddSub(V a, V b) { return _mm256_addsub_ps(a, b); }
};
template <>
struct AvxLanes<double> {
  using V = __m256d;
  static constexpr int kComplex = 2;
  static V Load(const double* p) { return _mm256_loadu_pd(p); }
  static void Store(double* p, V v) { _mm256_storeu_pd(p, v); }
  static V Zero() { return _mm256_setzero_pd(); }
  static V Add(V a, V b) { return _mm256_add_pd(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_pd(a, b); }
  static V DupRe(V v) { return _mm256_movedup_pd(v); }
  static V DupIm(V v) { return _mm256_permute_pd(v, 0xF); }
  static V Swap(V v) { return _mm256_permute_pd(v, 0x5); }
  static V NegIm(V v) { return _mm256_xor_pd(v, _mm256_set_pd(-0.0, 0.0, -0.0, 0.0)); }
  static V Neg(V v) { return _mm256_xor_pd(v, _mm256_set1_pd(-0.0)); }
  static V AddSub(V a, V b) { return _mm256_addsub_pd(a, b); }
};

// kU registers of shared values from y: each value's real and imaginary part broadcast to
// both halves of its complex value.
template <typename R, int kU>
__attribute__((always_inline)) inline void BroadcastParts(const R* y, typename AvxLanes<R>::V* yr,
                                                          typename AvxLanes<R>::V* yi) {
  using L = AvxLanes<R>;
  for (int u = 0; u < kU; ++u) {
    const typename L::V yv = L::Load(y + u * 2 * L::kComplex);
    yr[u] = L::DupRe(yv);
    yi[u] = L::DupIm(yv);
  }
}

// kOuts outputs x kU registers of bins starting at bin i, summed over the ns sources.
// Inlined, like MacSources: the 2-D passes call them a chunk of eight bins at a time, where
// a call's overhead costs half the work with one source and three outputs.
template <typename R, bool kConjPer, int kOuts, int kU>
__attribute__((always_inline)) inline void MacRegisterBlock(int64_t i, int64_t ns, int64_t o0,
                                                            const Spectra<R>& acc,
                                                            const Spectra<R>& shared,
                                                            const Spectra<R>& per, bool assign) {
  using L = AvxLanes<R>;
  using V = typename L::V;
  constexpr int kReals = 2 * L::kComplex;  // reals in a register
  V re[kOuts][kU], im[kOuts][kU];          // per * re(shared), per * im(shared)
  for (int o = 0; o < kOuts; ++o) {
    for (int u = 0; u < kU; ++u) re[o][u] = im[o][u] = L::Zero();
  }
  for (int64_t s = 0; s < ns; ++s) {
    V yr[kU], yi[kU];
    BroadcastParts<R, kU>(reinterpret_cast<const R*>(shared.at(0, s) + i), yr, yi);
    for (int o = 0; o < kOuts; ++o) {
      const R* x = reinterpret_cast<const R*>(per.at(o0 + o, s) + i);
      for (int u = 0; u < kU; ++u) {
        const V xv = L::Load(x + u * kReals);
        re[o][u] = L::Add(re[o][u], L::Mul(xv, yr[u]));
        im[o][u] = L::Add(im[o][u], L::Mul(xv, yi[u]));
      }
    }
  }
  for (int o = 0; o < kOuts; ++o) {
    R* out = reinterpret_cast<R*>(acc.at(o0 + o, 0) + i);
    for (int u = 0; u < kU; ++u) {
      // x * conj(y) = (re.re + im.im, re.im - im.re); its conjugate negates the second.
      const V sum = kConjPer ? L::Add(L::NegIm(re[o][u]), L::Swap(im[o][u]))
                             : L::Add(re[o][u], L::NegIm(L::Swap(im[o][u])));
      L::Store(out + u * kReals, assign ? sum : L::Add(L::Load(out + u * kReals), sum));
    }
  }
}

// Eight float bins of interleaved complex values as a register of real parts and one of
// imaginary parts, in the bin order 0 1 4 5 2 3 6 7 (one shuffle each, no lane crossing);
// StoreSplit writes such a pair back in order.
__attribute__((always_inline)) inline void LoadSplit(const float* x, __m256* re, __m256* im) {
  const __m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8);
  *re = _mm256_shuffle_ps(a, b, 0x88);
  *im = _mm256_shuffle_ps(a, b, 0xDD);
}
__attribute__((always_inline)) inline void StoreSplit(float* o, __m256 re, __m256 im, bool assign) {
  __m256 lo = _mm256_unpacklo_ps(re, im), hi = _mm256_unpackhi_ps(re, im);
  if (!assign) {
    lo = _mm256_add_ps(_mm256_loadu_ps(o), lo);
    hi = _mm256_add_ps(_mm256_loadu_ps(o + 8), hi);
  }
  _mm256_storeu_ps(o, lo);
  _mm256_storeu_ps(o + 8, hi);
}

// kTiles tiles x one output x eight bins of MacSplit, the tiles' split sources in `split`
// (source s, tile m at (s * kTiles + m) * 16 floats: real parts, then imaginary ones).
template <int kTiles>
__attribute__((always_inline)) inline void MacSplitBlock(int64_t ns, const float* split,
                                                         const float* filter, int64_t f_stride,
                                                         int64_t prefetch, float* out,
                                                         int64_t out_stride, bool assign) {
  // The four real sums of x * conj(y), kept apart and in source order as MacRegisterBlock's
  // lanes keep them: sum xr yr, xi yi, xi yr and xr yi.
  __m256 rr[kTiles], ii[kTiles], ir[kTiles], ri[kTiles];
  for (int m = 0; m < kTiles; ++m) rr[m] = ii[m] = ir[m] = ri[m] = _mm256_setzero_ps();
  for (int64_t s = 0; s < ns; ++s) {
    const float* y = filter + s * f_stride;
    _mm_prefetch(reinterpret_cast<const char*>(y + prefetch), _MM_HINT_T0);
    __m256 yr, yi;
    LoadSplit(y, &yr, &yi);
    for (int m = 0; m < kTiles; ++m) {
      const __m256 xr = _mm256_loadu_ps(split + (s * kTiles + m) * 16);
      const __m256 xi = _mm256_loadu_ps(split + (s * kTiles + m) * 16 + 8);
      rr[m] = _mm256_add_ps(rr[m], _mm256_mul_ps(xr, yr));
      ii[m] = _mm256_add_ps(ii[m], _mm256_mul_ps(xi, yi));
      ir[m] = _mm256_add_ps(ir[m], _mm256_mul_ps(xi, yr));
      ri[m] = _mm256_add_ps(ri[m], _mm256_mul_ps(xr, yi));
    }
  }
  for (int m = 0; m < kTiles; ++m) {
    StoreSplit(out + m * out_stride, _mm256_add_ps(rr[m], ii[m]), _mm256_sub_ps(ir[m], ri[m]),
               assign);
  }
}

// MacSources<float, false> over the eight bins at each spectrum's start for a run of
// tiles sharing their filters, bit for bit wherever the sums are finite (a NaN from an
// overflow may differ in sign): acc(o, m) (output o, tile m) = (or +=) the sum
// over s of sources(m, s) * conj(filters(o, s)). Each pair of tiles' sources is split
// once into real and imaginary planes and serves every output; each filter value is split
// as it is read (a shuffle per part, where MacRegisterBlock broadcasts two per source and
// output), and the value `prefetch` complex values further on is fetched into cache, so
// that the filter stream, read once per run, is there when its turn comes.
inline void MacSplit(int64_t ns, int64_t tiles, int64_t outs, const Spectra<float>& acc,
                     const Spectra<float>& filters, const Spectra<float>& sources, int64_t prefetch,
                     bool assign) {
  alignas(32) float split[kSourceBlock * 2 * 16];  // a pair of tiles' sources: 2 KiB
  for (int64_t m0 = 0; m0 < tiles; m0 += 2) {
    const int pair = tiles - m0 >= 2 ? 2 : 1;
    for (int64_t s = 0; s < ns; ++s) {
      for (int m = 0; m < pair; ++m) {
        __m256 re, im;
        LoadSplit(reinterpret_cast<const float*>(sources.at(m0 + m, s)), &re, &im);
        _mm256_store_ps(split + (s * pair + m) * 16, re);
        _mm256_store_ps(split + (s * pair + m) * 16 + 8, im);
      }
    }
    for (int64_t o = 0; o < outs; ++o) {
      const float* y = reinterpret_cast<const float*>(filters.at(o, 0));
      float* out = reinterpret_cast<float*>(acc.at(o, m0));
      const int64_t f_stride = 2 * filters.s_stride, out_stride = 2 * acc.s_stride;
      if (pair == 2) {
        MacSplitBlock<2>(ns, split, y, f_stride, 2 * prefetch, out, out_stride, assign);
      } else {
        MacSplitBlock<1>(ns, split, y, f_stride, 2 * prefetch, out, out_stride, assign);
      }
    }
  }
}
#endif  // __AVX__

template <typename R, bool kConjPer>
__attribute__((always_inline)) inline void MacSources(int64_t i0, int64_t i1, int64_t ns,
                                                      int64_t outs, const Spectra<R>& acc,
                                                      const Spectra<R>& shared,
                                                      const Spectra<R>& per, bool assign) {
  int64_t i = i0;
#ifdef __AVX__
  // Two outputs x two registers of bins: the fastest register block measured here
  // (float, 16 sources, 1 to 4 outputs x 1 to 3 registers).
  constexpr int kOuts = 2, kU = 2;
  constexpr int64_t kStep = kU * AvxLanes<R>::kComplex;  // bins in a register block
  for (; i + kStep <= i1; i += kStep) {
    int64_t o = 0;
    for (; o + kOuts <= outs; o += kOuts) {
      MacRegisterBlock<R, kConjPer, kOuts, kU>(i, ns, o, acc, shared, per, assign);
    }
    if (o < outs) MacRegisterBlock<R, kConjPer, 1, kU>(i, ns, o, acc, shared, per, assign);
  }
#endif
  MacScalar<R, kConjPer>(i, i1, ns, 0, outs, acc, shared, per, assign);
}

// acc(o) += shared(s) * conj(per(o, s)) over bins [i0, i1), for s = 0, 1, ... in turn: each
// product is rounded and added to the output on its own, so the result does not depend
// on how many sources one call takes (the filter gradient's sweeps of tiles, whose length
// follows the thread count, give the same bits as one tile at a time). With `assign`, the
// outputs start from zero. Register blocks as MacSources'.
template <typename R>
void MacSweep(int64_t i0, int64_t i1, int64_t ns, int64_t outs, const Spectra<R>& acc,
              const Spectra<R>& shared, const Spectra<R>& per, bool assign) {
  int64_t i = i0;
#ifdef __AVX__
  using L = AvxLanes<R>;
  using V = typename L::V;
  constexpr int kU = 2;
  constexpr int kReals = 2 * L::kComplex;
  constexpr int64_t kStep = kU * L::kComplex;
  for (; i + kStep <= i1; i += kStep) {
    for (int64_t o0 = 0; o0 < outs; o0 += 2) {
      const int n_out = outs - o0 >= 2 ? 2 : 1;
      V a[2][kU];
      for (int o = 0; o < n_out; ++o) {
        const R* out = reinterpret_cast<const R*>(acc.at(o0 + o, 0) + i);
        for (int u = 0; u < kU; ++u) a[o][u] = assign ? L::Zero() : L::Load(out + u * kReals);
      }
      for (int64_t s = 0; s < ns; ++s) {
        V yr[kU], yi[kU];
        BroadcastParts<R, kU>(reinterpret_cast<const R*>(shared.at(0, s) + i), yr, yi);
        for (int u = 0; u < kU; ++u) yr[u] = L::Neg(yr[u]);  // -yr, for AddSub below
        for (int o = 0; o < n_out; ++o) {
          const R* x = reinterpret_cast<const R*>(per.at(o0 + o, s) + i);
          for (int u = 0; u < kU; ++u) {
            const V xv = L::Load(x + u * kReals);
            // y * conj(x) = (xr yr + xi yi, xr yi - xi yr), as MacRegisterBlock's kConjPer:
            // (xi yi, xr yi) minus (-xr yr) in the real part, plus (-xi yr) in the
            // imaginary one. The negation is exact, so the sum is bitwise the same as
            // (xr yr, -xi yr) + (xi yi, xr yi), one instruction fewer a register.
            a[o][u] = L::Add(a[o][u], L::AddSub(L::Swap(L::Mul(xv, yi[u])), L::Mul(xv, yr[u])));
          }
        }
      }
      for (int o = 0; o < n_out; ++o) {
        R* out = reinterpret_cast<R*>(acc.at(o0 + o, 0) + i);
        for (int u = 0; u < kU; ++u) L::Store(out + u * kReals, a[o][u]);
      }
    }
  }
#endif
  for (int64_t o = 0; o < outs; ++o) {
    R* out = reinterpret_cast<R*>(acc.at(o, 0));
    for (int64_t k = i; k < i1; ++k) {
      R re = assign ? R(0) : out[2 * k], im = assign ? R(0) : out[2 * k + 1];
      for (int64_t s = 0; s < ns; ++s) {
        const R* y = reinterpret_cast<const R*>(shared.at(0, s) + k);
        const R* x = reinterpret_cast<const R*>(per.at(o, s) + k);
        re += x[0] * y[0] + x[1] * y[1];
        im += x[0] * y[1] - x[1] * y[0];
      }
      out[2 * k] = re;
      out[2 * k + 1] = im;
    }
  }
}

LARGECONV_ISA_END
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CPU_FFT_SHARED_H_
