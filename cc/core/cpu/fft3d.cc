// FFT overlap-save convolution over volumes (DUCC0's 3-D real transforms). The three passes
// are the 2-D kernels' correlations (fft.cc) in three dimensions:
//   forward:         y[p]  = sum_k x_pad[p + k] w_dil[k]         (then keep every stride-th p)
//   backprop-input:  dx[p] = sum_k dy_z[p + pad - KE + 1 + k] w_dil[KE - 1 - k]
//   backprop-filter: dw[k] = sum_p x_pad[p + k] dy_z[p]          (summed over batch and tiles)
// A tile of fft - KE + 1 dense positions per dimension is exact (overlap-save). Every
// temporary lives in the caller's workspace of FftWorkspaceBytes(); DUCC's own buffers are
// one line of a transform.
#include <algorithm>
#include <cmath>
#include <complex>
#include <iterator>
#include <vector>

#include "cc/core/common/dtypes.h"
#include "cc/core/common/ducc.h"
#include "cc/core/cpu/fft.h"
#include "cc/core/cpu/fft_shared.h"
#include "cc/core/cpu/isa.h"

namespace largeconv {
LARGECONV_ISA_BEGIN
namespace {

// The pass's workspace (fft_shared.h's Layout): forward and backprop-input share a block's
// filter spectra between the slots and give each slot one source spectrum and out_block
// accumulators; backprop-filter gives each slot in_block x out_block accumulators,
// out_block out_backprop spectra and one input spectrum. One real volume per slot.
Layout MakeLayout(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c, int rb) {
  Layout l;
  l.bins = c.fft[0] * c.fft[1] * (c.fft[2] / 2 + 1);
  if (WritesFilter(pass)) {
    l.slot_spectra = c.in_block * c.out_block + c.out_block + 1;
  } else {
    l.shared_spectra = g.channels(pass).src_per_group * c.out_block;
    l.slot_spectra = 1 + c.out_block;
  }
  return FinishLayout(l, Volume(c.fft), c.slots, rb);
}

std::vector<size_t> SpectrumShape(const Dims3& f) {
  return {size_t(f[0]), size_t(f[1]), size_t(f[2] / 2 + 1)};
}

// A box of transform positions: [first[i], last[i]) along each dimension.
struct Box {
  Dims3 first, last;
};
bool IsEmpty(const Box& b) {
  for (int i = 0; i < kSpatial3d; ++i) {
    if (b.last[i] <= b.first[i]) return true;
  }
  return false;
}

// The forward transform of `real`, scaled, whose values outside `data` are all zero, pruned
// to the lines that hold data: the width pass (real to complex) over the lines of `data`'s
// depth x height, the height pass over `data`'s depth planes, then the depth pass over the
// whole spectrum. An edge tile of a 31^3 SAME convolution on 96^3 transforms holds 81 of
// 96 planes a dimension, so the first pass skips 29% of its lines and the second 16%.
template <typename R>
void ForwardTransform(const R* real, std::complex<R>* spec, const Dims3& f, R scale,
                      const Box& data) {
  const int64_t bins = f[2] / 2 + 1, plane = f[1] * bins;
  if (IsEmpty(data)) {
    std::fill(spec, spec + f[0] * plane, std::complex<R>(0));
    return;
  }
  const int64_t d0 = data.first[0], d1 = data.last[0], h0 = data.first[1], h1 = data.last[1];
  std::fill(spec, spec + d0 * plane, std::complex<R>(0));
  std::fill(spec + d1 * plane, spec + f[0] * plane, std::complex<R>(0));
  for (int64_t d = d0; d < d1; ++d) {
    std::fill(spec + d * plane, spec + d * plane + h0 * bins, std::complex<R>(0));
    std::fill(spec + d * plane + h1 * bins, spec + (d + 1) * plane, std::complex<R>(0));
  }
  ducc0::cfmav<R> in(real + (d0 * f[1] + h0) * f[2],
                     {size_t(d1 - d0), size_t(h1 - h0), size_t(f[2])},
                     {ptrdiff_t(f[1] * f[2]), ptrdiff_t(f[2]), 1});
  ducc0::vfmav<std::complex<R>> lines(spec + d0 * plane + h0 * bins,
                                      {size_t(d1 - d0), size_t(h1 - h0), size_t(bins)},
                                      {ptrdiff_t(plane), ptrdiff_t(bins), 1});
  ducc0::r2c(in, lines, size_t(2), true, scale, 1);
  ducc0::vfmav<std::complex<R>> planes(spec + d0 * plane,
                                       {size_t(d1 - d0), size_t(f[1]), size_t(bins)},
                                       {ptrdiff_t(plane), ptrdiff_t(bins), 1});
  ducc0::c2c(planes, planes, {1}, true, R(1), 1);
  ducc0::vfmav<std::complex<R>> all(spec, SpectrumShape(f));
  ducc0::c2c(all, all, {0}, true, R(1), 1);
}

// The inverse transform of `spec` into `real`, pruned to the positions `kept` (the caller
// reads no others; the rest of `real` is left undefined): the depth pass over the whole
// spectrum, the height pass over `kept`'s depth planes, the width pass (complex to real)
// over `kept`'s depth x height lines. Keeping 66 of 96 positions a dimension (the 31^3
// SAME forward pass) saves 31% of the second pass and 53% of the third. Destroys `spec`
// (the complex passes run in place, so no transform-sized temporary).
template <typename R>
void InverseTransform(std::complex<R>* spec, R* real, const Dims3& f, const Box& kept) {
  if (IsEmpty(kept)) return;
  const int64_t bins = f[2] / 2 + 1, plane = f[1] * bins;
  const int64_t d0 = kept.first[0], d1 = kept.last[0], h0 = kept.first[1], h1 = kept.last[1];
  ducc0::vfmav<std::complex<R>> all(spec, SpectrumShape(f));
  ducc0::c2c(all, all, {0}, false, R(1), 1);
  ducc0::vfmav<std::complex<R>> planes(spec + d0 * plane,
                                       {size_t(d1 - d0), size_t(f[1]), size_t(bins)},
                                       {ptrdiff_t(plane), ptrdiff_t(bins), 1});
  ducc0::c2c(planes, planes, {1}, false, R(1), 1);
  ducc0::cfmav<std::complex<R>> lines(spec + d0 * plane + h0 * bins,
                                      {size_t(d1 - d0), size_t(h1 - h0), size_t(bins)},
                                      {ptrdiff_t(plane), ptrdiff_t(bins), 1});
  ducc0::vfmav<R> out(real + (d0 * f[1] + h0) * f[2],
                      {size_t(d1 - d0), size_t(h1 - h0), size_t(f[2])},
                      {ptrdiff_t(f[1] * f[2]), ptrdiff_t(f[2]), 1});
  ducc0::c2r(lines, out, size_t(2), false, R(1), 1);
}

// One (image, channel) volume of a tensor seen at dense positions q: the element at q is
// base[sum (q_i / stuff_i) * stride_i] when each q_i >= 0 is a multiple of stuff_i (the
// zero-stuffing of strides) below stuff_i * size_i; zero elsewhere.
template <typename T>
struct DenseVolume {
  const T* base;
  Dims3 stride, size, stuff;
  // The element index along dimension i of dense position q, or -1 for a zero.
  int64_t Index(int i, int64_t q) const {
    return q >= 0 && q % stuff[i] == 0 && q / stuff[i] < size[i] ? q / stuff[i] : -1;
  }
  // The positions r of a transform volume (extents f) loaded from origin + r, r < extent,
  // that can hold data (LoadVolume zeroes the others).
  Box Data(const Dims3& f, const Dims3& origin, const Dims3& extent) const {
    Box b;
    for (int i = 0; i < kSpatial3d; ++i) {
      b.first[i] = std::max<int64_t>(0, -origin[i]);
      b.last[i] = std::min({f[i], extent[i], stuff[i] * size[i] - origin[i]});
    }
    return b;
  }
};

// Fills the transform volume `real` (extents f) with v's dense positions origin + r for
// r < extent in each dimension, zeros elsewhere.
template <typename T, typename R>
void LoadVolume(R* real, const Dims3& f, const DenseVolume<T>& v, const Dims3& origin,
                const Dims3& extent) {
  std::fill(real, real + Volume(f), R(0));
  const int64_t cols = std::min(f[2], extent[2]);
  int64_t c0 = std::max<int64_t>(0, -origin[2]);
  while (c0 < cols && (origin[2] + c0) % v.stuff[2] != 0) ++c0;
  if (c0 >= cols) return;
  const int64_t j0 = (origin[2] + c0) / v.stuff[2];
  const int64_t count = std::min(v.size[2] - j0, CeilDiv(cols - c0, v.stuff[2]));
  for (int64_t r0 = 0; r0 < std::min(f[0], extent[0]); ++r0) {
    const int64_t i0 = v.Index(0, origin[0] + r0);
    if (i0 < 0) continue;
    for (int64_t r1 = 0; r1 < std::min(f[1], extent[1]); ++r1) {
      const int64_t i1 = v.Index(1, origin[1] + r1);
      if (i1 < 0) continue;
      const T* src = v.base + i0 * v.stride[0] + i1 * v.stride[1] + j0 * v.stride[2];
      R* out = real + (r0 * f[1] + r1) * f[2] + c0;
      for (int64_t k = 0; k < count; ++k) {
        out[k * v.stuff[2]] = static_cast<R>(Load(src[k * v.stride[2]]));
      }
    }
  }
}

// Position of tile `tile` (counted width fastest) in dense positions.
Dims3 TileOrigin(const Fft3dTiling& t, int64_t tile) {
  Dims3 p;
  for (int i = kSpatial3d - 1; i >= 0; --i) {
    p[i] = tile % t.tiles[i] * t.tile[i];
    tile /= t.tiles[i];
  }
  return p;
}

double TransformCost(const Dims3& f) {
  const double n = static_cast<double>(Volume(f));
  return 5.0 * n * std::log2(n + 2);
}

// Forward and backprop-input: dst[p] = sum_k src[p + off + k] kern[k], summed over the
// group's source channels, for each destination channel; out_block destination channels
// at a time, whose filter spectra all slots share.
template <typename T>
struct Correlation3d {
  using R = AccT<T>;
  using C = std::complex<R>;
  const Conv3dGeometry& g;
  const Fft3dConfig& c;
  ConvPass pass;
  const T* src;
  const T* filter;
  T* dst;
  Workspace<R> ws;
  PassChannels ch;
  Dims3 ke;

