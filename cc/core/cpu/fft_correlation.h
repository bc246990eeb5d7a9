// The frame of the 2-D FFT's forward and backprop-input correlations (fft.cc): operands,
// workspace, blocks, items and the positions of tiles in the transforms.
#ifndef TF_LARGECONV_CORE_CPU_FFT_CORRELATION_H_
#define TF_LARGECONV_CORE_CPU_FFT_CORRELATION_H_

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <utility>

#include "cc/core/common/dtypes.h"
#include "cc/core/common/geometry.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cpu/fft.h"
#include "cc/core/cpu/fft_decimation.h"
#include "cc/core/cpu/fft_layout.h"
#include "cc/core/cpu/fft_shared.h"
#include "cc/core/cpu/isa.h"

namespace largeconv {
LARGECONV_ISA_BEGIN
namespace fft_internal {

// Forward and backprop-input share this engine: dst[p] = sum_k src[p + off + k] filt[k],
// summed over the group's source channels, for every destination channel. This is its
// frame: the operands, the workspace and the positions every stage (fft_products.h,
// fft_outputs.h, and the run in fft.cc) reads.
template <typename T>
struct CorrelationFrame {
  using R = AccT<T>;
  using C = std::complex<R>;
  const ConvGeometry& g;
  const FftConfig& c;
  FftTiling tiling;
  bool backprop_input;
  const T* src;
  const T* filter;
  T* dst;

  ConvPass pass() const { return backprop_input ? ConvPass::kBackpropInput : ConvPass::kForward; }

  // Copies the taps of group grp's filters for source channels [s0, s0 + ns) x destination
  // channels [d0, d0 + nd), pair (s0 + s, d0 + d) to taps + (s * nd + d) * filter_h *
  // filter_w, row by row, as R. The HWIO filter is read tap by tap, each tap's values for the
  // pairs in runs along its output channels (the destinations forward, the sources for
  // backprop-input), so each cache line and page of it read serves every pair it holds.
  void GatherFilters(R* taps, int64_t grp, int64_t s0, int64_t ns, int64_t d0, int64_t nd) const {
    const int64_t per = g.filter_h * g.filter_w;
    // Runs of `no` output channels from o0, for `ni` input channels from i0; the taps of
    // consecutive input and output channels lie i_step and o_step reals apart.
    const int64_t ni = backprop_input ? nd : ns, no = backprop_input ? ns : nd;
    const int64_t i0 = backprop_input ? d0 : s0;
    const int64_t o0 = grp * g.out_c_per_group() + (backprop_input ? s0 : d0);
    const int64_t i_step = backprop_input ? per : nd * per;
    const int64_t o_step = backprop_input ? nd * per : per;
    for (int64_t k = 0; k < per; ++k) {
      const T* tap = filter + (k * g.filter_in_c + i0) * g.out_c + o0;
      for (int64_t i = 0; i < ni; ++i) {
        for (int64_t o = 0; o < no; ++o) {
          taps[k + i * i_step + o * o_step] = static_cast<R>(Load(tap[i * g.out_c + o]));
        }
      }
    }
  }

