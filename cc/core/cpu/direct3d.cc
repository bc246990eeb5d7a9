// Direct convolution kernels over three spatial dimensions (depth, height, width): forward,
// backprop-input, backprop-filter. Each work unit is a row along the width (or, for the
// filter gradient, one filter tap and a block of input channels) and sums into a fixed-size
// stack accumulator, so the only memory is the tensors themselves; every result element is
// summed by one thread in a fixed order, whatever the split.
#include <algorithm>
#include <iterator>

#include "cc/core/common/dtypes.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cpu/direct.h"
#include "cc/core/cpu/isa.h"

namespace largeconv {
LARGECONV_ISA_BEGIN
namespace {

// Positions [lo, hi) of j in [0, n) whose source (first + j) * stride + off lies in
// [0, size).
inline void InsideRange(int64_t first, int64_t n, int64_t stride, int64_t off, int64_t size,
                        int64_t* lo, int64_t* hi) {
  *lo = std::max<int64_t>(0, CeilDiv(-off, stride) - first);
  *hi = std::min<int64_t>(n, FloorDiv(size - 1 - off, stride) + 1 - first);
  if (*hi < *lo) *hi = *lo;
}

// The output position that reads input position `in` through tap k of dimension i (the
// backprop-input sum runs backwards through the window), or -1 when none does.
inline int64_t OutputOf(const Conv3dGeometry& g, int i, int64_t in, int64_t k) {
  const int64_t num = in + g.pad_before[i] - k * g.dilation[i];
  if (num < 0 || num % g.stride[i] != 0) return -1;
  const int64_t o = num / g.stride[i];
  return o < g.out[i] ? o : -1;
}

// The input position output position o reads through tap k of dimension i, or -1 outside
// the input.
inline int64_t InputOf(const Conv3dGeometry& g, int i, int64_t o, int64_t k) {
  const int64_t in = o * g.stride[i] - g.pad_before[i] + k * g.dilation[i];
  return in >= 0 && in < g.in[i] ? in : -1;
}

// Index of filter tap (kd, kh, kw) among the filter's spatial positions.
inline int64_t TapIndex(const Conv3dGeometry& g, int64_t kd, int64_t kh, int64_t kw) {
  return (kd * g.filter[1] + kh) * g.filter[2] + kw;
}

inline int64_t CostHint(double ops) { return static_cast<int64_t>(std::min(ops, 1e15)) + 1; }

constexpr int64_t kTileW = 16, kTileC = 32;

// Where one accumulator tile of an image-writing pass lies: image n, row (d, h) of the
// written tensor, group grp, channels [c0, c0 + tc) of the group and width positions
// [w0, w0 + tw).
struct RowTile {
  int64_t n, d, h, grp, c0, tc, w0, tw;
};

// Runs rows [t0, t1) of a tensor of `size` (depth, height, width) with `cpg` channels per
// group: for each of its tiles, accumulate(tile, acc) sums into the zeroed accumulator
// (kTileW positions x kTileC channels), and the tile is stored to `out` (strides s).
template <typename T, typename Accumulate>
void RunRows(const Conv3dGeometry& g, const Dims3& size, int64_t cpg, const Strides5& s, T* out,
             int64_t t0, int64_t t1, const Accumulate& accumulate) {
  using A = AccT<T>;
  A acc[kTileW * kTileC];
  for (int64_t t = t0; t < t1; ++t) {
    RowTile r{t / size[1] / size[0], t / size[1] % size[0], t % size[1], 0, 0, 0, 0, 0};
    for (r.grp = 0; r.grp < g.groups; ++r.grp) {
      for (r.c0 = 0; r.c0 < cpg; r.c0 += kTileC) {
        r.tc = std::min(kTileC, cpg - r.c0);
        for (r.w0 = 0; r.w0 < size[2]; r.w0 += kTileW) {
          r.tw = std::min(kTileW, size[2] - r.w0);
          std::fill(acc, acc + kTileW * kTileC, A(0));
          accumulate(r, acc);
          T* o = out + r.n * s.n + r.d * s.s[0] + r.h * s.s[1] + (r.grp * cpg + r.c0) * s.c;
          for (int64_t i = 0; i < r.tw; ++i) {
            for (int64_t c = 0; c < r.tc; ++c) {
              o[(r.w0 + i) * s.s[2] + c * s.c] = Store<T>(acc[i * kTileC + c]);
            }
          }
        }
      }
    }
  }
}

// Forward: one unit per output row (n, od, oh); y sums x * w over the taps whose input
// position lies inside the input.
template <typename T>
void ForwardRows(const Conv3dGeometry& g, const T* x, const T* w, T* y, int64_t t0, int64_t t1) {
  const Strides5 xs = g.input_strides();
  const int64_t icpg = g.in_c_per_group(), ocpg = g.out_c_per_group(), C = g.out_c;
  RunRows(g, g.out, ocpg, g.output_strides(), y, t0, t1, [&](const RowTile& r, AccT<T>* acc) {
    for (int64_t kd = 0; kd < g.filter[0]; ++kd) {
      const int64_t id = InputOf(g, 0, r.d, kd);
      if (id < 0) continue;
      for (int64_t kh = 0; kh < g.filter[1]; ++kh) {
        const int64_t ih = InputOf(g, 1, r.h, kh);
        if (ih < 0) continue;
        const T* xrow = x + r.n * xs.n + id * xs.s[0] + ih * xs.s[1] + r.grp * icpg * xs.c;
        for (int64_t kw = 0; kw < g.filter[2]; ++kw) {
          const int64_t off = kw * g.dilation[2] - g.pad_before[2];
          int64_t lo, hi;
          InsideRange(r.w0, r.tw, g.stride[2], off, g.in[2], &lo, &hi);
          const T* wp = w + TapIndex(g, kd, kh, kw) * icpg * C + r.grp * ocpg + r.c0;
          for (int64_t i = lo; i < hi; ++i) {
            const T* xp = xrow + ((r.w0 + i) * g.stride[2] + off) * xs.s[2];
            AccT<T>* a = acc + i * kTileC;
            for (int64_t ic = 0; ic < icpg; ++ic) {
              const AccT<T> xv = Load(xp[ic * xs.c]);
              const T* wr = wp + ic * C;
              for (int64_t c = 0; c < r.tc; ++c) a[c] += xv * Load(wr[c]);
            }
          }
        }
      }
    }
  });
}

// Backprop-input: one unit per input row (n, id, ih); dx sums dy * w over the taps and
// output channels whose window covers the input position.
template <typename T>
void BackpropInputRows(const Conv3dGeometry& g, const T* w, const T* dy, T* dx, int64_t t0,
                       int64_t t1) {
  const Strides5 ys = g.output_strides();
  const int64_t icpg = g.in_c_per_group(), ocpg = g.out_c_per_group(), C = g.out_c;
  RunRows(g, g.in, icpg, g.input_strides(), dx, t0, t1, [&](const RowTile& r, AccT<T>* acc) {
    for (int64_t kd = 0; kd < g.filter[0]; ++kd) {
      const int64_t od = OutputOf(g, 0, r.d, kd);
      if (od < 0) continue;
      for (int64_t kh = 0; kh < g.filter[1]; ++kh) {
        const int64_t oh = OutputOf(g, 1, r.h, kh);
        if (oh < 0) continue;
        const T* dyrow = dy + r.n * ys.n + od * ys.s[0] + oh * ys.s[1] + r.grp * ocpg * ys.c;
        for (int64_t kw = 0; kw < g.filter[2]; ++kw) {
          const T* wp = w + (TapIndex(g, kd, kh, kw) * icpg + r.c0) * C + r.grp * ocpg;
          for (int64_t i = 0; i < r.tw; ++i) {
            const int64_t ow = OutputOf(g, 2, r.w0 + i, kw);
            if (ow < 0) continue;
            const T* dyp = dyrow + ow * ys.s[2];
            AccT<T>* a = acc + i * kTileC;
            for (int64_t oc = 0; oc < ocpg; ++oc) {
              const AccT<T> dv = Load(dyp[oc * ys.c]);
              for (int64_t c = 0; c < r.tc; ++c) a[c] += dv * Load(wp[c * C + oc]);
            }
          }
        }
      }
    }
  });
}

constexpr int64_t kFilterTileIn = 8, kFilterTileOut = 64;

// Backprop-filter: one unit per (tap, group, block of input channels); the unit owns its
// slice of dw and sums over the batch and every output position.
template <typename T>
void BackpropFilterUnits(const Conv3dGeometry& g, const T* x, const T* dy, T* dw, int64_t t0,
                         int64_t t1) {
  using A = AccT<T>;
  constexpr int64_t TI = kFilterTileIn, TO = kFilterTileOut;
  A acc[TI * TO];
  const Strides5 xs = g.input_strides(), ys = g.output_strides();
  const int64_t icpg = g.in_c_per_group(), ocpg = g.out_c_per_group(), C = g.out_c;
  const int64_t iblocks = CeilDiv(icpg, TI);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t ib = t % iblocks, grp = t / iblocks % g.groups, tap = t / iblocks / g.groups;
    const int64_t kw = tap % g.filter[2], kh = tap / g.filter[2] % g.filter[1],
                  kd = tap / g.filter[2] / g.filter[1];
    const int64_t ic0 = ib * TI, ti = std::min(TI, icpg - ic0);
    const int64_t off = kw * g.dilation[2] - g.pad_before[2];
    int64_t lo, hi;
    InsideRange(0, g.out[2], g.stride[2], off, g.in[2], &lo, &hi);
    for (int64_t oc0 = 0; oc0 < ocpg; oc0 += TO) {
      const int64_t to = std::min(TO, ocpg - oc0);
      std::fill(acc, acc + TI * TO, A(0));
      for (int64_t n = 0; n < g.batch; ++n) {
        for (int64_t od = 0; od < g.out[0]; ++od) {
          const int64_t id = InputOf(g, 0, od, kd);
          if (id < 0) continue;
          for (int64_t oh = 0; oh < g.out[1]; ++oh) {
            const int64_t ih = InputOf(g, 1, oh, kh);
            if (ih < 0) continue;
            const T* xrow = x + n * xs.n + id * xs.s[0] + ih * xs.s[1] + (grp * icpg + ic0) * xs.c;
            const T* yrow = dy + n * ys.n + od * ys.s[0] + oh * ys.s[1] + (grp * ocpg + oc0) * ys.c;
            for (int64_t ow = lo; ow < hi; ++ow) {
              const T* xp = xrow + (ow * g.stride[2] + off) * xs.s[2];
              const T* yp = yrow + ow * ys.s[2];
              for (int64_t i = 0; i < ti; ++i) {
                const A xv = Load(xp[i * xs.c]);
                A* a = acc + i * TO;
                for (int64_t o = 0; o < to; ++o) a[o] += xv * Load(yp[o * ys.c]);
              }
            }
          }
        }
      }
      T* wp = dw + (tap * icpg + ic0) * C + grp * ocpg + oc0;
      for (int64_t i = 0; i < ti; ++i) {
        for (int64_t o = 0; o < to; ++o) wp[i * C + o] = Store<T>(acc[i * TO + o]);
      }
    }
  }
}

template <typename T>
void Forward3d(const Conv3dGeometry& g, const T* input, const T* filter, T* output,
               const ParallelFor& pf) {
  const double per_row = static_cast<double>(g.out[2]) * g.out_c * Volume(g.filter) *
                         std::max<int64_t>(1, g.filter_in_c);
  pf(g.batch * g.out[0] * g.out[1], CostHint(per_row),
     [&](int64_t b, int64_t e) { ForwardRows(g, input, filter, output, b, e); });
}

template <typename T>
void BackpropInput3d(const Conv3dGeometry& g, const T* filter, const T* out_backprop,
                     T* in_backprop, const ParallelFor& pf) {
  const double per_row = static_cast<double>(g.in[2]) * g.out_c * Volume(g.filter) *
                         std::max<int64_t>(1, g.filter_in_c) /
                         static_cast<double>(Volume(g.stride));
  pf(g.batch * g.in[0] * g.in[1], CostHint(per_row),
     [&](int64_t b, int64_t e) { BackpropInputRows(g, filter, out_backprop, in_backprop, b, e); });
}

template <typename T>
void BackpropFilter3d(const Conv3dGeometry& g, const T* input, const T* out_backprop,
                      T* filter_backprop, const ParallelFor& pf) {
  const int64_t units = Volume(g.filter) * g.groups * CeilDiv(g.in_c_per_group(), kFilterTileIn);
  const double per_unit =
      static_cast<double>(g.batch) * Volume(g.out) * g.out_c_per_group() * kFilterTileIn;
  pf(units, CostHint(per_unit), [&](int64_t b, int64_t e) {
    BackpropFilterUnits(g, input, out_backprop, filter_backprop, b, e);
  });
}

}  // namespace

template <typename T>
void DirectPass(const Conv3dGeometry& g, ConvPass pass, const T* a, const T* b, T* out,
                const ParallelFor& pf) {
  if (g.elements(RolesOf(pass).out) == 0) return;
  using Kernel = void (*)(const Conv3dGeometry&, const T*, const T*, T*, const ParallelFor&);
  constexpr Kernel kKernels[] = {Forward3d<T>, BackpropInput3d<T>,  // by ConvPass
                                 BackpropFilter3d<T>};
  static_assert(std::size(kKernels) == std::size(kPasses), "a kernel for every pass");
  kKernels[static_cast<int>(pass)](g, a, b, out, pf);
}

#define LARGECONV_INSTANTIATE_DIRECT3D(T, NAME, TF_WORD)                               \
  template void DirectPass<T>(const Conv3dGeometry&, ConvPass, const T*, const T*, T*, \
                              const ParallelFor&);
LARGECONV_FOR_EACH_DTYPE(LARGECONV_INSTANTIATE_DIRECT3D)
#undef LARGECONV_INSTANTIATE_DIRECT3D

LARGECONV_ISA_END
}  // namespace largeconv
