// The FFT path on the GPU, written once for the device and the host: element kernels (one
// call per output element, or per lane of a row for the row kernels; no shared memory, no
// atomics) around batched in-place transforms. The same overlap-save correlations as the
// CPU path (fft.cc):
//   forward:         y[p]  = sum_k x_pad[p + k] w_dil[k]         (every stride-th p kept)
//   backprop-input:  dx[p] = sum_k dy_z[p + pt - KE + 1 + k] w_dil[KE - 1 - k]
//   backprop-filter: dw[k] = sum_p x_pad[p + k] dy_z[p]          (summed over batch, tiles)
// with the tiling of MakeFftTiling, in two dimensions or three (Conv3D: every position,
// tile and plane then has a depth, which is 1 in 2-D). A pass runs in rounds of `chunk`
// items (image tiles):
//   forward / backprop-input
//     once:       PlaceFilters -> R2C(filter spectra)       (scaled by 1 / transform size)
//     per round:  PackTiles -> R2C -> MultiplyConj -> C2R -> StoreTiles
//   backprop-filter
//     per round:  PackTiles(x) -> R2C, PackTiles(dy) -> R2C -> AccumulateConj
//     once:       C2R(accumulated spectra) -> ReadFilter
// The runner supplies ForEach (a grid-strided kernel on the device, a loop on the host),
// the transforms (cuFFT on the device, DUCC on the host) and the gated direct pass. Element
// kernels take their index as I: int32_t when the launch's count is below kNarrowCount (the
// usual case: a round is bounded by the workspace limit), so that decoding it into
// coordinates costs 32-bit divisions rather than 64-bit ones (emulated on a GPU); int64_t
// otherwise. Addresses are always computed in 64 bits.
//
// A transform spreads one Inf or NaN over its whole tile, where a direct sum (and
// TensorFlow) keeps it in place. So the kernels that load the operands into planes
// (PlaceFilters, PackTiles) set a workspace flag when a value they load is not finite, and
// the direct kernels, gated on that flag, then redo the pass exactly; with finite operands
// they exit at once. A value no tile loads reaches no result of the FFT path either. All
// of it is stream-ordered: nothing waits on the host.
#ifndef TF_LARGECONV_CORE_CUDA_FFT_PIPELINE_H_
#define TF_LARGECONV_CORE_CUDA_FFT_PIPELINE_H_

#include <cstdint>

#include "cc/core/common/dtypes.h"
#include "cc/core/common/hd.h"
#include "cc/core/cuda/divisor.h"
#include "cc/core/cuda/fft_plan.h"
#include "cc/core/cuda/tiles.h"

