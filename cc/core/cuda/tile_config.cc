// Host-side sizing of the direct tile kernels: block shapes, the shrinking to fit shared
// memory (each kernel's footprint is in tiles.h), the backprop-filter slicing and its
// workspace. The one formula the launcher, the host
// emulation and the planner share.
#include <algorithm>
#include <array>

#include "cc/core/common/vocabulary.h"
#include "cc/core/cuda/tiles.h"

namespace largeconv {
namespace cuda {
namespace {

int64_t NextPow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

// Threads along the two dimensions a block covers: up to 32 wide (a warp along the
// innermost spatial dimension), 256 in all, and no wider than the extent it tiles.
void TileShape(int64_t h, int64_t w, TileConfig* c) {
  c->tile_w = std::min<int64_t>(32, NextPow2(std::max<int64_t>(w, 1)));
  c->tile_h = std::min<int64_t>(256 / c->tile_w, NextPow2(std::max<int64_t>(h, 1)));
}

int64_t ChannelsPerThread(int64_t per_group) {
  if (per_group >= 3) return 4;
  return per_group == 2 ? 2 : 1;
}

// The cut of a pass of either dimensionality (a 2-D geometry is one of depth 1).
TileConfig TileConfigOf(const TileGeom& g, ConvPass pass, int acc_bytes, int64_t workspace_limit) {
  if (workspace_limit < 0) workspace_limit = kDefaultWorkspaceLimit;
  TileConfig c;
  // Threads own elements of the result, channels per thread of its destination channels;
  // a block covers one depth of it.
  const std::array<int64_t, 2> hw = g.spatial(RolesOf(pass).out);
  const int64_t depth = g.depth(RolesOf(pass).out);
  const int64_t dst_g = g.channels(pass).dst_per_group;
  TileShape(hw[0], hw[1], &c);
  c.channels = ChannelsPerThread(dst_g);
  FirstChunks(g, pass, &c);
  // Shrink until the block's shared memory fits: taps per step first, the tile last.
  for (MeasureTiles(g, pass, &c); c.smem_elems * acc_bytes > kSmemBytes;
       MeasureTiles(g, pass, &c)) {
    if (c.chunk_w > 1) {
      c.chunk_w = (c.chunk_w + 1) / 2;
    } else if (c.chunk_h > 1) {
      c.chunk_h = (c.chunk_h + 1) / 2;
    } else if (c.tile_w > 1) {
      c.tile_w /= 2;
    } else if (c.tile_h > 1) {
      c.tile_h /= 2;
    } else {
      break;  // a 1x1 tile of one tap: a few elements, always fits
    }
  }
  if (!WritesFilter(pass)) {
    c.blocks = g.batch * g.groups * CeilDiv(dst_g, c.channels) * depth * CeilDiv(hw[0], c.tile_h) *
               CeilDiv(hw[1], c.tile_w);
    return c;
  }
  // Backprop-filter: slice the batch x output rows (of every output depth) so there are
  // enough blocks, each slice writing a partial filter gradient, as far as the workspace
  // limit allows.
  const int64_t base = CeilDiv(g.filter_h, c.tile_h) * CeilDiv(g.filter_w, c.tile_w) *
                       CeilDiv(g.cout_g, c.channels) * g.groups * g.cin_g * depth;
  const int64_t rows = g.batch * g.out_d * g.out_h;
  const int64_t partial_bytes = g.filter_elements() * acc_bytes;
  int64_t r =
      std::min(CeilDiv(kTargetBlocks, std::max<int64_t>(base, 1)), std::max<int64_t>(rows, 1));
  if (r > 1 && partial_bytes > 0) r = std::min(r, workspace_limit / partial_bytes);
  c.reduce_chunks = std::max<int64_t>(r, 1);
  c.workspace_bytes = c.reduce_chunks > 1 ? c.reduce_chunks * partial_bytes : 0;
  c.blocks = base * c.reduce_chunks;
  return c;
}

}  // namespace

TileGeom MakeTileGeom(const ConvGeometry& g) {
  TileGeom t;
  static_cast<ConvGeometry&>(t) = g;
  t.cin_g = g.in_c_per_group();
  t.cout_g = g.out_c_per_group();
  t.in = g.input_strides();
  t.out = g.output_strides();
  return t;
}

// Height and width go to the 2-D fields, depth to the depth fields; the element strides
// are the 3-D tensors' own.
TileGeom MakeTileGeom(const Conv3dGeometry& g) {
  TileGeom t;
  t.batch = g.batch;
  t.in_c = g.in_c;
  t.filter_in_c = g.filter_in_c;
  t.out_c = g.out_c;
  t.groups = g.groups;
  t.data_format = g.data_format;
  t.in_d = g.in[0];
  t.in_h = g.in[1];
  t.in_w = g.in[2];
  t.filter_d = g.filter[0];
  t.filter_h = g.filter[1];
  t.filter_w = g.filter[2];
  t.out_d = g.out[0];
  t.out_h = g.out[1];
  t.out_w = g.out[2];
  t.stride_d = g.stride[0];
  t.stride_h = g.stride[1];
  t.stride_w = g.stride[2];
  t.dilation_d = g.dilation[0];
  t.dilation_h = g.dilation[1];
  t.dilation_w = g.dilation[2];
  t.pad_front = g.pad_before[0];
  t.pad_top = g.pad_before[1];
  t.pad_bottom = g.pad_after[1];
  t.pad_left = g.pad_before[2];
  t.pad_right = g.pad_after[2];
  t.cin_g = g.in_c_per_group();
  t.cout_g = g.out_c_per_group();
  const Strides5 in = g.input_strides(), out = g.output_strides();
  t.in = {in.n, in.s[1], in.s[2], in.c};
  t.out = {out.n, out.s[1], out.s[2], out.c};
  t.in_sd = in.s[0];
  t.out_sd = out.s[0];
  return t;
}

TileConfig MakeTileConfig(const ConvGeometry& g, ConvPass pass, int acc_bytes,
                          int64_t workspace_limit) {
  return TileConfigOf(MakeTileGeom(g), pass, acc_bytes, workspace_limit);
}

TileConfig MakeTileConfig(const Conv3dGeometry& g, ConvPass pass, int acc_bytes,
                          int64_t workspace_limit) {
  return TileConfigOf(MakeTileGeom(g), pass, acc_bytes, workspace_limit);
}

}  // namespace cuda
}  // namespace largeconv
