// Direct convolution as shared-memory tile kernels, written once for the CUDA device and the
// host. Each kernel is a struct of phases that a thread block runs in lock-step:
//
//   for every block:  acc = 0
//   for every step:  LoadTile (all threads) | barrier
//                                      Accumulate             | barrier
//                     StoreResult
//
// The CUDA driver (direct.cu) runs the phases with __syncthreads() as the barriers; the
// host emulation (emulate.h) runs each phase for every thread of a block before the next,
// which is the same semantics, so the host test suite checks the exact index arithmetic the
// device runs. No im2col and no atomics: every output is one thread's sum, in a fixed order.
//
// Passes (filter HWIO, [KH, KW, C_in / groups, C_out], or DHWIO in 3-D):
//  forward          threads own output positions, step over (in-channel, filter chunk);
//  backprop-input   threads own input positions, step over (out-channel, filter chunk);
//  backprop-filter  threads own filter taps, step over (output row, column chunk) of one
//                   of `reduce_chunks` slices of the batch x output rows; each slice writes
//                   a partial sum and a second kernel adds the partials in slice order
//                   (or, with one slice, the first kernel stores the result directly).
// The same kernels run the Conv3D family: a block covers one depth of the tensor it
// writes (backprop-filter: one filter depth), and the depth of the other image a step
// reads follows from its filter tap as height does; a 2-D geometry is the depth-1 case.
#ifndef TF_LARGECONV_CORE_CUDA_TILES_H_
#define TF_LARGECONV_CORE_CUDA_TILES_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cc/core/common/dtypes.h"
#include "cc/core/common/geometry.h"
#include "cc/core/common/hd.h"
#include "cc/core/common/vocabulary.h"