namespace largeconv {
namespace cuda {

// Interleaved complex, layout-compatible with cufftComplex / cufftDoubleComplex and
// std::complex.
template <typename R>
struct alignas(2 * sizeof(R)) Cx {  // aligned as float2 / double2: one load per value
  R re, im;
};

// Launches with fewer elements than this index them as int32_t (room is left for a grid
// stride of up to 2^28 on top of the last index).
constexpr int64_t kNarrowCount = (int64_t{1} << 31) - (int64_t{1} << 28);

// A plane element's position: column c, row r and depth slice z of plane p.
struct PlanePos {
  int64_t c, r, z, p;
};
// A tile's image and the dense position of its origin.
struct TileOrigin {
  int64_t image, d, h, w;
};

// Row `row` of an array [p][nz][ny][nx] as (0, r, z, p).
template <typename I>
LC_HD PlanePos SplitRow(I row, const Divisor& ny, const Divisor& nz) {
  const I slab = ny.Quot(row), rest = nz.Quot(slab);
  return {0, row - slab * static_cast<I>(ny.value()), slab - rest * static_cast<I>(nz.value()),
          rest};
}
// e as (c, r, z, p): its index in each dimension of an array [p][nz][ny][nx].
template <typename I>
LC_HD PlanePos Split3(I e, const Divisor& nx, const Divisor& ny, const Divisor& nz) {
  const I row = nx.Quot(e);
  PlanePos at = SplitRow(row, ny, nz);
  at.c = e - row * static_cast<I>(nx.value());
  return at;
}

// The element at dense position q of `size` elements seen stuffed with stuff - 1 zeros
// between them, or -1 for a zero.
LC_HD inline int64_t StuffedIndex(int64_t q, const Divisor& stuff, int64_t size) {
  if (q < 0) return -1;
  const int64_t k = stuff.Quot(q);
  return k * stuff.value() == q && k < size ? k : -1;
}

// Transform geometry the element kernels share. A plane is one transform's reals: fd
// slices of fh rows of `pitch` reals (fd = 1 in 2-D). The element kernels decode their
// index with Divisors (divisor.h) of these sizes, set on the host.
struct FftGeom {
  int64_t fd, fh, fw, pitch, slice, plane;  // pitch = 2 (fw / 2 + 1); slice = fh * pitch;
                                            // plane = fd * slice
  int64_t bins;                             // fd * fh * (fw / 2 + 1)
  FftTiling t;                              // height and width
  int64_t tile_d, dense_d;                  // depth
  int64_t tiles_hw, per_image;              // tiles per depth and per image
  Divisor div_fd, div_fh, div_fw, div_pitch, div_tiles_w, div_tiles_hw, div_per_image;
  Divisor div_tile_d, div_tile_h;
  // Plane element e: (column, row, slice, plane).
  template <typename I>
  LC_HD PlanePos Position(I e) const {
    return Split3(e, div_pitch, div_fh, div_fd);
  }
  // Plane row `row`: (0, row, slice, plane).
  template <typename I>
  LC_HD PlanePos PlaneRow(I row) const {
    return SplitRow(row, div_fh, div_fd);
  }
  // Row `row` of a round's tiles, tile_d x tile_h rows each: (0, row, slice, tile).
  template <typename I>
  LC_HD PlanePos TileRow(I row) const {
    return SplitRow(row, div_tile_h, div_tile_d);
  }
  LC_HD TileOrigin Origin(int64_t item) const {
    const int64_t image = div_per_image.Quot(item), in_image = item - image * per_image;
    const int64_t depth = div_tiles_hw.Quot(in_image), in_depth = in_image - depth * tiles_hw;
    const int64_t row = div_tiles_w.Quot(in_depth);
    return {image, depth * tile_d, row * t.tile_h, (in_depth - row * t.tiles_w) * t.tile_w};
  }
};
inline FftGeom MakeFftGeom(const GpuFftConfig& c, int64_t bins) {
  const int64_t pitch = 2 * (c.fft_w / 2 + 1);
  const FftTiling& t = c.tiling;
  const int64_t tiles_hw = t.tiles_h * t.tiles_w, per_image = c.tiles_d * tiles_hw;
  return {c.fft_d,
          c.fft_h,
          c.fft_w,
          pitch,
          c.fft_h * pitch,
          c.fft_d * c.fft_h * pitch,
          bins,
          t,
          c.tile_d,
          c.dense_d,
          tiles_hw,
          per_image,
          Divisor(c.fft_d),
          Divisor(c.fft_h),
          Divisor(c.fft_w),
          Divisor(pitch),
          Divisor(t.tiles_w),
          Divisor(tiles_hw),
          Divisor(per_image),
          Divisor(c.tile_d),
          Divisor(t.tile_h)};
}

struct SetFlag {
  int* flag;
  int value;
  template <typename I>
  LC_HD void operator()(I) const {
    *flag = value;
  }
};

// An operand value as a plane loads it; a value that is not finite sets *flag (every
// writer stores the same value, so concurrent writes are benign).
template <typename R, typename T>
LC_HD R LoadChecked(const T& value, int* flag) {
  if (!IsFinite(value)) *flag = 1;
  return static_cast<R>(Load(value));
}

template <typename T>
struct Fill {
  T* p;
  template <typename I>
  LC_HD void operator()(I i) const {
    p[i] = Store<T>(AccT<T>(0));
  }
};

// Filter spectra (group, source channel, destination channel) as real planes: the dilated
// filter at the origin, flipped for backprop-input (where input and output channels swap
// roles), times `scale`. One call per plane element, padding columns included.
template <typename T, typename R>
struct PlaceFilters {
  TileGeom g;
  FftGeom f;
  bool flip;
  Divisor scpg, dcpg, dilation_d, dilation_h, dilation_w;
  R scale;
  const T* filter;
  R* dst;
  int* flag;
  template <typename I>
  LC_HD void operator()(I e) const {
    const PlanePos at = f.Position(e);
    const int64_t pair = dcpg.Quot(at.p), grp = scpg.Quot(pair);
    const int64_t sc = pair - grp * scpg.value(), dc = at.p - pair * dcpg.value();
    const int64_t ked = DilatedExtent(g.filter_d, g.dilation_d),
                  keh = DilatedExtent(g.filter_h, g.dilation_h),
                  kew = DilatedExtent(g.filter_w, g.dilation_w);
    const int64_t kd = StuffedIndex(flip ? ked - 1 - at.z : at.z, dilation_d, g.filter_d);
    const int64_t kh = StuffedIndex(flip ? keh - 1 - at.r : at.r, dilation_h, g.filter_h);
    const int64_t kw = StuffedIndex(flip ? kew - 1 - at.c : at.c, dilation_w, g.filter_w);
    R v = R(0);
    if (at.c < f.fw && kd >= 0 && kh >= 0 && kw >= 0) {
      const int64_t ci = flip ? dc : sc, co = grp * g.cout_g + (flip ? sc : dc);
      const int64_t tap = (kd * g.filter_h + kh) * g.filter_w + kw;
      v = scale * LoadChecked<R>(filter[(tap * g.cin_g + ci) * g.out_c + co], flag);
    }
    dst[e] = v;
  }
};

// One dimension of the source PackTiles reads: `size` elements `stride` apart, seen at
// dense positions stuffed with stuff - 1 zeros (the stride of a gradient's source), and
// the offset `org` of a tile's dense positions from the tile's origin.
struct PackDim {
  int64_t size;
  Divisor stuff;
  int64_t org, stride;
  // The element at dense position q, or -1 for a zero.
  LC_HD int64_t Index(int64_t q) const { return StuffedIndex(q, stuff, size); }
};

// Row kernels (PackTiles, StoreTiles) give each row of a plane or tile 2^bits consecutive
// launch indices, lanes, which take its columns lane, lane + 2^bits, ...: a warp's loads
// and stores run along rows, and the row is decoded into plane, slice, tile and source
// address once per lane rather than once per element. A launch of few rows (one long row
// per plane in conv1d, rounds of one tile under a tight workspace limit) spreads each row
// over more lanes, up to one per column, so that it still has the runner's kRowThreads
// lanes.
struct RowLanes {
  int bits;
  LC_HD int64_t count(int64_t rows) const { return rows << bits; }
  template <typename I>
  LC_HD I Row(I e) const {
    return e >> bits;
  }
  template <typename I>
  LC_HD int Lane(I e) const {
    return static_cast<int>(e & ((I{1} << bits) - 1));
  }
  LC_HD int width() const { return 1 << bits; }
};
// Lanes for `rows` rows of `length` columns: a warp per row (fewer lanes for rows shorter
// than 32), more while the launch has fewer than `threads` lanes and a row has columns for
// them.
inline RowLanes MakeRowLanes(int64_t length, int64_t rows, int64_t threads) {
  int bits = 0;
  while ((int64_t{1} << bits) < length && (bits < 5 || (rows << bits) < threads)) ++bits;
  return {bits};
}

// A round's source tiles as real planes (item, channel): tile pixel (z, r, c) of item it
// holds the source at dense position (tile origin + org + (z, r, c)), where dense
// position q is element q / stuff when q >= 0 and q % stuff == 0 (zero-stuffing by the
// stride), zero outside the source. With clip, only the pixels inside the tile's own
// extent are loaded (out_backprop in backprop-filter). One call per lane of a plane row
// (RowLanes), padding columns included.
template <typename T, typename R>
struct PackTiles {
  FftGeom f;
  RowLanes lanes;
  const T* base;
  int64_t image_stride, channel_stride;
  Divisor channels;
  PackDim d, h, w;
  bool clip;
  int64_t item0;
  R* dst;
  int* flag;
  template <typename I>
  LC_HD void operator()(I e) const {
    const I row = lanes.Row(e);
    const PlanePos at = f.PlaneRow(row);
    const int64_t r = at.r, z = at.z;
    const int64_t local = channels.Quot(at.p), ch = at.p - local * channels.value();
    const TileOrigin o = f.Origin(item0 + local);
    R* out = dst + static_cast<int64_t>(row) * f.pitch;
    // Columns [0, end) may hold source values; the rest of the row is zero.
    int64_t end = f.fw;
    if (clip) {
      const bool row_inside =
          z < f.tile_d && o.d + z < f.dense_d && r < f.t.tile_h && o.h + r < f.t.dense_h;
      end = row_inside ? MinOf(f.t.tile_w, f.t.dense_w - o.w) : 0;
    }
    const int64_t iz = d.Index(o.d + d.org + z), iy = h.Index(o.h + h.org + r);
    if (iz < 0 || iy < 0) end = 0;
    const T* src = end > 0 ? base + o.image * image_stride + ch * channel_stride + iz * d.stride +
                                 iy * h.stride
                           : base;
    const int64_t q0 = o.w + w.org;
    for (int64_t c = lanes.Lane(e); c < f.pitch; c += lanes.width()) {
      R v = R(0);
      if (c < end) {
        const int64_t ix = w.Index(q0 + c);
        if (ix >= 0) v = LoadChecked<R>(src[ix * w.stride], flag);
      }
      out[c] = v;
    }
  }
};

// y(item, group, dc) = sum over the group's source channels sc of
// x(item, group, sc) * conj(filters(group, sc, dc)), bin by bin; a thread owns up to
// kChannelBlock consecutive dc of one bin (`dblocks` = ceil(dcpg / kChannelBlock)).
template <typename R>
struct MultiplyConj {
  Divisor bins, dblocks, groups;
  int64_t scpg, dcpg;
  const Cx<R>* x;
  const Cx<R>* filters;
  Cx<R>* y;
  template <typename I>
  LC_HD void operator()(I e) const {
    // e = ((item * groups + grp) * dblocks + block) * bins + bin
    const PlanePos at = Split3(e, bins, dblocks, groups);
    const int64_t nb = bins.value(), bin = at.c, dc0 = at.r * kChannelBlock, grp = at.z;
    const int64_t item = at.p, ng = groups.value();
    const int n = static_cast<int>(MinOf(kChannelBlock, dcpg - dc0));
    const Cx<R>* xs = x + (item * ng * scpg + grp * scpg) * nb + bin;
    const Cx<R>* fs = filters + (grp * scpg * dcpg + dc0) * nb + bin;
    R re[kChannelBlock] = {}, im[kChannelBlock] = {};
    for (int64_t sc = 0; sc < scpg; ++sc) {
      const Cx<R> a = xs[sc * nb];
      for (int k = 0; k < n; ++k) {
        const Cx<R> b = fs[(sc * dcpg + k) * nb];
        re[k] += a.re * b.re + a.im * b.im;
        im[k] += a.im * b.re - a.re * b.im;
      }
    }
    Cx<R>* ys = y + (item * ng * dcpg + grp * dcpg + dc0) * nb + bin;
    for (int k = 0; k < n; ++k) ys[k * nb] = Cx<R>{re[k], im[k]};
  }
};

// The wanted outputs of a round's result planes into the destination tensor: dense tile
// position (z, r, c) of item it is output ((p0 + (z, r, c)) / out_stride) when on the
// stride grid, read from the plane at (r, c) - shift modulo the transform size (depth has
// no shift). ds: the destination's element strides, dsd its depth's. One call per lane of
// a tile row (RowLanes).
template <typename T, typename R>
struct StoreTiles {
  FftGeom f;
  RowLanes lanes;
  T* out;
  Strides4 ds;
  int64_t dsd;
  Divisor channels, out_sd, out_sh, out_sw;
  int64_t item0;
  const R* real;
  template <typename I>
  LC_HD void operator()(I e) const {
    const PlanePos at = f.TileRow(lanes.Row(e));
    const int64_t r = at.r, z = at.z;
    const int64_t local = channels.Quot(at.p), ch = at.p - local * channels.value();
    const TileOrigin o = f.Origin(item0 + local);
    const int64_t pd = o.d + z, ph = o.h + r;
    if (pd >= f.dense_d || ph >= f.t.dense_h) return;
    const int64_t od = out_sd.Quot(pd), oh = out_sh.Quot(ph);
    if (od * out_sd.value() != pd || oh * out_sh.value() != ph) return;
    const R* src = real + at.p * f.plane + z * f.slice + f.div_fh.Mod(r - f.t.shift_h) * f.pitch;
    T* dst = out + o.image * ds.n + ch * ds.c + od * dsd + oh * ds.h;
    const int64_t end = MinOf(f.t.tile_w, f.t.dense_w - o.w);
    for (int64_t c = lanes.Lane(e); c < end; c += lanes.width()) {
      const int64_t pw = o.w + c, ow = out_sw.Quot(pw);
      if (ow * out_sw.value() != pw) continue;
      dst[ow * ds.w] = Store<T>(src[f.div_fw.Mod(c - f.t.shift_w)]);
    }
  }
};

// acc(group, i, o) (+)= sum over the round's items, in order, of x(item, group, i) *
// conj(dy(item, group, o)); `first` starts the sum. A thread owns one bin of up to
// kChannelBlock consecutive o (`oblocks` = ceil(ocpg / kChannelBlock)), and each sum runs
// over the items in order, so the gradient is the same whatever the round size.
template <typename R>
struct AccumulateConj {
  Divisor bins, oblocks, icpg;
  int64_t groups, ocpg, items;
  bool first;
  const Cx<R>* x;
  const Cx<R>* dy;
  Cx<R>* acc;
  template <typename I>
  LC_HD void operator()(I e) const {
    // e = ((grp * icpg + i) * oblocks + block) * bins + bin
    const PlanePos at = Split3(e, bins, oblocks, icpg);
    const int64_t nb = bins.value(), bin = at.c, o0 = at.r * kChannelBlock, i = at.z;
    const int64_t grp = at.p;
    const int n = static_cast<int>(MinOf(kChannelBlock, ocpg - o0));
    const int64_t ni = icpg.value();
    Cx<R>* out = acc + ((grp * ni + i) * ocpg + o0) * nb + bin;
    R re[kChannelBlock] = {}, im[kChannelBlock] = {};
    for (int k = 0; k < n && !first; ++k) {
      re[k] = out[k * nb].re;
      im[k] = out[k * nb].im;
    }
    const Cx<R>* xs = x + (grp * ni + i) * nb + bin;
    const Cx<R>* ys = dy + (grp * ocpg + o0) * nb + bin;
    for (int64_t it = 0; it < items; ++it) {
      const Cx<R> a = xs[it * groups * ni * nb];
      for (int k = 0; k < n; ++k) {
        const Cx<R> b = ys[(it * groups * ocpg + k) * nb];
        re[k] += a.re * b.re + a.im * b.im;
        im[k] += a.im * b.re - a.re * b.im;
      }
    }
    for (int k = 0; k < n; ++k) out[k * nb] = Cx<R>{re[k], im[k]};
  }
};

// Filter gradient tap (kd, kh, kw, i, co) from the transformed-back accumulator of
// (group, i, o): lag (kd, kh, kw) * dilation, less the tiling's shift, times `scale`.
template <typename T, typename R>
struct ReadFilter {
  TileGeom g;
  FftGeom f;
  R scale;
  const R* real;
  T* out;
  template <typename I>
  LC_HD void operator()(I e) const {
    const int64_t co = e % g.out_c, i = e / g.out_c % g.cin_g;
    const int64_t kw = e / (g.out_c * g.cin_g) % g.filter_w,
                  kh = e / (g.out_c * g.cin_g * g.filter_w) % g.filter_h,
                  kd = e / (g.out_c * g.cin_g * g.filter_w * g.filter_h);
    const int64_t s = ((co / g.cout_g) * g.cin_g + i) * g.cout_g + co % g.cout_g;
    out[e] = Store<T>(scale * real[s * f.plane + kd * g.dilation_d * f.slice +
                                   f.div_fh.Mod(kh * g.dilation_h - f.t.shift_h) * f.pitch +
                                   f.div_fw.Mod(kw * g.dilation_w - f.t.shift_w)]);
  }
};

// Runs a planned FFT pass (plan.algorithm == kGpuFft) through `run`:
//   run.ForEach(count, functor)               functor(i) for i in [0, count), i an int32_t
//                                             when count < kNarrowCount, else an int64_t
//   run.Transform(shape, data, work)          in place, unnormalised, `work` its work area
//   run.Direct(geom, pass, config, a, b, out, workspace, gate)
//                                             the direct kernels, skipped unless *gate != 0
// Operands in RunPass's order; `workspace` holds plan.workspace_bytes.
// One planned FFT pass as its phases see it: the plan, the workspace carved up by the
// layout, and the geometry in the kernels' terms.
template <typename T, class Runner>
struct FftPassRun {
  using R = AccT<T>;
  const CudaPlan& plan;
  const GpuFftConfig& c;
  const TileGeom g;
  const int rb;
  const GpuFftLayout l;
  const FftTiling& t;
  const FftGeom f;
  R* filters;
  R* src;
  R* dst;
  void* work;
  int* flag;  // set by the loads of a value that is not finite
  const R scale;
  Runner& run;

