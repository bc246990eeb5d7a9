// Direct convolution kernels. Two inner-loop shapes per pass: when a group has many output
// channels the innermost loop runs over channels (contiguous in the HWIO filter); when it has
// few (e.g. 1-3, as in the 135x135x1x3 seed case or depthwise groups) it runs over output
// positions instead, so the vector units are never starved by a 3-long loop.
#include "cc/core/cpu/direct.h"

#include <algorithm>
#include <iterator>

#include "cc/core/common/dtypes.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cpu/isa.h"

namespace largeconv {
LARGECONV_ISA_BEGIN
namespace {

constexpr int64_t kManyChannels = 8;

// Range [lo, hi) of j in [0, n) with 0 <= (base + j) * stride + off < size.
inline void ValidRange(int64_t base, int64_t n, int64_t stride, int64_t off, int64_t size,
                       int64_t* lo, int64_t* hi) {
  *lo = std::max<int64_t>(0, CeilDiv(-off, stride) - base);
  *hi = std::min<int64_t>(n, FloorDiv(size - 1 - off, stride) + 1 - base);
  if (*hi < *lo) *hi = *lo;
}

// Fixed-order dot product with eight partial sums (vectorisable, deterministic).
template <typename T>
inline AccT<T> StridedDot(const T* a, int64_t sa, const T* b, int64_t sb, int64_t n) {
  using A = AccT<T>;
  A s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) s[l] += Load(a[(i + l) * sa]) * Load(b[(i + l) * sb]);
  }
  for (int l = 0; i < n; ++i, ++l) s[l] += Load(a[i * sa]) * Load(b[i * sb]);
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

inline int64_t CostHint(double ops) { return static_cast<int64_t>(std::min(ops, 1e15)) + 1; }

// ---------------------------------------------------------------------------------------
// Forward: one work unit per output row (n, oh).

template <typename T>
void ForwardRowsChannelInner(const ConvGeometry& g, const T* x, const T* w, T* y, int64_t t0,
                             int64_t t1) {
  using A = AccT<T>;
  constexpr int64_t TW = 16, TC = 64;
  A acc[TW * TC];
  const Strides4 xs = g.input_strides(), ys = g.output_strides();
  const int64_t icpg = g.in_c_per_group(), ocpg = g.out_c_per_group(), C = g.out_c;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = t / g.out_h, oh = t % g.out_h;
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      for (int64_t oc0 = 0; oc0 < ocpg; oc0 += TC) {
        const int64_t tc = std::min(TC, ocpg - oc0);
        for (int64_t ow0 = 0; ow0 < g.out_w; ow0 += TW) {
          const int64_t tw = std::min(TW, g.out_w - ow0);
          std::fill(acc, acc + tw * TC, A(0));
          for (int64_t kh = 0; kh < g.filter_h; ++kh) {
            const int64_t ih = oh * g.stride_h - g.pad_top + kh * g.dilation_h;
            if (ih < 0 || ih >= g.in_h) continue;
            for (int64_t kw = 0; kw < g.filter_w; ++kw) {
              const int64_t off = kw * g.dilation_w - g.pad_left;
              int64_t lo, hi;
              ValidRange(ow0, tw, g.stride_w, off, g.in_w, &lo, &hi);
              const T* wp = w + ((kh * g.filter_w + kw) * icpg) * C + grp * ocpg + oc0;
              for (int64_t i = lo; i < hi; ++i) {
                const int64_t iw = (ow0 + i) * g.stride_w + off;
                const T* xp = x + n * xs.n + ih * xs.h + iw * xs.w + grp * icpg * xs.c;
                A* a = acc + i * TC;
                for (int64_t ic = 0; ic < icpg; ++ic) {
                  const A xv = Load(xp[ic * xs.c]);
                  const T* wr = wp + ic * C;
                  for (int64_t c = 0; c < tc; ++c) a[c] += xv * Load(wr[c]);
                }
              }
            }
          }
          for (int64_t i = 0; i < tw; ++i) {
            T* yp = y + n * ys.n + oh * ys.h + (ow0 + i) * ys.w + (grp * ocpg + oc0) * ys.c;
            for (int64_t c = 0; c < tc; ++c) yp[c * ys.c] = Store<T>(acc[i * TC + c]);
          }
        }
      }
    }
  }
}