  bool backprop_input() const { return pass == ConvPass::kBackpropInput; }

  void Run(const ParallelFor& pf) const {
    const int64_t tiles = c.tiling.count();
    const double tile_cost = TransformCost(c.fft) * (ch.src_per_group + c.out_block) +
                             8.0 * ws.layout.bins * ch.src_per_group * c.out_block;
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      for (int64_t ob0 = 0; ob0 < ch.dst_per_group; ob0 += c.out_block) {
        const int64_t ob = std::min(c.out_block, ch.dst_per_group - ob0);
        TransformFilters(grp, ob0, ob, pf);
        RunSlots(pf, c.slots, g.batch * tiles, tile_cost, [&](int64_t slot, int64_t item) {
          CorrelateTile(grp, ob0, ob, slot, item / tiles, item % tiles);
        });
      }
    }
  }

  // The spectra of the dilated filters of (source channel sc, destination ob0 + k), flipped
  // for backprop-input, where input and output channels swap roles; scaled by 1/N for the
  // unnormalised inverse.
  void TransformFilters(int64_t grp, int64_t ob0, int64_t ob, const ParallelFor& pf) const {
    const Dims3& f = c.fft;
    const R scale = R(1) / static_cast<R>(Volume(f));
    RunSlots(pf, c.slots, ch.src_per_group * ob, TransformCost(f), [&](int64_t slot, int64_t idx) {
      const int64_t sc = idx / ob, dc = ob0 + idx % ob;
      const int64_t ci = backprop_input() ? dc : sc;
      const int64_t co = grp * g.out_c_per_group() + (backprop_input() ? sc : dc);
      R* real = ws.real(slot);
      std::fill(real, real + Volume(f), R(0));
      for (int64_t kd = 0; kd < g.filter[0]; ++kd) {
        for (int64_t kh = 0; kh < g.filter[1]; ++kh) {
          for (int64_t kw = 0; kw < g.filter[2]; ++kw) {
            Dims3 p = {kd * g.dilation[0], kh * g.dilation[1], kw * g.dilation[2]};
            if (backprop_input()) {
              for (int i = 0; i < kSpatial3d; ++i) p[i] = ke[i] - 1 - p[i];
            }
            const int64_t tap = (kd * g.filter[1] + kh) * g.filter[2] + kw;
            real[(p[0] * f[1] + p[1]) * f[2] + p[2]] =
                static_cast<R>(Load(filter[(tap * g.filter_in_c + ci) * g.out_c + co]));
          }
        }
      }
      ForwardTransform(real, ws.shared(idx), f, scale, Box{{0, 0, 0}, ke});
    });
  }