  // Geometry: ConvGeometry or Conv3dGeometry.
  template <class Geometry>
  FftPassRun(const Geometry& geom, const CudaPlan& p, char* workspace, Runner& r)
      : plan(p),
        c(p.fft),
        g(MakeTileGeom(geom)),
        rb(static_cast<int>(sizeof(R))),
        l(MakeGpuFftLayout(geom, p.pass, c, rb)),
        t(c.tiling),
        f(MakeFftGeom(c, l.bins)),
        filters(reinterpret_cast<R*>(workspace + l.filters)),
        src(reinterpret_cast<R*>(workspace + l.src)),
        dst(reinterpret_cast<R*>(workspace + l.dst)),
        work(workspace + l.fft_bytes),
        flag(reinterpret_cast<int*>(workspace)),
        scale(R(1) / static_cast<R>(c.fft_d * c.fft_h * c.fft_w)),
        run(r) {}

  static Cx<R>* Spectra(R* p) { return reinterpret_cast<Cx<R>*>(p); }
  void Transform(bool inverse, int64_t batch, R* data) const {
    if (batch > 0) {
      run.Transform(TransformShape{inverse, rb, c.fft_h, c.fft_w, batch, c.fft_d}, data, work);
    }
  }
  // The input / output as PackTiles reads them, its dense positions offset by `org`
  // (depth, height, width) and stuffed by `stuff`.
  PackDim InputDim(int i, int64_t org) const {
    return i == 0   ? PackDim{g.in_d, Divisor(1), org, g.in_sd}
           : i == 1 ? PackDim{g.in_h, Divisor(1), org, g.in.h}
                    : PackDim{g.in_w, Divisor(1), org, g.in.w};
  }
  PackDim OutputDim(int i, int64_t org) const {
    return i == 0   ? PackDim{g.out_d, Divisor(g.stride_d), org, g.out_sd}
           : i == 1 ? PackDim{g.out_h, Divisor(g.stride_h), org, g.out.h}
                    : PackDim{g.out_w, Divisor(g.stride_w), org, g.out.w};
  }