template <typename T>
void ForwardRowsPositionInner(const ConvGeometry& g, const T* x, const T* w, T* y, int64_t t0,
                              int64_t t1) {
  using A = AccT<T>;
  constexpr int64_t TW = 256, TC = kManyChannels;
  A acc[TC * TW];
  const Strides4 xs = g.input_strides(), ys = g.output_strides();
  const int64_t icpg = g.in_c_per_group(), ocpg = g.out_c_per_group(), C = g.out_c;
  const int64_t xstep = g.stride_w * xs.w;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = t / g.out_h, oh = t % g.out_h;
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      for (int64_t oc0 = 0; oc0 < ocpg; oc0 += TC) {
        const int64_t tc = std::min(TC, ocpg - oc0);
        for (int64_t ow0 = 0; ow0 < g.out_w; ow0 += TW) {
          const int64_t tw = std::min(TW, g.out_w - ow0);
          std::fill(acc, acc + TC * TW, A(0));
          for (int64_t kh = 0; kh < g.filter_h; ++kh) {
            const int64_t ih = oh * g.stride_h - g.pad_top + kh * g.dilation_h;
            if (ih < 0 || ih >= g.in_h) continue;
            for (int64_t kw = 0; kw < g.filter_w; ++kw) {
              const int64_t off = kw * g.dilation_w - g.pad_left;
              int64_t lo, hi;
              ValidRange(ow0, tw, g.stride_w, off, g.in_w, &lo, &hi);
              if (lo >= hi) continue;
              for (int64_t ic = 0; ic < icpg; ++ic) {
                // Pointer to the input element of position i = 0 (may lie outside the
                // row; only [lo, hi) is dereferenced).
                const T* xq = x + n * xs.n + ih * xs.h + (grp * icpg + ic) * xs.c;
                const int64_t iw0 = ow0 * g.stride_w + off;
                const T* wr = w + ((kh * g.filter_w + kw) * icpg + ic) * C + grp * ocpg + oc0;
                for (int64_t c = 0; c < tc; ++c) {
                  const A wv = Load(wr[c]);
                  A* a = acc + c * TW;
                  for (int64_t i = lo; i < hi; ++i) a[i] += wv * Load(xq[iw0 * xs.w + i * xstep]);
                }
              }
            }
          }
          for (int64_t c = 0; c < tc; ++c) {
            T* yp = y + n * ys.n + oh * ys.h + ow0 * ys.w + (grp * ocpg + oc0 + c) * ys.c;
            for (int64_t i = 0; i < tw; ++i) yp[i * ys.w] = Store<T>(acc[c * TW + i]);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Backprop input: one work unit per input row (n, ih); dx = sum over (kh, kw, oc) of
// dy[oh, ow, oc] * w[kh, kw, ic, oc] where ih = oh * stride - pad + kh * dilation.

template <typename T>
void BackpropInputRowsChannelInner(const ConvGeometry& g, const T* w, const T* dy, T* dx,
                                   int64_t t0, int64_t t1) {
  using A = AccT<T>;
  constexpr int64_t TW = 16, TC = 64;
  A acc[TW * TC];
  const Strides4 xs = g.input_strides(), ys = g.output_strides();
  const int64_t icpg = g.in_c_per_group(), ocpg = g.out_c_per_group(), C = g.out_c;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = t / g.in_h, ih = t % g.in_h;
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      for (int64_t ic0 = 0; ic0 < icpg; ic0 += TC) {
        const int64_t tc = std::min(TC, icpg - ic0);
        for (int64_t iw0 = 0; iw0 < g.in_w; iw0 += TW) {
          const int64_t tw = std::min(TW, g.in_w - iw0);
          std::fill(acc, acc + tw * TC, A(0));
          for (int64_t kh = 0; kh < g.filter_h; ++kh) {
            const int64_t num = ih + g.pad_top - kh * g.dilation_h;
            if (num < 0 || num % g.stride_h != 0) continue;
            const int64_t oh = num / g.stride_h;
            if (oh >= g.out_h) continue;
            for (int64_t kw = 0; kw < g.filter_w; ++kw) {
              const T* wp = w + ((kh * g.filter_w + kw) * icpg + ic0) * C + grp * ocpg;
              for (int64_t i = 0; i < tw; ++i) {
                const int64_t num2 = iw0 + i + g.pad_left - kw * g.dilation_w;
                if (num2 < 0 || num2 % g.stride_w != 0) continue;
                const int64_t ow = num2 / g.stride_w;
                if (ow >= g.out_w) continue;
                const T* dyp = dy + n * ys.n + oh * ys.h + ow * ys.w + grp * ocpg * ys.c;
                A* a = acc + i * TC;
                for (int64_t c = 0; c < tc; ++c) a[c] += StridedDot(dyp, ys.c, wp + c * C, 1, ocpg);
              }
            }
          }
          for (int64_t i = 0; i < tw; ++i) {
            T* xp = dx + n * xs.n + ih * xs.h + (iw0 + i) * xs.w + (grp * icpg + ic0) * xs.c;
            for (int64_t c = 0; c < tc; ++c) xp[c * xs.c] = Store<T>(acc[i * TC + c]);
          }
        }
      }
    }
  }
}

template <typename T>
void BackpropInputRowsPositionInner(const ConvGeometry& g, const T* w, const T* dy, T* dx,
                                    int64_t t0, int64_t t1) {
  using A = AccT<T>;
  constexpr int64_t TW = 256, TC = kManyChannels;
  A acc[TC * TW];
  const Strides4 xs = g.input_strides(), ys = g.output_strides();
  const int64_t icpg = g.in_c_per_group(), ocpg = g.out_c_per_group(), C = g.out_c;
  const int64_t sw = g.stride_w;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n = t / g.in_h, ih = t % g.in_h;
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      for (int64_t ic0 = 0; ic0 < icpg; ic0 += TC) {
        const int64_t tc = std::min(TC, icpg - ic0);
        for (int64_t iw0 = 0; iw0 < g.in_w; iw0 += TW) {
          const int64_t tw = std::min(TW, g.in_w - iw0);
          std::fill(acc, acc + TC * TW, A(0));
          for (int64_t kh = 0; kh < g.filter_h; ++kh) {
            const int64_t num = ih + g.pad_top - kh * g.dilation_h;
            if (num < 0 || num % g.stride_h != 0) continue;
            const int64_t oh = num / g.stride_h;
            if (oh >= g.out_h) continue;
            for (int64_t kw = 0; kw < g.filter_w; ++kw) {
              // Positions i with iw0 + i + off = ow * stride_w, 0 <= ow < out_w.
              const int64_t off = g.pad_left - kw * g.dilation_w;
              const int64_t ow_first = std::max<int64_t>(0, CeilDiv(iw0 + off, sw));
              const int64_t i_first = ow_first * sw - iw0 - off;
              if (i_first >= tw || ow_first >= g.out_w) continue;
              const int64_t steps = std::min(CeilDiv(tw - i_first, sw), g.out_w - ow_first);
              for (int64_t oc = 0; oc < ocpg; ++oc) {
                const T* dyq =
                    dy + n * ys.n + oh * ys.h + ow_first * ys.w + (grp * ocpg + oc) * ys.c;
                const T* wr = w + ((kh * g.filter_w + kw) * icpg + ic0) * C + grp * ocpg + oc;
                for (int64_t c = 0; c < tc; ++c) {
                  const A wv = Load(wr[c * C]);
                  A* a = acc + c * TW + i_first;
                  for (int64_t j = 0; j < steps; ++j) a[j * sw] += wv * Load(dyq[j * ys.w]);
                }
              }
            }
          }
          for (int64_t c = 0; c < tc; ++c) {
            T* xp = dx + n * xs.n + ih * xs.h + iw0 * xs.w + (grp * icpg + ic0 + c) * xs.c;
            for (int64_t i = 0; i < tw; ++i) xp[i * xs.w] = Store<T>(acc[c * TW + i]);
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Backprop filter: one work unit per (kh, kw, group, block of input channels); each unit
// owns its slice of dw and sums over batch and output positions in a fixed order.

constexpr int64_t kFilterTileIn = 8;

template <typename T>
void BackpropFilterUnits(const ConvGeometry& g, const T* x, const T* dy, T* dw, int64_t t0,
                         int64_t t1) {
  using A = AccT<T>;
  constexpr int64_t TI = kFilterTileIn, TO = 64;
  A acc[TI * TO];
  const Strides4 xs = g.input_strides(), ys = g.output_strides();
  const int64_t icpg = g.in_c_per_group(), ocpg = g.out_c_per_group(), C = g.out_c;
  const int64_t iblocks = (icpg + TI - 1) / TI;
  const bool many = ocpg >= kManyChannels;
  for (int64_t t = t0; t < t1; ++t) {
    int64_t r = t;
    const int64_t ib = r % iblocks;
    r /= iblocks;
    const int64_t grp = r % g.groups;
    r /= g.groups;
    const int64_t kw = r % g.filter_w, kh = r / g.filter_w;
    const int64_t ic0 = ib * TI, ti = std::min(TI, icpg - ic0);
    const int64_t off = kw * g.dilation_w - g.pad_left;
    int64_t lo, hi;
    ValidRange(0, g.out_w, g.stride_w, off, g.in_w, &lo, &hi);
    for (int64_t oc0 = 0; oc0 < ocpg; oc0 += TO) {
      const int64_t to = std::min(TO, ocpg - oc0);
      std::fill(acc, acc + TI * TO, A(0));
      for (int64_t n = 0; n < g.batch; ++n) {
        for (int64_t oh = 0; oh < g.out_h; ++oh) {
          const int64_t ih = oh * g.stride_h - g.pad_top + kh * g.dilation_h;
          if (ih < 0 || ih >= g.in_h || lo >= hi) continue;
          const T* xrow = x + n * xs.n + ih * xs.h + (grp * icpg + ic0) * xs.c;
          const T* yrow = dy + n * ys.n + oh * ys.h + (grp * ocpg + oc0) * ys.c;
          if (many) {
            for (int64_t ow = lo; ow < hi; ++ow) {
              const T* xp = xrow + (ow * g.stride_w + off) * xs.w;
              const T* yp = yrow + ow * ys.w;
              for (int64_t i = 0; i < ti; ++i) {
                const A xv = Load(xp[i * xs.c]);
                A* a = acc + i * TO;
                for (int64_t o = 0; o < to; ++o) a[o] += xv * Load(yp[o * ys.c]);
              }
            }
          } else {
            const T* xp0 = xrow + (lo * g.stride_w + off) * xs.w;
            const T* yp0 = yrow + lo * ys.w;
            for (int64_t i = 0; i < ti; ++i) {
              for (int64_t o = 0; o < to; ++o) {
                acc[i * TO + o] +=
                    StridedDot(xp0 + i * xs.c, g.stride_w * xs.w, yp0 + o * ys.c, ys.w, hi - lo);
              }
            }
          }
        }
      }
      for (int64_t i = 0; i < ti; ++i) {
        T* wp = dw + ((kh * g.filter_w + kw) * icpg + ic0 + i) * C + grp * ocpg + oc0;
        for (int64_t o = 0; o < to; ++o) wp[o] = Store<T>(acc[i * TO + o]);
      }
    }
  }
}

template <typename T>
void DirectForward(const ConvGeometry& g, const T* input, const T* filter, T* output,
                   const ParallelFor& pf) {
  if (g.output_elements() == 0) return;
  const double per_row = static_cast<double>(g.out_w) * g.out_c * g.filter_h * g.filter_w *
                         std::max<int64_t>(1, g.filter_in_c);
  // The channel loop takes over from 16 channels: with 8-15 a row of positions per filter
  // value runs 1.2-2x faster (3x3 1->8 on 256x256: 2.89 -> 1.42 ms; 4->12: 8.06 -> 6.97).
  const bool many = g.out_c_per_group() >= 2 * kManyChannels;
  pf(g.batch * g.out_h, CostHint(per_row), [&](int64_t b, int64_t e) {
    if (many) {
      ForwardRowsChannelInner(g, input, filter, output, b, e);
    } else {
      ForwardRowsPositionInner(g, input, filter, output, b, e);
    }
  });
}

template <typename T>
void DirectBackpropInput(const ConvGeometry& g, const T* filter, const T* out_backprop,
                         T* in_backprop, const ParallelFor& pf) {
  if (g.input_elements() == 0) return;
  const double per_row = static_cast<double>(g.in_w) * g.out_c * g.filter_h * g.filter_w *
                         std::max<int64_t>(1, g.filter_in_c) /
                         static_cast<double>(g.stride_h * g.stride_w);
  // The same switch as the forward pass's: with 8-15 source channels the channel loop's
  // dot products are 8-15 long, and a row of positions per filter value runs up to 2x
  // faster (one thread, 3x3 1->8 on 256x256: 4.22 -> 2.14 ms; 2->8 6.43 -> 4.34; 8->8
  // 16.65 -> 16.09).
  const bool many = g.out_c_per_group() >= 2 * kManyChannels;
  pf(g.batch * g.in_h, CostHint(per_row), [&](int64_t b, int64_t e) {
    if (many) {
      BackpropInputRowsChannelInner(g, filter, out_backprop, in_backprop, b, e);
    } else {
      BackpropInputRowsPositionInner(g, filter, out_backprop, in_backprop, b, e);
    }
  });
}

template <typename T>
void DirectBackpropFilter(const ConvGeometry& g, const T* input, const T* out_backprop,
                          T* filter_backprop, const ParallelFor& pf) {
  if (g.filter_elements() == 0) return;
  const int64_t iblocks = (g.in_c_per_group() + kFilterTileIn - 1) / kFilterTileIn;
  const int64_t units = g.filter_h * g.filter_w * g.groups * iblocks;
  const double per_unit =
      static_cast<double>(g.batch) * g.out_h * g.out_w * g.out_c_per_group() * kFilterTileIn;
  pf(units, CostHint(per_unit), [&](int64_t b, int64_t e) {
    BackpropFilterUnits(g, input, out_backprop, filter_backprop, b, e);
  });
}

}  // namespace

template <typename T>
void DirectPass(const ConvGeometry& g, ConvPass pass, const T* a, const T* b, T* out,
                const ParallelFor& pf) {
  using Kernel = void (*)(const ConvGeometry&, const T*, const T*, T*, const ParallelFor&);
  constexpr Kernel kKernels[] = {DirectForward<T>, DirectBackpropInput<T>,  // by ConvPass
                                 DirectBackpropFilter<T>};
  static_assert(std::size(kKernels) == std::size(kPasses), "a kernel for every pass");
  kKernels[static_cast<int>(pass)](g, a, b, out, pf);
}

#define LARGECONV_INSTANTIATE_DIRECT(T, NAME, TF_WORD)                               \
  template void DirectPass<T>(const ConvGeometry&, ConvPass, const T*, const T*, T*, \
                              const ParallelFor&);
LARGECONV_FOR_EACH_DTYPE(LARGECONV_INSTANTIATE_DIRECT)
#undef LARGECONV_INSTANTIATE_DIRECT

LARGECONV_ISA_END
}  // namespace largeconv