namespace largeconv {
namespace cuda {

// Shared memory a block may use without opting in, on every CUDA architecture.
constexpr int64_t kSmemBytes = 48 * 1024;
// Enough blocks to fill an H100/H200 (132 SMs) a few times over; sets the batch slicing
// of backprop-filter.
constexpr int64_t kTargetBlocks = 2048;

// The geometry as the kernels read it: the ConvGeometry itself (plain integers, copied to
// the device as a kernel argument) plus what the kernels would otherwise recompute per
// element: channels per group and element strides per layout, and the depth dimension
// (size 1, stride 0 in 2-D; a Conv3dGeometry's depth, its height and width in the 2-D
// fields). Made by MakeTileGeom only.
struct TileGeom : ConvGeometry {
  int64_t cin_g = 0, cout_g = 0;  // input / output channels per group
  Strides4 in{}, out{};           // of input / in_backprop and of output / out_backprop
  int64_t in_d = 1, filter_d = 1, out_d = 1, stride_d = 1, dilation_d = 1, pad_front = 0;
  int64_t in_sd = 0, out_sd = 0;  // element strides of the input's / output's depth
  // Taps of the whole (3-D) filter: the 2-D count times its depth.
  LC_HD int64_t filter_elements() const {
    return filter_d * filter_h * filter_w * filter_in_c * out_c;
  }
  // Depth of one of the three tensors.
  LC_HD int64_t depth(ConvTensor t) const {
    return t == ConvTensor::kInput ? in_d : t == ConvTensor::kFilter ? filter_d : out_d;
  }
};

// How a pass is cut into blocks; chosen on the host by MakeTileConfig, from the geometry,
// the accumulator size and the workspace limit only (never from the device), so results
// are the same on every GPU.
struct TileConfig {
  int64_t tile_h = 1, tile_w = 1;    // threads per block = tile_h * tile_w
  int64_t chunk_h = 1, chunk_w = 1;  // filter taps per step (backprop-filter: chunk_w =
                                     // output columns per step)
  int64_t patch_h = 1, patch_w = 1;  // shared-memory patch (pitch patch_w)
  int64_t channels = 1;              // channels per thread: the kernels' template C
  int64_t reduce_chunks = 1;         // backprop-filter slices
  int64_t blocks = 0;
  int64_t smem_elems = 0;  // accumulator elements of shared memory per block
  int64_t workspace_bytes = 0;
  int64_t threads() const { return tile_h * tile_w; }
};

TileGeom MakeTileGeom(const ConvGeometry& g);
TileGeom MakeTileGeom(const Conv3dGeometry& g);
// acc_bytes: 4 for float/half/bfloat16, 8 for double. workspace_limit < 0: the default.
TileConfig MakeTileConfig(const ConvGeometry& g, ConvPass pass, int acc_bytes,
                          int64_t workspace_limit);
TileConfig MakeTileConfig(const Conv3dGeometry& g, ConvPass pass, int acc_bytes,
                          int64_t workspace_limit);

// Output positions x channel blocks of a group: the block order shared by forward and
// backprop-input (spatial tiles fastest, so neighbouring blocks share filter chunks; then
// the depth z the block covers): image n, group grp, channel block cblock, and the tile's
// origin (y0, x0).
struct SpatialBlock {
  int64_t n, grp, cblock, z, y0, x0;
};
LC_HD inline SpatialBlock DecodeSpatial(int64_t b, int64_t d, int64_t h, int64_t w, int64_t cblocks,
                                        int64_t groups, const TileConfig& c) {
  const int64_t tiles_x = CeilDiv(w, c.tile_w), tiles_y = CeilDiv(h, c.tile_h);
  SpatialBlock k;
  k.x0 = (b % tiles_x) * c.tile_w;
  b /= tiles_x;
  k.y0 = (b % tiles_y) * c.tile_h;
  b /= tiles_y;
  k.z = b % d;
  b /= d;
  k.cblock = b % cblocks;
  b /= cblocks;
  k.grp = b % groups;
  k.n = b / groups;
  return k;
}

// One step of forward / backprop-input: a channel of the reduction (in-channel forward,
// out-channel within the group backprop-input), a filter depth and the first tap of a
// filter chunk.
struct TapStep {
  int64_t ch, kd, kh0, kw0;
};
LC_HD inline int64_t TapSteps(const TileGeom& g, const TileConfig& c, int64_t channels) {
  return channels * g.filter_d * CeilDiv(g.filter_h, c.chunk_h) * CeilDiv(g.filter_w, c.chunk_w);
}
LC_HD inline TapStep DecodeTapStep(const TileGeom& g, const TileConfig& c, int64_t s) {
  const int64_t nw = CeilDiv(g.filter_w, c.chunk_w), nh = CeilDiv(g.filter_h, c.chunk_h);
  TapStep t;
  t.kw0 = (s % nw) * c.chunk_w;
  s /= nw;
  t.kh0 = (s % nh) * c.chunk_h;
  s /= nh;
  t.kd = s % g.filter_d;
  t.ch = s / g.filter_d;
  return t;
}

// Element offset of depth z of a tensor `depth` deep whose depth stride is `stride`, and
// the height of its planes there: 0 outside the tensor, so that a patch loaded from it is
// all zeros (LoadPatch).
struct DepthPlane {
  int64_t offset, height;
};
LC_HD inline DepthPlane PlaneAt(int64_t z, int64_t depth, int64_t stride, int64_t h) {
  const bool in = z >= 0 && z < depth;
  return {in ? z * stride : 0, in ? h : 0};
}

// The block's share of loading the patch_h x patch_w window at (y0, x0) of an h x w plane
// (element strides st.h, st.w) into dst; zero outside the plane.
template <typename T, typename A>
LC_HD inline void LoadPatch(const T* plane, int64_t y0, int64_t x0, int64_t h, int64_t w,
                            const Strides4& st, const TileConfig& c, int tid, int threads, A* dst) {
  for (int64_t e = tid; e < c.patch_h * c.patch_w; e += threads) {
    const int64_t y = y0 + e / c.patch_w, x = x0 + e % c.patch_w;
    const bool in = y >= 0 && y < h && x >= 0 && x < w;
    dst[e] = in ? static_cast<A>(Load(plane[y * st.h + x * st.w])) : A(0);
  }
}

// The block's share of loading a step's filter chunk as [chunk_h][chunk_w][C]: entry
// (kh, kw, o) is filter[tap(kd, kh, kw) + base + o * channel_stride], zero past the
// filter's edge or for o >= valid (the group's last channel block).
template <int C, typename T, typename A>
LC_HD inline void LoadFilterChunk(const T* filter, const TileGeom& g, const TileConfig& c,
                                  const TapStep& t, int64_t base, int64_t channel_stride,
                                  int64_t valid, int tid, int threads, A* dst) {
  const int64_t tap = g.cin_g * g.out_c;  // elements between neighbouring taps (DHWIO)
  const T* plane = filter + t.kd * g.filter_h * g.filter_w * tap + base;
  for (int64_t e = tid; e < c.chunk_h * c.chunk_w * C; e += threads) {
    const int64_t o = e % C, kw = t.kw0 + (e / C) % c.chunk_w, kh = t.kh0 + e / (C * c.chunk_w);
    const bool in = kh < g.filter_h && kw < g.filter_w && o < valid;
    dst[e] =
        in ? static_cast<A>(Load(plane[(kh * g.filter_w + kw) * tap + o * channel_stride])) : A(0);
  }
}

// Stores a thread's C accumulators to dst[o * stride] for o < valid.
template <int C, typename T, typename A>
LC_HD inline void StoreChannels(const A* acc, int64_t valid, int64_t stride, T* dst) {
  for (int o = 0; o < C && o < valid; ++o) dst[o * stride] = Store<T>(acc[o]);
}

template <typename T, int C>
struct ForwardTiles {
  using A = AccT<T>;
  static constexpr int kAcc = C;
  struct Params {
    TileGeom g;
    TileConfig c;
    const T* input;
    const T* filter;
    T* output;
  };
  using Block = SpatialBlock;