  // A pass that writes the filter: the gradient spectra accumulate over rounds of items
  // (input against out_backprop transforms), then one inverse transform reads them out.
  void FilterGradient(const T* a, const T* b, T* out) const {
    if (c.items == 0) {
      run.ForEach(g.filter_elements(), Fill<T>{out});
      return;
    }
    for (int64_t item0 = 0; item0 < c.items; item0 += c.chunk) {
      const int64_t items = MinOf(c.chunk, c.items - item0);
      const int64_t rows_a = items * g.cin_g * g.groups * f.fd * f.fh;
      const RowLanes pack_a = MakeRowLanes(f.pitch, rows_a, Runner::kRowThreads);
      run.ForEach(pack_a.count(rows_a),
                  PackTiles<T, R>{f, pack_a, a, g.in.n, g.in.c, Divisor(g.cin_g * g.groups),
                                  InputDim(0, -g.pad_front), InputDim(1, t.shift_h - g.pad_top),
                                  InputDim(2, t.shift_w - g.pad_left), false, item0, src, flag});
      Transform(false, items * l.src_channels, src);
      const int64_t rows_b = items * g.out_c * f.fd * f.fh;
      const RowLanes pack_b = MakeRowLanes(f.pitch, rows_b, Runner::kRowThreads);
      run.ForEach(pack_b.count(rows_b),
                  PackTiles<T, R>{f, pack_b, b, g.out.n, g.out.c, Divisor(g.out_c), OutputDim(0, 0),
                                  OutputDim(1, 0), OutputDim(2, 0), true, item0, dst, flag});
      Transform(false, items * l.dst_channels, dst);
      const int64_t oblocks = CeilDiv(g.cout_g, kChannelBlock);
      run.ForEach(
          g.groups * g.cin_g * oblocks * l.bins,
          AccumulateConj<R>{Divisor(l.bins), Divisor(oblocks), Divisor(g.cin_g), g.groups, g.cout_g,
                            items, item0 == 0, Spectra(src), Spectra(dst), Spectra(filters)});
    }
    Transform(true, l.filter_spectra, filters);
    run.ForEach(g.filter_elements(), ReadFilter<T, R>{g, f, scale, filters, out});
  }

