// Cost model and search behind PassPlan. The FFT tile is chosen from the limit and the
// geometry only (never the thread count), so results are bitwise identical whatever the
// number of threads; blocks and slots, which do not change the arithmetic, then use the
// threads the limit can pay for.
#include "cc/core/plan.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cc/core/plan_search.h"

namespace largeconv {
namespace {

// Sustained single-thread rates measured on the project's CPU machines (float32,
// compiler-vectorised loops); used only to compare algorithms, never reported as timing.
constexpr double kDirectFlopsPerSec = 5e9;
constexpr double kFftFlopsPerSec = 3e9;
// TensorFlow's oneDNN kernels reach ~150 GFLOP/s per core with many channels, far less with
// few (measured ~40 GFLOP/s per core with 1 input and 3 output channels).
constexpr double kTfFlopsPerSec = 150e9;

double FftFlops(int64_t fh, int64_t fw) {
  // A real 2-D transform costs about half a complex one, 2.5 N log2 N, plus the passes over
  // memory around it (zeroing and loading the tile, DUCC's copies between axes, the
  // store), measured at roughly 30 flop-equivalents per point on this project's machines.
  // Without that term many small tiles look cheaper than one large one, and are not.
  const double n = static_cast<double>(fh) * fw;
  return 2.5 * n * std::log2(std::max(n, 2.0)) + 30.0 * n;
}

// Items each parallel phase splits over (used to cap useful slots).
int64_t ParallelItems(const ConvGeometry& g, ConvPass pass, const FftConfig& c) {
  const FftTiling& t = c.tiling;
  if (pass == ConvPass::kBackpropFilter) {
    return CeilDiv(g.groups, std::max<int64_t>(1, c.vec_block)) *
           CeilDiv(g.in_c_per_group(), c.in_block) * CeilDiv(g.out_c_per_group(), c.out_block);
  }
  return g.batch * t.tiles_h * t.tiles_w * std::max<int64_t>(1, c.group_block);
}

double FftCost(const ConvGeometry& g, ConvPass pass, const FftConfig& c, double* flops) {
  const FftTiling& t = c.tiling;
  const double bins = static_cast<double>(c.fft_h) * (c.fft_w / 2 + 1);
  const double tiles = static_cast<double>(g.batch) * t.tiles_h * t.tiles_w * g.groups;
  const double macs = tiles * bins * g.in_c_per_group() * g.out_c_per_group();
  *flops = FftTransformCount(g, pass, c) * FftFlops(c.fft_h, c.fft_w) + 8.0 * macs;
  return *flops / kFftFlopsPerSec;
}

// Largest v in [1, hi] for which fits() holds with *field = v, given that it holds for 1
// (fits() grows with *field). Leaves *field at the result.
template <typename Fits>
int64_t LargestFitting(int64_t hi, int64_t* field, const Fits& fits) {
  int64_t lo = 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    *field = mid;
    if (fits()) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  *field = lo;
  return lo;
}

// Largest blocks (with `slots` slots) that fit the limit; false if none.
bool FitBlocks(const ConvGeometry& g, ConvPass pass, int64_t limit, int real_bytes, int64_t threads,
               FftConfig* c) {
  if (pass == ConvPass::kBackpropFilter) {
    const int64_t icpg = std::max<int64_t>(1, g.in_c_per_group());
    const int64_t ocpg = std::max<int64_t>(1, g.out_c_per_group());
    c->vec_block = 1;
    // Many groups keep the threads busy with whole groups per unit, batched.
    if (g.groups >= threads) {
      c->in_block = icpg;
      c->out_block = ocpg;
      constexpr int64_t kVecBlock = 16;
      c->vec_block = std::max<int64_t>(
          1, std::min<int64_t>(kVecBlock, CeilDiv(g.groups, std::max<int64_t>(1, threads))));
      while (c->vec_block > 1 && FftWorkspaceBytes(g, pass, *c, real_bytes) > limit) {
        c->vec_block /= 2;
      }
      if (FftWorkspaceBytes(g, pass, *c, real_bytes) <= limit) return true;
    }
    // Otherwise enough (input, output) units to keep `threads` busy: split output channels
    // first.
    const int64_t want = std::max<int64_t>(1, CeilDiv(threads, g.groups));
    c->out_block = CeilDiv(ocpg, std::min(ocpg, want));
    const int64_t co_units = CeilDiv(ocpg, c->out_block);
    c->in_block = CeilDiv(icpg, std::min(icpg, std::max<int64_t>(1, want / co_units)));
    while (FftWorkspaceBytes(g, pass, *c, real_bytes) > limit) {
      if (c->in_block == 1 && c->out_block == 1) return false;
      if (c->in_block >= c->out_block) {
        c->in_block = CeilDiv(c->in_block, 2);
      } else {
        c->out_block = CeilDiv(c->out_block, 2);
      }
    }
    return true;
  }
  const int64_t dest = std::max<int64_t>(1, g.channels(pass).dst_per_group);
  const auto fits = [&] { return FftWorkspaceBytes(g, pass, *c, real_bytes) <= limit; };
  c->group_block = 1;
  c->vec_block = 1;
  c->out_block = 1;
  if (!fits()) return false;
  c->out_block = LargestFitting(dest, &c->out_block, fits);
  if (c->out_block >= dest && g.groups > 1) {  // whole groups fit: batch several groups
    // Enough to amortise DUCC's per-call overhead, and 64 bytes of float channels.
    constexpr int64_t kVecBlock = 16;
    c->vec_block = std::min<int64_t>(kVecBlock, g.groups);
    if (!fits()) c->vec_block = 1;
    c->group_block = LargestFitting(g.groups, &c->group_block, fits);
    c->vec_block = std::min(c->vec_block, c->group_block);
  }
  return true;
}

}  // namespace

int64_t TfWorkspaceEstimate(const ConvGeometry& g, int64_t threads, int real_bytes) {
  return (int64_t{16} << 20) + (threads + 1) * g.filter_elements() * real_bytes;
}

Status PlanPass(const ConvGeometry& g, ConvPass pass, const PlanRequest& req, PassPlan* plan) {
  const int64_t limit = req.workspace_limit < 0 ? kDefaultWorkspaceLimit : req.workspace_limit;
  const int64_t threads = std::max<int64_t>(1, req.threads);
  PassPlan p;
  p.pass = pass;
  p.flops = 2.0 * g.macs();
  p.cost_direct = p.flops / kDirectFlopsPerSec;
  p.algorithm = Algorithm::kDirect;

  // Best FFT configuration by cost. The transform size must not depend on the thread
  // count (it changes the arithmetic), so it is chosen for a fixed nominal number of slots
  // that leaves room to run in parallel, or for one slot if nothing fits that way.
  constexpr int64_t kNominalSlots = 4;
  FftSearch<FftConfig> fft;
  if (req.algorithm != Algorithm::kDirect) {
    for (int64_t nominal : {kNominalSlots, int64_t{1}}) {
      const auto fit = [&](int64_t fh, int64_t fw, FftConfig* c, int64_t* smallest) {
        c->fft_h = fh;
        c->fft_w = fw;
        if (!MakeFftTiling(g, pass, fh, fw, &c->tiling)) return false;
        c->slots = 1;
        *smallest = FftWorkspaceBytes(g, pass, *c, req.real_bytes);
        c->slots = nominal;
        return FitBlocks(g, pass, limit, req.real_bytes, 1, c);
      };
      const auto cost = [&](const FftConfig& c) {
        double flops;
        return FftCost(g, pass, c, &flops);
      };
      fft = SearchFftSizes<FftConfig>(g, pass, 1, fit, cost);
      if (fft.found) break;
    }
    fft.config.slots = 1;
  }
  p.cost_fft = fft.cost;
  if (req.allow_tf) {
    const double pairs = static_cast<double>(g.in_c_per_group()) * g.out_c_per_group();
    const double efficiency = std::min(1.0, std::sqrt(pairs) / 32.0);
    p.cost_tf = p.flops / (kTfFlopsPerSec * std::max(efficiency, 1e-3));
  }
  if (req.algorithm == Algorithm::kTf && !req.allow_tf) {
    return InvalidArgument("algorithm='tf' is not available for this configuration");
  }
  if (req.algorithm == Algorithm::kFft && !fft.found) {
    return FftUnavailable(limit, fft.min_bytes, pass);
  }
  const int64_t tf_bytes = TfWorkspaceEstimate(g, threads, req.real_bytes);
  p.algorithm = ChooseAlgorithm(req.algorithm, p.cost_direct, p.cost_fft,
                                req.allow_tf && tf_bytes <= limit ? p.cost_tf : -1);
  if (p.algorithm == Algorithm::kTf) {
    p.workspace_bytes = tf_bytes;
    *plan = p;
    return OkStatus();
  }
  if (p.algorithm == Algorithm::kFft) {
    // Now spend the limit on parallelism: as many slots as useful, largest blocks that fit.
    const FftConfig& best = fft.config;
    FftConfig c = best;
    for (int64_t slots = threads; slots >= 1; --slots) {
      FftConfig trial = best;
      trial.slots = slots;
      if (!FitBlocks(g, pass, limit, req.real_bytes, slots, &trial)) continue;
      trial.slots = std::max<int64_t>(1, std::min(slots, ParallelItems(g, pass, trial)));
      c = trial;
      break;
    }
    p.fft = c;
    p.workspace_bytes = FftWorkspaceBytes(g, pass, c, req.real_bytes);
    FftCost(g, pass, c, &p.flops);
  }
  *plan = p;
  return OkStatus();
}

}  // namespace largeconv