  DenseVolume<T> SourceVolume(int64_t n, int64_t channel) const {
    if (backprop_input()) {
      const Strides5 s = g.output_strides();
      return {src + n * s.n + channel * s.c, s.s, g.out, g.stride};
    }
    const Strides5 s = g.input_strides();
    return {src + n * s.n + channel * s.c, s.s, g.in, {1, 1, 1}};
  }

  void CorrelateTile(int64_t grp, int64_t ob0, int64_t ob, int64_t slot, int64_t n,
                     int64_t tile) const {
    const Dims3& f = c.fft;
    const Dims3 p0 = TileOrigin(c.tiling, tile);
    Dims3 origin;
    for (int i = 0; i < kSpatial3d; ++i) {
      origin[i] = p0[i] + (backprop_input() ? g.pad_before[i] - ke[i] + 1 : -g.pad_before[i]);
    }
    for (int64_t k = 0; k < ob; ++k) std::fill_n(ws.spectrum(slot, 1 + k), ws.layout.bins, C(0));
    for (int64_t sc = 0; sc < ch.src_per_group; ++sc) {
      const DenseVolume<T> v = SourceVolume(n, grp * ch.src_per_group + sc);
      LoadVolume(ws.real(slot), f, v, origin, f);
      ForwardTransform(ws.real(slot), ws.spectrum(slot, 0), f, R(1), v.Data(f, origin, f));
      for (int64_t k = 0; k < ob; ++k) {
        MacConj(ws.spectrum(slot, 1 + k), ws.spectrum(slot, 0), ws.shared(sc * ob + k),
                ws.layout.bins);
      }
    }
    for (int64_t k = 0; k < ob; ++k) {
      InverseTransform(ws.spectrum(slot, 1 + k), ws.real(slot), f, Box{{0, 0, 0}, TileRows(p0)});
      StoreTile(n, grp * ch.dst_per_group + ob0 + k, p0, ws.real(slot));
    }
  }

