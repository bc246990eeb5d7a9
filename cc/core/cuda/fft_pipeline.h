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

// A plane element's position: its column, row and depth slice, and its plane.
struct PlanePos {
  int64_t col, row, slice, plane;
};
// A tile's image and the dense position of its origin.
struct TileOrigin {
  int64_t image, d, h, w;
};

// Row `row` of an array [plane][nz][ny][nx] as (0, row, slice, plane).
template <typename I>
LC_HD PlanePos SplitRow(I row, const Divisor& ny, const Divisor& nz) {
  const I slab = ny.Quot(row), rest = nz.Quot(slab);
  return {0, row - slab * static_cast<I>(ny.value()), slab - rest * static_cast<I>(nz.value()),
          rest};
}
// e as (col, row, slice, plane): its index in each dimension of an array
// [plane][nz][ny][nx].
template <typename I>
LC_HD PlanePos Split3(I e, const Divisor& nx, const Divisor& ny, const Divisor& nz) {
  const I row = nx.Quot(e);
  PlanePos at = SplitRow(row, ny, nz);
  at.col = e - row * static_cast<I>(nx.value());
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
  FftTiling tiling;                         // height and width
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
    return {image, depth * tile_d, row * tiling.tile_h,
            (in_depth - row * tiling.tiles_w) * tiling.tile_w};
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
  TileGeom geom;
  FftGeom fft;
  bool flip;
  Divisor src_per_group, dst_per_group, dilation_d, dilation_h, dilation_w;
  R scale;
  const T* filter;
  R* dst;
  int* flag;
  template <typename I>
  LC_HD void operator()(I e) const {
    const PlanePos at = fft.Position(e);
    const int64_t pair = dst_per_group.Quot(at.plane), grp = src_per_group.Quot(pair);
    const int64_t sc = pair - grp * src_per_group.value();
    const int64_t dc = at.plane - pair * dst_per_group.value();
    const int64_t ked = DilatedExtent(geom.filter_d, geom.dilation_d),
                  keh = DilatedExtent(geom.filter_h, geom.dilation_h),
                  kew = DilatedExtent(geom.filter_w, geom.dilation_w);
    const int64_t kd =
        StuffedIndex(flip ? ked - 1 - at.slice : at.slice, dilation_d, geom.filter_d);
    const int64_t kh = StuffedIndex(flip ? keh - 1 - at.row : at.row, dilation_h, geom.filter_h);
    const int64_t kw = StuffedIndex(flip ? kew - 1 - at.col : at.col, dilation_w, geom.filter_w);
    R v = R(0);
    if (at.col < fft.fw && kd >= 0 && kh >= 0 && kw >= 0) {
      const int64_t ci = flip ? dc : sc, co = grp * geom.cout_g + (flip ? sc : dc);
      const int64_t tap = (kd * geom.filter_h + kh) * geom.filter_w + kw;
      v = scale * LoadChecked<R>(filter[(tap * geom.cin_g + ci) * geom.out_c + co], flag);
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
  FftGeom fft;
  RowLanes lanes;
  const T* base;
  int64_t image_stride, channel_stride;
  Divisor channels;
  PackDim depth, height, width;
  bool clip;
  int64_t item0;
  R* dst;
  int* flag;
  template <typename I>
  LC_HD void operator()(I e) const {
    const I row = lanes.Row(e);
    const PlanePos at = fft.PlaneRow(row);
    const int64_t r = at.row, z = at.slice;
    const int64_t local = channels.Quot(at.plane), ch = at.plane - local * channels.value();
    const TileOrigin o = fft.Origin(item0 + local);
    const FftTiling& t = fft.tiling;
    R* out = dst + static_cast<int64_t>(row) * fft.pitch;
    // Columns [0, end) may hold source values; the rest of the row is zero.
    int64_t end = fft.fw;
    if (clip) {
      const bool row_inside =
          z < fft.tile_d && o.d + z < fft.dense_d && r < t.tile_h && o.h + r < t.dense_h;
      end = row_inside ? MinOf(t.tile_w, t.dense_w - o.w) : 0;
    }
    const int64_t iz = depth.Index(o.d + depth.org + z), iy = height.Index(o.h + height.org + r);
    if (iz < 0 || iy < 0) end = 0;
    const T* src = end > 0 ? base + o.image * image_stride + ch * channel_stride +
                                 iz * depth.stride + iy * height.stride
                           : base;
    const int64_t q0 = o.w + width.org;
    for (int64_t c = lanes.Lane(e); c < fft.pitch; c += lanes.width()) {
      R v = R(0);
      if (c < end) {
        const int64_t ix = width.Index(q0 + c);
        if (ix >= 0) v = LoadChecked<R>(src[ix * width.stride], flag);
      }
      out[c] = v;
    }
  }
};

// `n` sums of products a * conj(b_k), k < n, with `a` from `as` and `b_k` from `bs`, `count`
// terms: term j takes as[j * a_step] and bs[j * b_step + k * k_step]. The spectral products
// of MultiplyConj and AccumulateConj.
template <typename R>
LC_HD void MacConjBlock(const Cx<R>* as, int64_t a_step, const Cx<R>* bs, int64_t b_step,
                        int64_t k_step, int64_t count, int n, R* re, R* im) {
  for (int64_t j = 0; j < count; ++j) {
    const Cx<R> a = as[j * a_step];
    for (int k = 0; k < n; ++k) {
      const Cx<R> b = bs[j * b_step + k * k_step];
      re[k] += a.re * b.re + a.im * b.im;
      im[k] += a.im * b.re - a.re * b.im;
    }
  }
}

// A spectral-product thread's place: e = ((outer * middle + mid) * blocks + block) * bins +
// bin, owning `count` (up to kChannelBlock) channels from `first` of one bin, of
// `channels` in all.
struct BinBlock {
  int64_t bin, first, mid, outer;
  int count;
};
template <typename I>
LC_HD BinBlock SplitBinBlock(I e, const Divisor& bins, const Divisor& blocks, const Divisor& middle,
                             int64_t channels) {
  const PlanePos at = Split3(e, bins, blocks, middle);
  const int64_t first = at.row * kChannelBlock;
  return {at.col, first, at.slice, at.plane,
          static_cast<int>(MinOf(kChannelBlock, channels - first))};
}
// Stores the `n` sums re + i im, `step` apart.
template <typename R>
LC_HD void StoreSums(Cx<R>* out, int64_t step, int n, const R* re, const R* im) {
  for (int k = 0; k < n; ++k) out[k * step] = Cx<R>{re[k], im[k]};
}

// dst(item, group, dc) = sum over the group's source channels sc of
// src(item, group, sc) * conj(filters(group, sc, dc)), bin by bin; a thread owns up to
// kChannelBlock consecutive dc of one bin (`dblocks` = ceil(dst_per_group / kChannelBlock)).
template <typename R>
struct MultiplyConj {
  Divisor bins, dblocks, groups;
  int64_t src_per_group, dst_per_group;
  const Cx<R>* src;
  const Cx<R>* filters;
  Cx<R>* dst;
  template <typename I>
  LC_HD void operator()(I e) const {
    // e = ((item * groups + grp) * dblocks + block) * bins + bin
    const int64_t scpg = src_per_group, dcpg = dst_per_group;
    const BinBlock at = SplitBinBlock(e, bins, dblocks, groups, dcpg);
    const int64_t nb = bins.value(), dc0 = at.first, grp = at.mid, item = at.outer;
    const int64_t ng = groups.value();
    const Cx<R>* xs = src + (item * ng * scpg + grp * scpg) * nb + at.bin;
    const Cx<R>* fs = filters + (grp * scpg * dcpg + dc0) * nb + at.bin;
    R re[kChannelBlock] = {}, im[kChannelBlock] = {};
    MacConjBlock(xs, nb, fs, dcpg * nb, nb, scpg, at.count, re, im);
    StoreSums(dst + (item * ng * dcpg + grp * dcpg + dc0) * nb + at.bin, nb, at.count, re, im);
  }
};

// The wanted outputs of a round's result planes into the destination tensor: dense tile
// position (z, r, c) of item it is output ((p0 + (z, r, c)) / out_stride) when on the
// stride grid, read from the plane at (r, c) - shift modulo the transform size (depth has
// no shift). One call per lane of a tile row (RowLanes).
template <typename T, typename R>
struct StoreTiles {
  FftGeom fft;
  RowLanes lanes;
  T* out;
  Strides4 out_strides;  // the destination's element strides
  int64_t out_depth_stride;
  Divisor channels, out_sd, out_sh, out_sw;
  int64_t item0;
  const R* real;
  template <typename I>
  LC_HD void operator()(I e) const {
    const PlanePos at = fft.TileRow(lanes.Row(e));
    const int64_t r = at.row, z = at.slice;
    const int64_t local = channels.Quot(at.plane), ch = at.plane - local * channels.value();
    const TileOrigin o = fft.Origin(item0 + local);
    const FftTiling& t = fft.tiling;
    const int64_t pd = o.d + z, ph = o.h + r;
    if (pd >= fft.dense_d || ph >= t.dense_h) return;
    const int64_t od = out_sd.Quot(pd), oh = out_sh.Quot(ph);
    if (od * out_sd.value() != pd || oh * out_sh.value() != ph) return;
    const R* src =
        real + at.plane * fft.plane + z * fft.slice + fft.div_fh.Mod(r - t.shift_h) * fft.pitch;
    T* dst = out + o.image * out_strides.n + ch * out_strides.c + od * out_depth_stride +
             oh * out_strides.h;
    const int64_t end = MinOf(t.tile_w, t.dense_w - o.w);
    for (int64_t c = lanes.Lane(e); c < end; c += lanes.width()) {
      const int64_t pw = o.w + c, ow = out_sw.Quot(pw);
      if (ow * out_sw.value() != pw) continue;
      dst[ow * out_strides.w] = Store<T>(src[fft.div_fw.Mod(c - t.shift_w)]);
    }
  }
};

// acc(group, i, o) (+)= sum over the round's items, in order, of input(item, group, i) *
// conj(out_backprop(item, group, o)); `first` starts the sum. A thread owns one bin of up
// to kChannelBlock consecutive o (`oblocks` = ceil(out_per_group / kChannelBlock)), and
// each sum runs over the items in order, so the gradient is the same whatever the round
// size.
template <typename R>
struct AccumulateConj {
  Divisor bins, oblocks, in_per_group;
  int64_t groups, out_per_group, items;
  bool first;
  const Cx<R>* input;
  const Cx<R>* out_backprop;
  Cx<R>* acc;
  template <typename I>
  LC_HD void operator()(I e) const {
    // e = ((grp * in_per_group + i) * oblocks + block) * bins + bin
    const int64_t ocpg = out_per_group;
    const BinBlock at = SplitBinBlock(e, bins, oblocks, in_per_group, ocpg);
    const int64_t nb = bins.value(), o0 = at.first, i = at.mid, grp = at.outer;
    const int64_t ni = in_per_group.value();
    Cx<R>* out = acc + ((grp * ni + i) * ocpg + o0) * nb + at.bin;
    R re[kChannelBlock] = {}, im[kChannelBlock] = {};
    for (int k = 0; k < at.count && !first; ++k) {
      re[k] = out[k * nb].re;
      im[k] = out[k * nb].im;
    }
    const Cx<R>* xs = input + (grp * ni + i) * nb + at.bin;
    const Cx<R>* ys = out_backprop + (grp * ocpg + o0) * nb + at.bin;
    MacConjBlock(xs, groups * ni * nb, ys, groups * ocpg * nb, nb, items, at.count, re, im);
    StoreSums(out, nb, at.count, re, im);
  }
};

// Filter gradient tap (kd, kh, kw, i, co) from the transformed-back accumulator of
// (group, i, o): lag (kd, kh, kw) * dilation, less the tiling's shift, times `scale`.
template <typename T, typename R>
struct ReadFilter {
  TileGeom geom;
  FftGeom fft;
  R scale;
  const R* real;
  T* out;
  template <typename I>
  LC_HD void operator()(I e) const {
    const TileGeom& g = geom;
    const FftTiling& t = fft.tiling;
    const int64_t co = e % g.out_c, i = e / g.out_c % g.cin_g;
    const int64_t kw = e / (g.out_c * g.cin_g) % g.filter_w,
                  kh = e / (g.out_c * g.cin_g * g.filter_w) % g.filter_h,
                  kd = e / (g.out_c * g.cin_g * g.filter_w * g.filter_h);
    const int64_t s = ((co / g.cout_g) * g.cin_g + i) * g.cout_g + co % g.cout_g;
    out[e] = Store<T>(scale * real[s * fft.plane + kd * g.dilation_d * fft.slice +
                                   fft.div_fh.Mod(kh * g.dilation_h - t.shift_h) * fft.pitch +
                                   fft.div_fw.Mod(kw * g.dilation_w - t.shift_w)]);
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
  const GpuFftConfig& config;
  const TileGeom geom;
  const int real_bytes;
  const GpuFftLayout layout;
  const FftTiling& tiling;
  const FftGeom fft;
  R* filters;
  R* src;
  R* dst;
  void* work;
  int* flag;  // set by the loads of a value that is not finite
  const R scale;
  Runner& run;

  // Geometry: ConvGeometry or Conv3dGeometry.
  template <class Geometry>
  FftPassRun(const Geometry& conv, const CudaPlan& cuda_plan, char* workspace, Runner& runner)
      : plan(cuda_plan),
        config(cuda_plan.fft),
        geom(MakeTileGeom(conv)),
        real_bytes(static_cast<int>(sizeof(R))),
        layout(MakeGpuFftLayout(conv, cuda_plan.pass, config, real_bytes)),
        tiling(config.tiling),
        fft(MakeFftGeom(config, layout.bins)),
        filters(reinterpret_cast<R*>(workspace + layout.filters)),
        src(reinterpret_cast<R*>(workspace + layout.src)),
        dst(reinterpret_cast<R*>(workspace + layout.dst)),
        work(workspace + layout.fft_bytes),
        flag(reinterpret_cast<int*>(workspace)),
        scale(R(1) / static_cast<R>(config.fft_d * config.fft_h * config.fft_w)),
        run(runner) {}

  static Cx<R>* Spectra(R* p) { return reinterpret_cast<Cx<R>*>(p); }
  void Transform(bool inverse, int64_t batch, R* data) const {
    if (batch > 0) {
      run.Transform(
          TransformShape{inverse, real_bytes, config.fft_h, config.fft_w, batch, config.fft_d},
          data, work);
    }
  }
  // The input / output as PackTiles reads them, its dense positions offset by `org`
  // (depth, height, width) and stuffed by `stuff`.
  PackDim InputDim(int i, int64_t org) const {
    return i == 0   ? PackDim{geom.in_d, Divisor(1), org, geom.in_sd}
           : i == 1 ? PackDim{geom.in_h, Divisor(1), org, geom.in.h}
                    : PackDim{geom.in_w, Divisor(1), org, geom.in.w};
  }
  PackDim OutputDim(int i, int64_t org) const {
    return i == 0   ? PackDim{geom.out_d, Divisor(geom.stride_d), org, geom.out_sd}
           : i == 1 ? PackDim{geom.out_h, Divisor(geom.stride_h), org, geom.out.h}
                    : PackDim{geom.out_w, Divisor(geom.stride_w), org, geom.out.w};
  }
  // PackTiles over the round of `items` items from item0: `channels` planes each from
  // `base` (`strides` its element strides), into `planes`.
  void Pack(const T* base, const Strides4& strides, int64_t channels, PackDim depth, PackDim height,
            PackDim width, bool clip, int64_t item0, int64_t items, R* planes) const {
    const int64_t rows = items * channels * fft.fd * fft.fh;
    const RowLanes lanes = MakeRowLanes(fft.pitch, rows, Runner::kRowThreads);
    run.ForEach(lanes.count(rows),
                PackTiles<T, R>{fft, lanes, base, strides.n, strides.c, Divisor(channels), depth,
                                height, width, clip, item0, planes, flag});
  }

  // A pass that writes the filter: the gradient spectra accumulate over rounds of items
  // (input against out_backprop transforms), then one inverse transform reads them out.
  void FilterGradient(const T* input, const T* out_backprop, T* out) const {
    const TileGeom& g = geom;
    if (config.items == 0) {
      run.ForEach(g.filter_elements(), Fill<T>{out});
      return;
    }
    for (int64_t item0 = 0; item0 < config.items; item0 += config.chunk) {
      const int64_t items = MinOf(config.chunk, config.items - item0);
      Pack(input, g.in, g.cin_g * g.groups, InputDim(0, -g.pad_front),
           InputDim(1, tiling.shift_h - g.pad_top), InputDim(2, tiling.shift_w - g.pad_left), false,
           item0, items, src);
      Transform(false, items * layout.src_channels, src);
      Pack(out_backprop, g.out, g.out_c, OutputDim(0, 0), OutputDim(1, 0), OutputDim(2, 0), true,
           item0, items, dst);
      Transform(false, items * layout.dst_channels, dst);
      const int64_t oblocks = CeilDiv(g.cout_g, kChannelBlock);
      run.ForEach(g.groups * g.cin_g * oblocks * layout.bins,
                  AccumulateConj<R>{Divisor(layout.bins), Divisor(oblocks), Divisor(g.cin_g),
                                    g.groups, g.cout_g, items, item0 == 0, Spectra(src),
                                    Spectra(dst), Spectra(filters)});
    }
    Transform(true, layout.filter_spectra, filters);
    run.ForEach(g.filter_elements(), ReadFilter<T, R>{g, fft, scale, filters, out});
  }

  // A pass that writes an image: the filter spectra once, then per round of items the
  // source transforms, their products with the filters, and the destination's tiles.
  void Correlation(const T* a, const T* b, T* out) const {
    const TileGeom& g = geom;
    const bool backprop_input = RolesOf(plan.pass).out == ConvTensor::kInput;
    const int64_t src_per_group = backprop_input ? g.cout_g : g.cin_g;
    const int64_t dst_per_group = backprop_input ? g.cin_g : g.cout_g;
    run.ForEach(
        layout.filter_spectra * fft.plane,
        PlaceFilters<T, R>{g, fft, backprop_input, Divisor(src_per_group), Divisor(dst_per_group),
                           Divisor(g.dilation_d), Divisor(g.dilation_h), Divisor(g.dilation_w),
                           scale, backprop_input ? a : b, filters, flag});
    Transform(false, layout.filter_spectra, filters);
    const T* source = backprop_input ? b : a;
    const Strides4 src_strides = backprop_input ? g.out : g.in;
    const Strides4 dst_strides = backprop_input ? g.in : g.out;
    // The source's dense offset in each dimension: the filter's reach before the output
    // position for backprop-input, the padding before the input for the forward pass.
    const auto offset = [&](int64_t pad, int64_t filter, int64_t dilation) {
      return backprop_input ? pad - DilatedExtent(filter, dilation) + 1 : -pad;
    };
    const auto dim = [&](int i, int64_t org) {
      return backprop_input ? OutputDim(i, org) : InputDim(i, org);
    };
    for (int64_t item0 = 0; item0 < config.items; item0 += config.chunk) {
      const int64_t items = MinOf(config.chunk, config.items - item0);
      Pack(source, src_strides, layout.src_channels,
           dim(0, offset(g.pad_front, g.filter_d, g.dilation_d)),
           dim(1, offset(g.pad_top, g.filter_h, g.dilation_h) + tiling.shift_h),
           dim(2, offset(g.pad_left, g.filter_w, g.dilation_w) + tiling.shift_w), false, item0,
           items, src);
      Transform(false, items * layout.src_channels, src);
      const int64_t dblocks = CeilDiv(dst_per_group, kChannelBlock);
      run.ForEach(
          items * g.groups * dblocks * layout.bins,
          MultiplyConj<R>{Divisor(layout.bins), Divisor(dblocks), Divisor(g.groups), src_per_group,
                          dst_per_group, Spectra(src), Spectra(filters), Spectra(dst)});
      Transform(true, items * layout.dst_channels, dst);
      const int64_t dst_rows = items * layout.dst_channels * config.tile_d * tiling.tile_h;
      const RowLanes store = MakeRowLanes(tiling.tile_w, dst_rows, Runner::kRowThreads);
      run.ForEach(
          store.count(dst_rows),
          StoreTiles<T, R>{fft, store, out, dst_strides, backprop_input ? g.in_sd : g.out_sd,
                           Divisor(layout.dst_channels), Divisor(backprop_input ? 1 : g.stride_d),
                           Divisor(backprop_input ? 1 : g.stride_h),
                           Divisor(backprop_input ? 1 : g.stride_w), item0, dst});
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