  // A pass that writes an image: the filter spectra once, then per round of items the
  // source transforms, their products with the filters, and the destination's tiles.
  void Correlation(const T* a, const T* b, T* out) const {
    const bool bpi = RolesOf(plan.pass).out == ConvTensor::kInput;
    const int64_t scpg = bpi ? g.cout_g : g.cin_g, dcpg = bpi ? g.cin_g : g.cout_g;
    run.ForEach(l.filter_spectra * f.plane,
                PlaceFilters<T, R>{g, f, bpi, Divisor(scpg), Divisor(dcpg), Divisor(g.dilation_d),
                                   Divisor(g.dilation_h), Divisor(g.dilation_w), scale, bpi ? a : b,
                                   filters, flag});
    Transform(false, l.filter_spectra, filters);
    const T* source = bpi ? b : a;
    const Strides4 ss = bpi ? g.out : g.in, ds = bpi ? g.in : g.out;
    const int64_t off_d =
        bpi ? g.pad_front - DilatedExtent(g.filter_d, g.dilation_d) + 1 : -g.pad_front;
    const int64_t off_h =
        bpi ? g.pad_top - DilatedExtent(g.filter_h, g.dilation_h) + 1 : -g.pad_top;
    const int64_t off_w =
        bpi ? g.pad_left - DilatedExtent(g.filter_w, g.dilation_w) + 1 : -g.pad_left;
    const auto dim = [&](int i, int64_t org) { return bpi ? OutputDim(i, org) : InputDim(i, org); };
    for (int64_t item0 = 0; item0 < c.items; item0 += c.chunk) {
      const int64_t items = MinOf(c.chunk, c.items - item0);
      const int64_t src_rows = items * l.src_channels * f.fd * f.fh;
      const RowLanes pack = MakeRowLanes(f.pitch, src_rows, Runner::kRowThreads);
      run.ForEach(pack.count(src_rows),
                  PackTiles<T, R>{f, pack, source, ss.n, ss.c, Divisor(l.src_channels),
                                  dim(0, off_d), dim(1, off_h + t.shift_h),
                                  dim(2, off_w + t.shift_w), false, item0, src, flag});
      Transform(false, items * l.src_channels, src);
      const int64_t dblocks = CeilDiv(dcpg, kChannelBlock);
      run.ForEach(items * g.groups * dblocks * l.bins,
                  MultiplyConj<R>{Divisor(l.bins), Divisor(dblocks), Divisor(g.groups), scpg, dcpg,
                                  Spectra(src), Spectra(filters), Spectra(dst)});
      Transform(true, items * l.dst_channels, dst);
      const int64_t dst_rows = items * l.dst_channels * c.tile_d * t.tile_h;
      const RowLanes store = MakeRowLanes(t.tile_w, dst_rows, Runner::kRowThreads);
      run.ForEach(
          store.count(dst_rows),
          StoreTiles<T, R>{f, store, out, ds, bpi ? g.in_sd : g.out_sd, Divisor(l.dst_channels),
                           Divisor(bpi ? 1 : g.stride_d), Divisor(bpi ? 1 : g.stride_h),
                           Divisor(bpi ? 1 : g.stride_w), item0, dst});
    }
  }
};

// Geometry: ConvGeometry or Conv3dGeometry.
template <typename T, class Geometry, class Runner>
void RunFftPass(const Geometry& geom, const CudaPlan& plan, const T* a, const T* b, T* out,
                char* workspace, Runner& run) {
  const ConvPass pass = plan.pass;
  const FftPassRun<T, Runner> phases(geom, plan, workspace, run);
  run.ForEach(1, SetFlag{phases.flag, 0});
  if (WritesFilter(pass)) {
    phases.FilterGradient(a, b, out);
  } else {
    phases.Correlation(a, b, out);
  }
  run.Direct(geom, pass, plan.direct, a, b, out, workspace + kFlagBytes, phases.flag);
}

}  // namespace cuda
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CUDA_FFT_PIPELINE_H_