  LC_HD static Block Decode(const Params& p, int64_t b) {
    return DecodeSpatial(b, p.g.out_d, p.g.out_h, p.g.out_w, CeilDiv(p.g.cout_g, C), p.g.groups,
                         p.c);
  }
  LC_HD static int64_t Steps(const Params& p, const Block&) {
    return TapSteps(p.g, p.c, p.g.cin_g);
  }
  LC_HD static void LoadTile(const Params& p, const Block& k, int64_t s, int tid, int threads,
                             A* smem) {
    const TileGeom& g = p.g;
    const TileConfig& c = p.c;
    const TapStep t = DecodeTapStep(g, c, s);
    const DepthPlane d =
        PlaneAt(k.z * g.stride_d + t.kd * g.dilation_d - g.pad_front, g.in_d, g.in_sd, g.in_h);
    LoadPatch(p.input + k.n * g.in.n + d.offset + (k.grp * g.cin_g + t.ch) * g.in.c,
              k.y0 * g.stride_h + t.kh0 * g.dilation_h - g.pad_top,
              k.x0 * g.stride_w + t.kw0 * g.dilation_w - g.pad_left, d.height, g.in_w, g.in, c, tid,
              threads, smem);
    const int64_t c0 = k.cblock * C;  // first out-channel of the block within its group
    LoadFilterChunk<C>(p.filter, g, c, t, t.ch * g.out_c + k.grp * g.cout_g + c0, 1, g.cout_g - c0,
                       tid, threads, smem + c.patch_h * c.patch_w);
  }
  LC_HD static void Accumulate(const Params& p, const Block&, int64_t s, int tid, const A* smem,
                               A* acc) {
    const TileGeom& g = p.g;
    const TileConfig& c = p.c;
    const TapStep t = DecodeTapStep(g, c, s);
    const int64_t kh0 = t.kh0, kw0 = t.kw0;
    const int64_t ty = tid / c.tile_w, tx = tid % c.tile_w;
    const int64_t nh = MinOf(c.chunk_h, g.filter_h - kh0), nw = MinOf(c.chunk_w, g.filter_w - kw0);
    const A* filt = smem + c.patch_h * c.patch_w;
    for (int64_t i = 0; i < nh; ++i) {
      const A* row = smem + (ty * g.stride_h + i * g.dilation_h) * c.patch_w + tx * g.stride_w;
      const A* f = filt + i * c.chunk_w * C;
      for (int64_t j = 0; j < nw; ++j) {
        const A v = row[j * g.dilation_w];
        for (int o = 0; o < C; ++o) acc[o] += v * f[j * C + o];
      }
    }
  }
  LC_HD static void StoreResult(const Params& p, const Block& k, int tid, const A* acc) {
    const TileGeom& g = p.g;
    const int64_t oy = k.y0 + tid / p.c.tile_w, ox = k.x0 + tid % p.c.tile_w;
    if (oy >= g.out_h || ox >= g.out_w) return;
    const int64_t c0 = k.cblock * C;
    StoreChannels<C>(acc, g.cout_g - c0, g.out.c,
                     p.output + k.n * g.out.n + k.z * g.out_sd + oy * g.out.h + ox * g.out.w +
                         (k.grp * g.cout_g + c0) * g.out.c);
  }
};

template <typename T, int C>
struct BackpropInputTiles {
  using A = AccT<T>;
  static constexpr int kAcc = C;
  struct Params {
    TileGeom g;
    TileConfig c;
    const T* filter;
    const T* out_backprop;
    T* in_backprop;
  };
  using Block = SpatialBlock;