  // Writes a filter's dilated taps (filter_h x filter_w, as GatherFilters leaves them) into
  // rows [0, keh) of real (the only rows its transform reads), flipped for backprop-input.
  void PlaceFilter(R* real, const R* taps) const {
    const int64_t keh = DilatedExtent(g.filter_h, g.dilation_h),
                  kew = DilatedExtent(g.filter_w, g.dilation_w);
    std::fill(real, real + keh * c.fft_w, R(0));
    for (int64_t kh = 0; kh < g.filter_h; ++kh) {
      for (int64_t kw = 0; kw < g.filter_w; ++kw) {
        int64_t r = kh * g.dilation_h, q = kw * g.dilation_w;
        if (backprop_input) {
          r = keh - 1 - r;
          q = kew - 1 - q;
        }
        real[r * c.fft_w + q] = taps[kh * g.filter_w + kw];
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
    Layout layout;
    Workspace<R> ws;
    int64_t fh, fw, src_per_group, dst_per_group;
    int64_t off_h, off_w;    // dense output p reads source dense position p + off + k
    int64_t out_sh, out_sw;  // destination stride: dense positions kept (forward)
    Strides4 dst_strides;    // destination element strides
    double fft_cost;
    int64_t real_stride, spec_stride;  // between a slot's batched planes / spectra
    // Strides in the spectrum: the backprop-input pass's zero-stuffed sources, or the
    // forward pass's strided outputs.
    Decimation<R> dec;
  };

  // One block of work: group_count groups from group0 (several only when whole groups fit
  // a block), and destination channels [out0, out0 + out_count) of each; `batch` groups
  // share one batched transform, or, with `tiles` (one group), `batch` consecutive tiles
  // of an image do.
  struct Block {
    int64_t group0, group_count, out0, out_count, per_group, batch;
    bool tiles;
    int64_t sources;  // source channels whose spectra a slot holds at once (in_block)
    // The block's filter spectra, read only: in the workspace, or kept from an earlier call.
    const C* spectra = nullptr;
  };

  // One item of a slot: `planes` batched planes, plane j holding group group0 + j of tile
  // `tile` of image n; or with `tiles`, group group0 of the j-th tile counted on from that
  // one through the batch (per_image tiles an image).
  struct Item {
    int64_t group0, planes, n, tile, per_image;
    bool tiles;
    int64_t group(int64_t j) const { return tiles ? group0 : group0 + j; }
    int64_t image(int64_t j) const { return tiles ? n + (tile + j) / per_image : n; }
    int64_t tile_of(int64_t j) const { return tiles ? (tile + j) % per_image : tile; }
  };

  // The first dense position (row, column) of tile `tile`.
  std::pair<int64_t, int64_t> TileOrigin(int64_t tile) const {
    return {tile / tiling.tiles_w * tiling.tile_h, tile % tiling.tiles_w * tiling.tile_w};
  }

  Frame MakeFrame(void* workspace) const {
    Frame f;
    f.layout = MakeLayout(g, pass(), c, sizeof(R));
    f.ws = Workspace<R>{static_cast<char*>(workspace), f.layout};
    f.fh = c.fft_h;
    f.fw = c.fft_w;
    f.src_per_group = g.channels(pass()).src_per_group;
    f.dst_per_group = g.channels(pass()).dst_per_group;
    const int64_t keh = DilatedExtent(g.filter_h, g.dilation_h),
                  kew = DilatedExtent(g.filter_w, g.dilation_w);
    f.off_h = backprop_input ? g.pad_top - keh + 1 : -g.pad_top;
    f.off_w = backprop_input ? g.pad_left - kew + 1 : -g.pad_left;
    f.out_sh = backprop_input ? 1 : g.stride_h;
    f.out_sw = backprop_input ? 1 : g.stride_w;
    f.dst_strides = backprop_input ? g.input_strides() : g.output_strides();
    f.fft_cost = 5.0 * f.fh * f.fw * std::log2(static_cast<double>(f.fh * f.fw) + 2);
    f.real_stride = f.layout.plane_bytes / sizeof(R);
    f.spec_stride = f.layout.spectrum_bytes / sizeof(C);
    f.dec = MakeDecimation<R>(g, pass(), c, backprop_input ? -1 : 1);
    return f;
  }

  // The residue modulo the stride of the transform positions holding tile `tile`'s data
  // (backprop-input's stuffed sources) or its kept outputs (forward), per dimension.
  std::pair<int64_t, int64_t> Residues(const Frame& f, int64_t tile) const {
    const auto [p0_h, p0_w] = TileOrigin(tile);
    if (backprop_input) {  // source dense q = origin + u holds data where q % stride == 0
      return {Mod(-(p0_h + f.off_h + tiling.shift_h), f.dec.dh),
              Mod(-(p0_w + f.off_w + tiling.shift_w), f.dec.dw)};
    }
    // Output p = p0 + r, kept where p % stride == 0, sits at transform position r - shift.
    return {Mod(-(p0_h + tiling.shift_h), f.dec.dh), Mod(-(p0_w + tiling.shift_w), f.dec.dw)};
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
    const int64_t width = std::min(kChunk, f.layout.bins - i0);
    return i0 * b.group_count * b.per_group + (gl * b.per_group + k * f.src_per_group + sc) * width;
  }
  // The chunk for the products, which only read it (Spectra views are untyped as to const).
  C* FilterChunk(const Frame& f, const Block& b, int64_t gl, int64_t sc, int64_t k,
                 int64_t i0) const {
    return const_cast<C*>(b.spectra) + FilterOffset(f, b, gl, sc, k, i0);
  }

  // Slot spectra: b.batch per source channel of a block (b.sources of them), then b.batch
  // per destination channel k.
  C* Source(const Frame& f, const Block& b, int64_t slot, int64_t s, int64_t j) const {
    return f.ws.spectrum(slot, s * b.batch + j);
  }
  C* Accumulator(const Frame& f, const Block& b, int64_t slot, int64_t k, int64_t j) const {
    return f.ws.spectrum(slot, (b.sources + k) * b.batch + j);
  }

  // Whether an item's spectra double as its real planes: with one group per tile (a single
  // group, or a run of tiles of one group) every (channel, tile) has spectra of its own, so
  // all of a block's source channels are loaded in one pass over the source (NHWC reads
  // whole runs of channels, however long the rows) into the spectra, transformed in place,
  // and the destination channels likewise inverse-transformed in place and stored in one
  // pass. Items of several groups at one tile go group-batched through the real planes.
  static bool InPlace(const Item& it) { return it.tiles || it.planes == 1; }

  // Whether the forward pass's strided outputs are taken from folded spectra (see
  // FoldStrided), whose inverse transforms hold only the kept outputs.
  bool OutputsDecimated(const Frame& f) const { return !backprop_input && f.dec.on(); }
};

}  // namespace fft_internal
LARGECONV_ISA_END
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CPU_FFT_CORRELATION_H_