  // The dense positions of the tile at p0 that hold outputs, from the tile's origin.
  Dims3 TileRows(const Dims3& p0) const {
    Dims3 rows;
    for (int i = 0; i < kSpatial3d; ++i)
      rows[i] = std::min(c.tiling.tile[i], c.tiling.dense[i] - p0[i]);
    return rows;
  }

  // Stores the tile's wanted outputs (every stride-th dense position, forward) of channel
  // `channel` of image n.
  void StoreTile(int64_t n, int64_t channel, const Dims3& p0, const R* real) const {
    const Dims3& f = c.fft;
    const Dims3 keep = backprop_input() ? Dims3{1, 1, 1} : g.stride;
    const Strides5 s = backprop_input() ? g.input_strides() : g.output_strides();
    T* out = dst + n * s.n + channel * s.c;
    const Dims3 rows = TileRows(p0);
    Dims3 first;
    for (int i = 0; i < kSpatial3d; ++i) first[i] = Mod(-p0[i], keep[i]);  // the tile's first kept
    for (int64_t r0 = first[0]; r0 < rows[0]; r0 += keep[0]) {
      for (int64_t r1 = first[1]; r1 < rows[1]; r1 += keep[1]) {
        const R* in = real + (r0 * f[1] + r1) * f[2];
        T* o = out + (p0[0] + r0) / keep[0] * s.s[0] + (p0[1] + r1) / keep[1] * s.s[1];
        for (int64_t r2 = first[2]; r2 < rows[2]; r2 += keep[2]) {
          o[(p0[2] + r2) / keep[2] * s.s[2]] = Store<T>(in[r2]);
        }
      }
    }
  }
};

// Backprop-filter: each unit of work (in_block x out_block channel pairs of one group) sums
// the spectra X * conj(DY) of every tile of every image, and one inverse transform per
// pair gives its taps.
template <typename T>
struct FilterGradient3d {
  using C = std::complex<AccT<T>>;
  using R = AccT<T>;
  const Conv3dGeometry& g;
  const Fft3dConfig& c;
  const T* input;
  const T* out_backprop;
  T* filter_backprop;
  Workspace<R> ws;