  LC_HD static Block Decode(const Params& p, int64_t b) {
    return DecodeSpatial(b, p.g.in_d, p.g.in_h, p.g.in_w, CeilDiv(p.g.cin_g, C), p.g.groups, p.c);
  }
  LC_HD static int64_t Steps(const Params& p, const Block&) {
    return TapSteps(p.g, p.c, p.g.cout_g);
  }
  // The first out_backprop row/column of a step's patch: the lowest output position any of
  // the block's input positions meets through the chunk's taps.
  LC_HD static void PatchOrigin(const Params& p, const Block& k, const TapStep& t, int64_t* oy0,
                                int64_t* ox0) {
    const TileGeom& g = p.g;
    *oy0 = FloorDiv(k.y0 + g.pad_top - (t.kh0 + p.c.chunk_h - 1) * g.dilation_h, g.stride_h);
    *ox0 = FloorDiv(k.x0 + g.pad_left - (t.kw0 + p.c.chunk_w - 1) * g.dilation_w, g.stride_w);
  }
  // The out_backprop depth the block's input depth meets through filter depth kd: -1 where
  // it meets none (off the stride grid), which PlaneAt reads as outside.
  LC_HD static int64_t OutDepth(const TileGeom& g, const Block& k, int64_t kd) {
    const int64_t t = k.z + g.pad_front - kd * g.dilation_d;  // = od * stride_d
    const int64_t od = FloorDiv(t, g.stride_d);
    return od * g.stride_d == t ? od : -1;
  }
  LC_HD static void LoadTile(const Params& p, const Block& k, int64_t s, int tid, int threads,
                             A* smem) {
    const TileGeom& g = p.g;
    const TileConfig& c = p.c;
    const TapStep t = DecodeTapStep(g, c, s);
    int64_t oy0, ox0;
    PatchOrigin(p, k, t, &oy0, &ox0);
    const DepthPlane d = PlaneAt(OutDepth(g, k, t.kd), g.out_d, g.out_sd, g.out_h);
    LoadPatch(p.out_backprop + k.n * g.out.n + d.offset + (k.grp * g.cout_g + t.ch) * g.out.c, oy0,
              ox0, d.height, g.out_w, g.out, c, tid, threads, smem);
    const int64_t c0 = k.cblock * C;  // first in-channel of the block within its group
    LoadFilterChunk<C>(p.filter, g, c, t, c0 * g.out_c + k.grp * g.cout_g + t.ch, g.out_c,
                       g.cin_g - c0, tid, threads, smem + c.patch_h * c.patch_w);
  }
  LC_HD static void Accumulate(const Params& p, const Block& k, int64_t s, int tid, const A* smem,
                               A* acc) {
    const TileGeom& g = p.g;
    const TileConfig& c = p.c;
    const TapStep t = DecodeTapStep(g, c, s);
    const int64_t kh0 = t.kh0, kw0 = t.kw0;
    int64_t oy0, ox0;
    PatchOrigin(p, k, t, &oy0, &ox0);
    // Only taps that meet an out_backprop element add a product, as in TensorFlow's kernels:
    // a non-finite filter value times the zero beyond the border would be NaN.
    const int64_t od = OutDepth(g, k, t.kd);
    if (od < 0 || od >= g.out_d) return;
    const int64_t iy = k.y0 + tid / c.tile_w, ix = k.x0 + tid % c.tile_w;
    const int64_t nh = MinOf(c.chunk_h, g.filter_h - kh0), nw = MinOf(c.chunk_w, g.filter_w - kw0);
    const A* filt = smem + c.patch_h * c.patch_w;
    for (int64_t i = 0; i < nh; ++i) {
      const int64_t t = iy + g.pad_top - (kh0 + i) * g.dilation_h;  // = oy * stride_h
      const int64_t oy = FloorDiv(t, g.stride_h);
      if (oy * g.stride_h != t || oy < 0 || oy >= g.out_h) continue;
      const A* row = smem + (oy - oy0) * c.patch_w;
      const A* f = filt + i * c.chunk_w * C;
      for (int64_t j = 0; j < nw; ++j) {
        const int64_t u = ix + g.pad_left - (kw0 + j) * g.dilation_w;
        const int64_t ox = FloorDiv(u, g.stride_w);
        if (ox * g.stride_w != u || ox < 0 || ox >= g.out_w) continue;
        const A v = row[ox - ox0];
        for (int o = 0; o < C; ++o) acc[o] += v * f[j * C + o];
      }
    }
  }
  LC_HD static void StoreResult(const Params& p, const Block& k, int tid, const A* acc) {
    const TileGeom& g = p.g;
    const int64_t iy = k.y0 + tid / p.c.tile_w, ix = k.x0 + tid % p.c.tile_w;
    if (iy >= g.in_h || ix >= g.in_w) return;
    const int64_t c0 = k.cblock * C;
    StoreChannels<C>(acc, g.cin_g - c0, g.in.c,
                     p.in_backprop + k.n * g.in.n + k.z * g.in_sd + iy * g.in.h + ix * g.in.w +
                         (k.grp * g.cin_g + c0) * g.in.c);
  }
};

template <typename T, int C>
struct BackpropFilterTiles {
  using A = AccT<T>;
  static constexpr int kAcc = C;
  struct Params {
    TileGeom g;
    TileConfig c;
    const T* input;
    const T* out_backprop;
    T* filter_backprop;  // written directly when c.reduce_chunks == 1
    A* partials;         // [reduce_chunks][filter elements] otherwise
  };
  struct Block {
    int64_t kd, kh0, kw0, cblock, grp, ci;
    int64_t chunk, row0, rows;  // the reduce chunk: its rows of batch x depth x rows
  };

