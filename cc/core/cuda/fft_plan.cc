// The GPU planner: the FFT path's workspace layout and transforms, its cost against the
// direct tile kernels', and the choice between them under the workspace limit.
#include "cc/core/cuda/fft_plan.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "cc/core/cuda/algorithms.h"
#include "cc/core/cuda/divisor.h"
#include "cc/core/plan/search.h"

namespace largeconv {
namespace cuda {
namespace {

// Divisor (divisor.h) against the plain division, checked as the library compiles: every
// divisor up to 3000, those either side of each power of two, and dividends at the edges of
// each quotient and of the fast range (2^31), both signs for Mod.
constexpr bool DivisorAgrees(int64_t d) {
  const Divisor div(d);
  const int64_t top = (int64_t{1} << 31) - 1;
  const int64_t ns[] = {0,       1,         d - 1,           d,
                        d + 1,   2 * d - 1, 2 * d,           7 * d + 3,
                        top,     top - 1,   top / d * d,     top / d * d - 1,
                        top + 1, top + d,   int64_t{1} << 40};
  for (int64_t n : ns) {
    if (n < 0) continue;
    if (div.Quot(n) != n / d || div.Mod(n) != n % d) return false;
    if (div.Mod(-n - 1) != ((-n - 1) % d + d) % d) return false;
    if (n <= top && div.Quot(static_cast<int32_t>(n)) != n / d) return false;
  }
  return true;
}
constexpr bool DivisorsAgree() {
  for (int64_t d = 1; d <= 3000; ++d) {
    if (!DivisorAgrees(d)) return false;
  }
  for (int k = 2; k <= 40; ++k) {
    const int64_t p = int64_t{1} << k;
    if (!DivisorAgrees(p - 1) || !DivisorAgrees(p) || !DivisorAgrees(p + 1)) return false;
  }
  return DivisorAgrees(641) && DivisorAgrees(46341) && DivisorAgrees(1000003);
}
static_assert(DivisorsAgree(), "Divisor disagrees with the plain division");

// Cost-model rates. The direct kernels' and cuDNN's are fitted to step times measured on
// an H100 (80 GB HBM3; benchmarks/gpu/bench.py, results in benchmarks/results/gpu/): seed
// forward, 63x63x16x16, RepLKNet 31x31 and SLaK 51x51 depthwise and 3x3x64x64 training
// steps, each through both algorithms; the direct model, refitted with the 7x7 and 15x15
// float16 steps, lands within a factor of 2 of every direct step (step totals cannot tell
// its three passes apart). Only used to compare the algorithms, never reported as a timing.
//
// FFT path: bytes moved by the transforms (cuFFT's passes and the plane loads), bytes moved
// by the spectrum products, and a cost per launch (FftTerms). Fitted to the FFT steps of
// every bench case the path runs (16 on an H200, 6 of them also on an H100, three also
// under a tenth to a third of their workspace):
//   python -m benchmarks.gpu.fft_steps --fit FILES, the FILES being
//       benchmarks/results/gpu/fft_steps_h200_2026-11-27c_rows.json and
//       benchmarks/results/gpu/fft_steps_h100_2026-11-27c_same.json
// Model / measured 0.73-1.24.
constexpr double kTransformBytesPerSec = 1.49e12;
constexpr double kProductBytesPerSec = 3.69e12;
constexpr double kFftLaunchSec = 4.8e-6;
// The direct kernels' and cuDNN's cost per launch.
constexpr double kLaunchSec = 2.9e-6;
// Direct tile kernels: elements loaded into shared memory (patch and filter chunk per step)
// and lane-taps (a thread's tap over its C channels, C = TileConfig::channels), in float;
// double arithmetic runs at half the lane-tap rate.
constexpr double kDirectLoadsPerSec = 5.1e10;
constexpr double kDirectLaneTapsPerSec = 3.0e12;
// Memory passes of one batched transform: a read and a write per dimension (2-D: 4, 3-D: 6).
constexpr double kPassesPerDimension = 2;
// cuDNN as TensorFlow runs it (TF32 on for float32), fitted to the same H100 runs' cuDNN
// steps: 150 TFLOP/s once the wider of a group's channel counts (in or out) reaches 64,
// falling in proportion below that. Measured and modelled TFLOP/s: 63x63x16x16 36.4 and
// 37.5; 21x21x32x32 67 and 75; conv2d_transpose's 31x31 16->32 at stride 2 75 and 75 (the
// one case that tells the wider count from the geometric mean of the two, which modelled
// it at 53 and routed it wrongly); depthwise 31x31 and 51x51 1.2-2.1 and 2.3; seed forward
// (1->3) 4.2 and 7.0. It overrates the 3x3/7x7 steps (up to 3x), where cuDNN wins by 5x
// anyway, and the seed training step's 135x135 filter gradient (10x), where ours wins by
// 200x.
constexpr double kCudnnFlopsPerSec = 1.5e14;
constexpr double kCudnnFullChannels = 64.0;

int64_t Align256(int64_t b) { return AlignUp(b, 256); }

// Every function below that takes a `Geometry` plans either dimensionality: ConvGeometry
// or Conv3dGeometry (a 2-D pass is the depth-1 case of the same kernels).

// The cost model's terms of the FFT path: bytes moved by the transforms (cuFFT's passes and
// the plane loads), bytes moved by the spectrum products, and launches.
template <class Geometry>
FftModelTerms FftTerms(const Geometry& g, ConvPass pass, const GpuFftConfig& c, int rb) {
  const GpuFftLayout l = MakeGpuFftLayout(g, pass, c, rb);
  const PassChannels ch = g.channels(pass);
  const double plane = static_cast<double>(l.spectrum_reals) * rb;
  const double items = static_cast<double>(c.items);
  const double per_item = ch.src + ch.dst;
  const double transforms = l.filter_spectra + items * per_item;
  const double pairs = static_cast<double>(g.groups) * ch.src_per_group * ch.dst_per_group;
  FftModelTerms m;
  // cuFFT's passes, plus placing / loading the planes.
  m.transform_bytes = (kPassesPerDimension * c.rank() + 1) * transforms * plane;
  // The products: written and read back per item, plus their operands: each thread reads a
  // source value once for up to kChannelBlock destination channels, and their filter (or
  // gradient) values.
  const double block = std::min<double>(kChannelBlock, std::max<int64_t>(ch.dst_per_group, 1));
  m.product_bytes = items * per_item * plane + (1.0 + 1.0 / block) * items * pairs * plane;
  const double rounds = std::ceil(items / std::max<int64_t>(c.chunk, 1));
  // Launches per pass (the flag's reset, the filters' placement or read-out) and per round.
  m.launches = 2 + 7 * rounds;
  return m;
}

// Cost-model seconds of the FFT path.
template <class Geometry>
double FftSeconds(const Geometry& g, ConvPass pass, const GpuFftConfig& c, int rb) {
  const FftModelTerms m = FftTerms(g, pass, c, rb);
  return m.transform_bytes / kTransformBytesPerSec + m.product_bytes / kProductBytesPerSec +
         m.launches * kFftLaunchSec;
}

// Cost-model seconds of the direct tile kernels as `c` cuts the pass: every block step
// loads c.smem_elems elements and runs c.threads() lanes over the step's taps.
template <class Geometry>
double DirectSeconds(const Geometry& g, ConvPass pass, const TileConfig& c, int rb) {
  if (g.no_products() || c.blocks == 0) return kLaunchSec;  // a clear at most
  const TileGeom t = MakeTileGeom(g);
  double block_steps, taps;
  if (WritesFilter(pass)) {
    // Each slice of the batch x output rows steps over its rows; all slices together cover
    // every row once per (tap tile, channel block, group, in-channel, filter depth).
    const double base = static_cast<double>(c.blocks) / std::max<int64_t>(c.reduce_chunks, 1);
    block_steps = base * t.batch * t.out_d * t.out_h * CeilDiv(t.out_w, c.chunk_w);
    taps = static_cast<double>(c.chunk_w);
  } else {
    block_steps = static_cast<double>(c.blocks) * TapSteps(t, c, g.channels(pass).src_per_group);
    taps = static_cast<double>(c.chunk_h * c.chunk_w);
  }
  const double loads = block_steps * c.smem_elems;
  const double lane_taps = block_steps * c.threads() * taps;
  const double tap_rate = rb == 8 ? kDirectLaneTapsPerSec / 2 : kDirectLaneTapsPerSec;
  const double launches = c.reduce_chunks > 1 ? 2 : 1;
  return loads / kDirectLoadsPerSec + lane_taps / tap_rate + launches * kLaunchSec;
}

// Cost-model seconds of cuDNN on a pass (all three passes do the same multiply-adds).
template <class Geometry>
double CudnnSeconds(const Geometry& g) {
  const double wider = static_cast<double>(std::max(g.in_c_per_group(), g.out_c_per_group()));
  const double efficiency = std::min(1.0, wider / kCudnnFullChannels);
  return 2.0 * g.macs() / (kCudnnFlopsPerSec * std::max(efficiency, 1e-3)) + kLaunchSec;
}

// Workspace of the FFT path with cuFFT's work area estimated as the data of its largest
// transform (the bound planning uses before cuFFT is asked).
template <class Geometry>
int64_t EstimatedBytes(const Geometry& g, ConvPass pass, const GpuFftConfig& c, int rb) {
  const GpuFftLayout l = MakeGpuFftLayout(g, pass, c, rb);
  const int64_t largest =
      std::max({l.filter_spectra, c.chunk * l.src_channels, c.chunk * l.dst_channels});
  return l.fft_bytes + Align256(largest * l.spectrum_reals * rb);
}

// A transform size, depth first (1 in 2-D).
using FftSize = std::array<int64_t, 3>;

// Sets `c`'s transform size and the tiling it implies (the CPU's MakeFftTiling of the
// geometry's dimensionality); false if the tiling cannot use the size.
bool TileSize(const ConvGeometry& g, ConvPass pass, const FftSize& f, GpuFftConfig* c) {
  c->fft_h = f[1];
  c->fft_w = f[2];
  if (!MakeFftTiling(g, pass, f[1], f[2], &c->tiling)) return false;
  c->items = g.batch * c->tiling.tiles_h * c->tiling.tiles_w;
  return true;
}
bool TileSize(const Conv3dGeometry& g, ConvPass pass, const FftSize& f, GpuFftConfig* c) {
  Fft3dTiling t;
  if (!MakeFftTiling(g, pass, f, &t)) return false;
  c->fft_d = f[0];
  c->fft_h = f[1];
  c->fft_w = f[2];
  c->dense_d = t.dense[0];
  c->tile_d = t.tile[0];
  c->tiles_d = t.tiles[0];
  c->tiling = FftTiling{};
  c->tiling.dense_h = t.dense[1];
  c->tiling.dense_w = t.dense[2];
  c->tiling.tile_h = t.tile[1];
  c->tiling.tile_w = t.tile[2];
  c->tiling.tiles_h = t.tiles[1];
  c->tiling.tiles_w = t.tiles[2];
  c->items = g.batch * t.count();
  return true;
}

// Sizes `c` for a transform of size f: the largest round of items whose estimated
// workspace fits the limit. False if the tiling cannot use the size or not even one item
// fits; *smallest: the estimate for one item.
template <class Geometry>
bool FitRounds(const Geometry& g, ConvPass pass, int real_bytes, int64_t limit, const FftSize& f,
               GpuFftConfig* c, int64_t* smallest) {
  if (!TileSize(g, pass, f, c)) return false;
  c->chunk = 1;
  *smallest = EstimatedBytes(g, pass, *c, real_bytes);
  if (*smallest > limit) return false;
  int64_t lo = 1, hi = std::max<int64_t>(c->items, 1);
  while (lo < hi) {
    c->chunk = (lo + hi + 1) / 2;
    if (EstimatedBytes(g, pass, *c, real_bytes) <= limit) {
      lo = c->chunk;
    } else {
      hi = c->chunk - 1;
    }
  }
  c->chunk = lo;
  return true;
}

// Sizes a search may refuse for cuFFT's work area before the FFT path is given up.
constexpr int kMaxRefusedSizes = 6;

enum class CufftFit { kFits, kTooLarge, kFailed };

// Halves c's round until cuFFT's actual work area (asked through work_bytes) fits the limit
// with the rest of the workspace; *work: that area. kTooLarge: not even a round of one item
// fits; kFailed: cuFFT cannot make a transform (*error says why).
template <class Geometry>
CufftFit FitCufftWorkArea(const Geometry& g, ConvPass pass, int real_bytes, int64_t limit,
                          const WorkBytesFn& work_bytes, GpuFftConfig* c, int64_t* work,
                          Status* error) {
  for (;;) {
    *work = 0;
    for (const TransformShape& s : PassTransforms(g, pass, *c, real_bytes)) {
      const int64_t w = work_bytes(s, error);
      if (w < 0) return CufftFit::kFailed;
      *work = std::max(*work, w);
    }
    if (MakeGpuFftLayout(g, pass, *c, real_bytes).fft_bytes + Align256(*work) <= limit) {
      return CufftFit::kFits;
    }
    if (c->chunk == 1) {
      *error = InvalidArgument("cuFFT's work area does not fit the limit");
      return CufftFit::kTooLarge;
    }
    c->chunk = (c->chunk + 1) / 2;
  }
}

}  // namespace

namespace {

template <class Geometry>
GpuFftLayout LayoutOf(const Geometry& g, ConvPass pass, const GpuFftConfig& c, int real_bytes) {
  GpuFftLayout l;
  const PassChannels ch = g.channels(pass);
  l.bins = c.fft_d * c.fft_h * (c.fft_w / 2 + 1);
  l.spectrum_reals = 2 * l.bins;
  l.filter_spectra = g.groups * ch.src_per_group * ch.dst_per_group;
  l.src_channels = ch.src;
  l.dst_channels = ch.dst;
  const int64_t sb = l.spectrum_reals * real_bytes;
  l.filters = kFlagBytes;
  l.src = l.filters + Align256(l.filter_spectra * sb);
  l.dst = l.src + Align256(c.chunk * l.src_channels * sb);
  l.fft_bytes = l.dst + Align256(c.chunk * l.dst_channels * sb);
  return l;
}

template <class Geometry>
std::vector<TransformShape> TransformsOf(const Geometry& g, ConvPass pass, const GpuFftConfig& c,
                                         int real_bytes) {
  const GpuFftLayout l = MakeGpuFftLayout(g, pass, c, real_bytes);
  std::vector<TransformShape> out;
  const auto add = [&](bool inverse, int64_t batch) {
    if (batch <= 0) return;
    const TransformShape s{inverse, real_bytes, c.fft_h, c.fft_w, batch, c.fft_d};
    for (const TransformShape& o : out) {
      if (o.inverse == s.inverse && o.batch == s.batch) return;
    }
    out.push_back(s);
  };
  const bool filter_grad = WritesFilter(pass);
  add(filter_grad, l.filter_spectra);
  const int64_t last = c.chunk > 0 ? c.items % c.chunk : 0;
  for (int64_t items : {std::min(c.chunk, c.items), last}) {
    add(false, items * l.src_channels);
    add(!filter_grad, items * l.dst_channels);
  }
  return out;
}

}  // namespace

GpuFftLayout MakeGpuFftLayout(const ConvGeometry& g, ConvPass pass, const GpuFftConfig& c,
                              int real_bytes) {
  return LayoutOf(g, pass, c, real_bytes);
}
GpuFftLayout MakeGpuFftLayout(const Conv3dGeometry& g, ConvPass pass, const GpuFftConfig& c,
                              int real_bytes) {
  return LayoutOf(g, pass, c, real_bytes);
}
std::vector<TransformShape> PassTransforms(const ConvGeometry& g, ConvPass pass,
                                           const GpuFftConfig& c, int real_bytes) {
  return TransformsOf(g, pass, c, real_bytes);
}
std::vector<TransformShape> PassTransforms(const Conv3dGeometry& g, ConvPass pass,
                                           const GpuFftConfig& c, int real_bytes) {
  return TransformsOf(g, pass, c, real_bytes);
}

// --- The GPU's algorithms (algorithms.h): what their descriptors' planning runs ---------

// The direct tile kernels: run every pass.
template <>
template <class G>
Status GpuPlanning<GpuDirectAlgorithm>::CanRun(const GpuProblem<G>&) {
  return OkStatus();
}
template <>
template <class G>
double GpuPlanning<GpuDirectAlgorithm>::Cost(GpuProblem<G>& pb, CudaPlan* p) {
  p->direct = MakeTileConfig(pb.g, pb.pass, pb.real_bytes, pb.limit);
  return DirectSeconds(pb.g, pb.pass, p->direct, pb.real_bytes);
}
template <>
template <class G>
int64_t GpuPlanning<GpuDirectAlgorithm>::WorkspaceBytes(const GpuProblem<G>&, const CudaPlan& p) {
  return p.direct.workspace_bytes;
}
template <>
template <class G>
Status GpuPlanning<GpuDirectAlgorithm>::Finish(GpuProblem<G>&, CudaPlan* p) {
  p->workspace_bytes = p->direct.workspace_bytes;
  return OkStatus();
}

// The FFT path: needs a transform library, except on a pass without products (which the
// direct kernels run).
template <>
template <class G>
Status GpuPlanning<GpuFftAlgorithm>::CanRun(const GpuProblem<G>& pb) {
  if (pb.work_bytes != nullptr || pb.g.no_products()) return OkStatus();
  return Unimplemented("algorithm='fft' is not available: " + pb.fft_unavailable);
}

// The cheapest transform size whose smallest round fits, with the largest round that fits
// the limit (cuFFT's work area estimated); then cuFFT's actual work area, halving the round
// until everything fits. cuFFT may want far more than the estimate for some sizes
// (measured on an H100: a 75x75 size over 1024 filter spectra, which no round size
// shrinks); such a size is refused and the search runs again without it, a few times at
// most. cuFFT is not asked (no plans made) when the direct kernels win anyway, nor
// searched when they were asked for.
//
// The sizes searched: in 2-D, sides of at least 2, as cuFFT makes no 2-D plan with a side
// of 1; but a 1-D geometry (conv1d: every height 1) takes single rows, height 1, as rank-1
// plans (cufft.cu). In 3-D, sides of at least 2 likewise (rank-3 plans).
template <class Fit, class Cost>
FftSearch<GpuFftConfig> SearchSizes(const ConvGeometry& g, ConvPass pass, const Fit& fit,
                                    const Cost& cost) {
  const int64_t min_side = g.filter_h == 1 && g.in_h == 1 && g.out_h == 1 ? 1 : 2;
  return SearchFftSizes<GpuFftConfig>(
      g, pass, min_side,
      [&](int64_t fh, int64_t fw, GpuFftConfig* c, int64_t* smallest) {
        return fit(FftSize{1, fh, fw}, c, smallest);
      },
      cost);
}
template <class Fit, class Cost>
FftSearch<GpuFftConfig> SearchSizes(const Conv3dGeometry& g, ConvPass pass, const Fit& fit,
                                    const Cost& cost) {
  std::array<std::vector<int64_t>, kSpatial3d> sizes;
  if (!FftSizeCandidates(g, pass, &sizes)) return FftSearch<GpuFftConfig>{};
  for (std::vector<int64_t>& s : sizes) {
    s.erase(std::remove_if(s.begin(), s.end(), [](int64_t v) { return v < 2; }), s.end());
    if (s.empty()) s.push_back(2);
  }
  return SearchTransformSizes<GpuFftConfig>(sizes, fit, cost);
}

template <>
template <class G>
double GpuPlanning<GpuFftAlgorithm>::Cost(GpuProblem<G>& pb, CudaPlan* p) {
  if (pb.requested == kGpuDirect || pb.g.no_products()) return -1;
  const G& g = pb.g;
  const ConvPass pass = pb.pass;
  std::vector<FftSize> refused;
  const auto fit = [&](const FftSize& f, GpuFftConfig* c, int64_t* smallest) {
    const bool skip = std::find(refused.begin(), refused.end(), f) != refused.end();
    return !skip && FitRounds(g, pass, pb.real_bytes, pb.limit, f, c, smallest);
  };
  const auto cost = [&](const GpuFftConfig& c) { return FftSeconds(g, pass, c, pb.real_bytes); };
  FftSearch<GpuFftConfig> search = SearchSizes(g, pass, fit, cost);
  pb.min_bytes = search.min_bytes;
  pb.found = search.found;
  for (int attempt = 0; pb.found; ++attempt) {
    if (pb.requested == kAutoAlgorithm && search.cost >= p->costs[kGpuDirect]) {
      pb.found = false;
      return search.cost;
    }
    pb.best = search.config;
    const CufftFit fitted = FitCufftWorkArea(g, pass, pb.real_bytes, pb.limit, *pb.work_bytes,
                                             &pb.best, &pb.work, &pb.error);
    pb.found = fitted == CufftFit::kFits;
    if (fitted != CufftFit::kTooLarge || attempt + 1 == kMaxRefusedSizes) break;
    refused.push_back(FftSize{pb.best.fft_d, pb.best.fft_h, pb.best.fft_w});
    search = SearchSizes(g, pass, fit, cost);
    pb.found = search.found;
  }
  return pb.found ? FftSeconds(g, pass, pb.best, pb.real_bytes) : -1;
}

template <>
template <class G>
int64_t GpuPlanning<GpuFftAlgorithm>::WorkspaceBytes(const GpuProblem<G>& pb, const CudaPlan&) {
  return MakeGpuFftLayout(pb.g, pb.pass, pb.best, pb.real_bytes).fft_bytes + Align256(pb.work);
}

template <>
template <class G>
Status GpuPlanning<GpuFftAlgorithm>::Finish(GpuProblem<G>& pb, CudaPlan* p) {
  if (!pb.found) {
    if (!pb.error.ok()) {
      return Status(pb.error.kind(), "algorithm='fft' is not available: " + pb.error.message());
    }
    return FftUnavailable(pb.limit, pb.min_bytes, pb.pass);
  }
  p->fft = pb.best;
  p->fft_terms = FftTerms(pb.g, pb.pass, pb.best, pb.real_bytes);
  p->fft_work_bytes = Align256(pb.work);
  // The exact redo for non-finite operands shares everything after the flag.
  p->direct =
      MakeTileConfig(pb.g, pb.pass, pb.real_bytes, std::max<int64_t>(0, pb.limit - kFlagBytes));
  const int64_t fft =
      MakeGpuFftLayout(pb.g, pb.pass, pb.best, pb.real_bytes).fft_bytes + p->fft_work_bytes;
  p->workspace_bytes = std::max(fft, kFlagBytes + p->direct.workspace_bytes);
  return OkStatus();
}

namespace {

template <class G>
Status PlanOf(const G& g, ConvPass pass, Algorithm algorithm, int real_bytes, int64_t limit,
              const WorkBytesFn* work_bytes, const std::string& fft_unavailable, CudaPlan* plan) {
  GpuProblem<G> pb{{g, pass, algorithm, limit < 0 ? kDefaultWorkspaceLimit : limit},
                   real_bytes,
                   work_bytes,
                   fft_unavailable};
  CudaPlan p;
  p.pass = pass;
  p.costs[kCudnn] = CudnnSeconds(g);
  LC_RETURN_IF_ERROR(PlanWithAlgorithms<GpuAlgorithms>("on the GPU", pb, &p));
  *plan = p;
  return OkStatus();
}

}  // namespace

Status PlanGpuPass(const ConvGeometry& g, ConvPass pass, Algorithm algorithm, int real_bytes,
                   int64_t limit, const WorkBytesFn* work_bytes, const std::string& fft_unavailable,
                   CudaPlan* plan) {
  return PlanOf(g, pass, algorithm, real_bytes, limit, work_bytes, fft_unavailable, plan);
}

Status PlanGpuPass(const Conv3dGeometry& g, ConvPass pass, Algorithm algorithm, int real_bytes,
                   int64_t limit, const WorkBytesFn* work_bytes, const std::string& fft_unavailable,
                   CudaPlan* plan) {
  return PlanOf(g, pass, algorithm, real_bytes, limit, work_bytes, fft_unavailable, plan);
}

}  // namespace cuda
}  // namespace largeconv