  // Channel pairs of a unit: input channels [in0, in0 + in_count) x output channels
  // [out0, out0 + out_count) of group grp (offsets within the group).
  struct Unit {
    int64_t grp, in0, in_count, out0, out_count;
  };

  // Slot spectra: the accumulators (i, k), then out_backprop's (k), then the input's.
  C* Accumulator(int64_t slot, int64_t i, int64_t k) const {
    return ws.spectrum(slot, i * c.out_block + k);
  }
  C* GradientSpectrum(int64_t slot, int64_t k) const {
    return ws.spectrum(slot, c.in_block * c.out_block + k);
  }
  C* InputSpectrum(int64_t slot) const {
    return ws.spectrum(slot, c.in_block * c.out_block + c.out_block);
  }

  void Run(const ParallelFor& pf) const {
    const int64_t icpg = g.in_c_per_group(), ocpg = g.out_c_per_group();
    const int64_t nib = CeilDiv(icpg, c.in_block), nob = CeilDiv(ocpg, c.out_block);
    const double unit_cost = static_cast<double>(g.batch) * c.tiling.count() *
                             (TransformCost(c.fft) * (c.in_block + c.out_block) +
                              8.0 * ws.layout.bins * c.in_block * c.out_block);
    RunSlots(pf, c.slots, g.groups * nib * nob, unit_cost, [&](int64_t slot, int64_t unit) {
      Unit u;
      u.grp = unit / (nib * nob);
      u.in0 = unit / nob % nib * c.in_block;
      u.out0 = unit % nob * c.out_block;
      u.in_count = std::min(c.in_block, icpg - u.in0);
      u.out_count = std::min(c.out_block, ocpg - u.out0);
      for (int64_t i = 0; i < u.in_count; ++i) {
        for (int64_t k = 0; k < u.out_count; ++k)
          std::fill_n(Accumulator(slot, i, k), ws.layout.bins, C(0));
      }
      for (int64_t n = 0; n < g.batch; ++n) {
        for (int64_t tile = 0; tile < c.tiling.count(); ++tile) AccumulateTile(u, slot, n, tile);
      }
      StoreFilter(u, slot);
    });
  }

  void AccumulateTile(const Unit& u, int64_t slot, int64_t n, int64_t tile) const {
    const Dims3& f = c.fft;
    const Dims3 p0 = TileOrigin(c.tiling, tile);
    const Strides5 xs = g.input_strides(), ys = g.output_strides();
    Dims3 extent, origin;
    for (int i = 0; i < kSpatial3d; ++i) {
      extent[i] = std::min(c.tiling.tile[i], c.tiling.dense[i] - p0[i]);
      origin[i] = p0[i] - g.pad_before[i];
    }
    R* real = ws.real(slot);
    for (int64_t k = 0; k < u.out_count; ++k) {
      const int64_t channel = u.grp * g.out_c_per_group() + u.out0 + k;
      const DenseVolume<T> v{out_backprop + n * ys.n + channel * ys.c, ys.s, g.out, g.stride};
      LoadVolume(real, f, v, p0, extent);
      ForwardTransform(real, GradientSpectrum(slot, k), f, R(1), v.Data(f, p0, extent));
    }
    for (int64_t i = 0; i < u.in_count; ++i) {
      const int64_t channel = u.grp * g.in_c_per_group() + u.in0 + i;
      const DenseVolume<T> v{input + n * xs.n + channel * xs.c, xs.s, g.in, {1, 1, 1}};
      LoadVolume(real, f, v, origin, f);
      ForwardTransform(real, InputSpectrum(slot), f, R(1), v.Data(f, origin, f));
      for (int64_t k = 0; k < u.out_count; ++k) {
        MacConj(Accumulator(slot, i, k), InputSpectrum(slot), GradientSpectrum(slot, k),
                ws.layout.bins);
      }
    }
  }