  LC_HD static Block Decode(const Params& p, int64_t b) {
    const TileGeom& g = p.g;
    const TileConfig& c = p.c;
    const int64_t tiles_x = CeilDiv(g.filter_w, c.tile_w);
    const int64_t tiles_y = CeilDiv(g.filter_h, c.tile_h);
    const int64_t cblocks = CeilDiv(g.cout_g, C);
    Block k;
    k.kw0 = (b % tiles_x) * c.tile_w;
    b /= tiles_x;
    k.kh0 = (b % tiles_y) * c.tile_h;
    b /= tiles_y;
    k.cblock = b % cblocks;
    b /= cblocks;
    k.grp = b % g.groups;
    b /= g.groups;
    k.ci = b % g.cin_g;
    b /= g.cin_g;
    k.kd = b % g.filter_d;
    const int64_t total = g.batch * g.out_d * g.out_h;
    k.chunk = b / g.filter_d;
    k.row0 = k.chunk * total / c.reduce_chunks;
    k.rows = (k.chunk + 1) * total / c.reduce_chunks - k.row0;
    return k;
  }
  LC_HD static int64_t Steps(const Params& p, const Block& k) {
    return k.rows * CeilDiv(p.g.out_w, p.c.chunk_w);
  }
  LC_HD static void LoadTile(const Params& p, const Block& k, int64_t s, int tid, int threads,
                             A* smem) {
    const TileGeom& g = p.g;
    const TileConfig& c = p.c;
    const int64_t nx = CeilDiv(g.out_w, c.chunk_w);
    const int64_t row = k.row0 + s / nx, ox0 = (s % nx) * c.chunk_w;
    const int64_t n = row / (g.out_d * g.out_h), od = row / g.out_h % g.out_d, oy = row % g.out_h;
    const DepthPlane d =
        PlaneAt(od * g.stride_d + k.kd * g.dilation_d - g.pad_front, g.in_d, g.in_sd, g.in_h);
    const T* x = p.input + n * g.in.n + d.offset + (k.grp * g.cin_g + k.ci) * g.in.c;
    const int64_t bx = ox0 * g.stride_w + k.kw0 * g.dilation_w - g.pad_left;
    const int64_t patch = c.patch_h * c.patch_w;
    for (int64_t e = tid; e < patch; e += threads) {
      const int64_t kh = k.kh0 + e / c.patch_w;
      const int64_t iy = oy * g.stride_h + kh * g.dilation_h - g.pad_top, ix = bx + e % c.patch_w;
      const bool in = kh < g.filter_h && iy >= 0 && iy < d.height && ix >= 0 && ix < g.in_w;
      smem[e] = in ? static_cast<A>(Load(x[iy * g.in.h + ix * g.in.w])) : A(0);
    }
    A* dy = smem + patch;
    const T* src = p.out_backprop + n * g.out.n + od * g.out_sd + oy * g.out.h;
    for (int64_t e = tid; e < c.chunk_w * C; e += threads) {
      const int64_t o = e % C, ox = ox0 + e / C, co = k.cblock * C + o;
      const bool in = ox < g.out_w && co < g.cout_g;
      dy[e] =
          in ? static_cast<A>(Load(src[ox * g.out.w + (k.grp * g.cout_g + co) * g.out.c])) : A(0);
    }
  }
  LC_HD static void Accumulate(const Params& p, const Block&, int64_t, int tid, const A* smem,
                               A* acc) {
    const TileGeom& g = p.g;
    const TileConfig& c = p.c;
    const int64_t ty = tid / c.tile_w, tx = tid % c.tile_w;
    const A* row = smem + ty * c.patch_w + tx * g.dilation_w;
    const A* dy = smem + c.patch_h * c.patch_w;
    for (int64_t j = 0; j < c.chunk_w; ++j) {
      const A v = row[j * g.stride_w];
      for (int o = 0; o < C; ++o) acc[o] += v * dy[j * C + o];
    }
  }
  LC_HD static void StoreResult(const Params& p, const Block& k, int tid, const A* acc) {
    const TileGeom& g = p.g;
    const int64_t kh = k.kh0 + tid / p.c.tile_w, kw = k.kw0 + tid % p.c.tile_w;
    if (kh >= g.filter_h || kw >= g.filter_w) return;
    const int64_t base = (((k.kd * g.filter_h + kh) * g.filter_w + kw) * g.cin_g + k.ci) * g.out_c +
                         k.grp * g.cout_g;
    for (int o = 0; o < C; ++o) {
      const int64_t co = k.cblock * C + o;
      if (co >= g.cout_g) continue;
      if (p.c.reduce_chunks == 1) {
        p.filter_backprop[base + co] = Store<T>(acc[o]);
      } else {
        p.partials[k.chunk * FilterElements(g) + base + co] = acc[o];
      }
    }
  }
  LC_HD static int64_t FilterElements(const TileGeom& g) { return g.filter_elements(); }
  // The second kernel: element i of the filter gradient, the partials added in slice order.
  LC_HD static void Reduce(const Params& p, int64_t i) {
    const int64_t fe = FilterElements(p.g);
    A sum = 0;
    for (int64_t r = 0; r < p.c.reduce_chunks; ++r) sum += p.partials[r * fe + i];
    p.filter_backprop[i] = Store<T>(sum);
  }
};

// Each kernel's footprint, for MakeTileConfig (tile_config.cc), which shrinks a cut until
// it fits: the taps (backprop-filter: output columns) a step starts with, and the
// shared-memory patch and elements of the current shape of `c`.
inline void FirstChunks(const TileGeom& g, ConvPass pass, TileConfig* c) {
  if (pass == ConvPass::kBackpropFilter) {
    c->chunk_h = 1;
    c->chunk_w = std::min<int64_t>(64, std::max<int64_t>(g.out_w, 1));
  } else {
    c->chunk_h = std::min<int64_t>(16, g.filter_h);
    c->chunk_w = std::min<int64_t>(32, g.filter_w);
  }
}
inline void MeasureTiles(const TileGeom& g, ConvPass pass, TileConfig* c) {
  if (pass == ConvPass::kForward) {
    c->patch_h = (c->tile_h - 1) * g.stride_h + (c->chunk_h - 1) * g.dilation_h + 1;
    c->patch_w = (c->tile_w - 1) * g.stride_w + (c->chunk_w - 1) * g.dilation_w + 1;
    c->smem_elems = c->patch_h * c->patch_w + c->chunk_h * c->chunk_w * c->channels;
  } else if (pass == ConvPass::kBackpropInput) {
    // Output rows a block's input rows meet through chunk_h taps: at most
    // ceil(span / stride) + 1 for span = tile + dilated chunk - 2.
    c->patch_h = (c->tile_h - 1 + (c->chunk_h - 1) * g.dilation_h) / g.stride_h + 2;
    c->patch_w = (c->tile_w - 1 + (c->chunk_w - 1) * g.dilation_w) / g.stride_w + 2;
    c->smem_elems = c->patch_h * c->patch_w + c->chunk_h * c->chunk_w * c->channels;
  } else {
    c->patch_h = c->tile_h;
    c->patch_w = (c->chunk_w - 1) * g.stride_w + (c->tile_w - 1) * g.dilation_w + 1;
    c->smem_elems = c->patch_h * c->patch_w + c->chunk_w * c->channels;
  }
}

// Picks the kernel for a pass and its channels-per-thread, fills its parameters and hands
// them to `run`, which either launches them on a device or emulates them on the host:
//   run.template Tiles<K>(params)          runs K's phases over params.c.blocks blocks;
//   run.template Reduce<K>(params, count)  runs K::Reduce for elements [0, count).
// Operands in each pass's order, as RunPass takes them. `workspace` holds
// config.workspace_bytes (backprop-filter's partial sums).
// Geometry: ConvGeometry or Conv3dGeometry.
template <typename T, class Geometry, class Runner>
void DispatchTiles(const Geometry& geom, ConvPass pass, const TileConfig& c, const T* a, const T* b,
                   T* out, void* workspace, Runner& run) {
  const TileGeom g = MakeTileGeom(geom);
  const auto go = [&](auto channels) {
    constexpr int C = decltype(channels)::value;
    if (pass == ConvPass::kForward) {
      using K = ForwardTiles<T, C>;
      run.template Tiles<K>(typename K::Params{g, c, a, b, out});
    } else if (pass == ConvPass::kBackpropInput) {
      using K = BackpropInputTiles<T, C>;
      run.template Tiles<K>(typename K::Params{g, c, a, b, out});
    } else {
      using K = BackpropFilterTiles<T, C>;
      const typename K::Params params{g, c, a, b, out, static_cast<AccT<T>*>(workspace)};
      run.template Tiles<K>(params);
      if (c.reduce_chunks > 1) run.template Reduce<K>(params, K::FilterElements(g));
    }
  };
  if (c.channels == 1) {
    go(std::integral_constant<int, 1>{});
  } else if (c.channels == 2) {
    go(std::integral_constant<int, 2>{});
  } else {
    go(std::integral_constant<int, 4>{});
  }
}

}  // namespace cuda
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CUDA_TILES_H_