  void StoreFilter(const Unit& u, int64_t slot) const {
    const Dims3& f = c.fft;
    const R scale = R(1) / static_cast<R>(Volume(f));
    R* real = ws.real(slot);
    for (int64_t i = 0; i < u.in_count; ++i) {
      for (int64_t k = 0; k < u.out_count; ++k) {
        InverseTransform(Accumulator(slot, i, k), real, f, Box{{0, 0, 0}, DilatedExtents(g)});
        const int64_t ci = u.in0 + i, co = u.grp * g.out_c_per_group() + u.out0 + k;
        for (int64_t kd = 0; kd < g.filter[0]; ++kd) {
          for (int64_t kh = 0; kh < g.filter[1]; ++kh) {
            const R* row = real + (kd * g.dilation[0] * f[1] + kh * g.dilation[1]) * f[2];
            for (int64_t kw = 0; kw < g.filter[2]; ++kw) {
              const int64_t tap = (kd * g.filter[1] + kh) * g.filter[2] + kw;
              filter_backprop[(tap * g.filter_in_c + ci) * g.out_c + co] =
                  Store<T>(scale * row[kw * g.dilation[2]]);
            }
          }
        }
      }
    }
  }
};

// Forward (operands input, filter) and backprop-input (filter, out_backprop): the
// correlation of the pass's source image with its filter.
template <typename T, ConvPass kPass>
void FftCorrelation3d(const Conv3dGeometry& g, const Fft3dConfig& c, const T* a, const T* b, T* out,
                      void* workspace, const ParallelFor& pf) {
  const bool forward = kPass == ConvPass::kForward;
  const Layout l = MakeLayout(g, kPass, c, sizeof(AccT<T>));
  Correlation3d<T>{g,
                   c,
                   kPass,
                   forward ? a : b,
                   forward ? b : a,
                   out,
                   {static_cast<char*>(workspace), l},
                   g.channels(kPass),
                   DilatedExtents(g)}
      .Run(pf);
}

template <typename T>
void FftBackpropFilter3d(const Conv3dGeometry& g, const Fft3dConfig& c, const T* input,
                         const T* out_backprop, T* filter_backprop, void* workspace,
                         const ParallelFor& pf) {
  const Layout l = MakeLayout(g, ConvPass::kBackpropFilter, c, sizeof(AccT<T>));
  FilterGradient3d<T>{
      g, c, input, out_backprop, filter_backprop, {static_cast<char*>(workspace), l}}
      .Run(pf);
}

}  // namespace

#ifndef LARGECONV_ISA_NS  // the planner's share, compiled once (isa.h)
int64_t FftWorkspaceBytes(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c,
                          int real_bytes) {
  return MakeLayout(g, pass, c, real_bytes).total;
}

double FftTransformCount(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c) {
  const double tiles = static_cast<double>(g.batch) * c.tiling.count() * g.groups;
  return TransformCountOf(pass, tiles, g.groups, g.in_c_per_group(), g.out_c_per_group(),
                          c.in_block, c.out_block);
}

#else  // a level's kernels
template <typename T>
void FftPass(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c, const T* a, const T* b,
             T* out, void* workspace, const ParallelFor& pf) {
  if (g.elements(RolesOf(pass).out) == 0) return;
  using Kernel = void (*)(const Conv3dGeometry&, const Fft3dConfig&, const T*, const T*, T*, void*,
                          const ParallelFor&);
  constexpr Kernel kKernels[] = {FftCorrelation3d<T, ConvPass::kForward>,  // by ConvPass
                                 FftCorrelation3d<T, ConvPass::kBackpropInput>,
                                 FftBackpropFilter3d<T>};
  static_assert(std::size(kKernels) == std::size(kPasses), "a kernel for every pass");
  kKernels[static_cast<int>(pass)](g, c, a, b, out, workspace, pf);
}

#define LARGECONV_INSTANTIATE_FFT3D(T, NAME, TF_WORD)                                     \
  template void FftPass<T>(const Conv3dGeometry&, ConvPass, const Fft3dConfig&, const T*, \
                           const T*, T*, void*, const ParallelFor&);
LARGECONV_FOR_EACH_FLOAT_DTYPE(LARGECONV_INSTANTIATE_FFT3D)
#undef LARGECONV_INSTANTIATE_FFT3D
#endif  // LARGECONV_ISA_NS

LARGECONV_ISA_END
}  // namespace largeconv
