// The FFT's planning (cpu_fft.h): the transform size and the source block that groups the
// sums over source channels, chosen from the limit and the geometry for a fixed reference
// parallelism (never the thread count), so results are bitwise identical whatever the
// number of threads; the other blocks and the slots, which do not change the arithmetic,
// then use the threads the limit can pay for.
#include "cc/core/plan/cpu_fft.h"

#include <algorithm>
#include <array>
#include <functional>
#include <type_traits>
#include <vector>

#include "cc/core/cpu/fft.h"
#include "cc/core/plan/cost_model.h"
#include "cc/core/plan/cpu_direct.h"
#include "cc/core/plan/search.h"
#include "cc/core/plan/tiling.h"

namespace largeconv {
namespace {

// Whether some run of tiles per item could make a one-group 2-D configuration (its
// largest destination block, one tile per item) cheaper: one as long as all the tiles,
// which saves every filter read it can, against the same without runs. Smaller blocks
// only add transforms and save fewer reads.
bool RunsCanPay(const ConvGeometry& g, ConvPass pass, const FftConfig& c) {
  if (FilterBlockValues(g, pass, c) <= kCachedFilterValues) return false;
  FftConfig all = c;
  all.vec_block = std::max<int64_t>(2, g.batch * c.tiling.tiles_h * c.tiling.tiles_w);
  double flops;
  return FftCost(g, pass, all, &flops) < FftCost(g, pass, c, &flops);
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

// Tiles per sweep of the filter pass (with one group) the planner tries: the accumulators
// are read and written once per sweep, so eight take their traffic to an eighth.
constexpr int64_t kFilterSweeps[] = {8, 4, 2};

// The filter pass's block configurations for `threads` units of work, largest first:
// calls visit(config) for each until it returns true. Many groups keep the threads busy
// with whole groups per unit, batched (vec_block halving); otherwise enough (input,
// output) units to keep `threads` busy, output channels split first, then both halved in
// turn down to single channels.
// With `only_sweep` (one group), every configuration sweeps that many tiles, on any number
// of threads.
template <typename Visit>
void ForEachFilterBlocks(const ConvGeometry& g, int64_t threads, FftConfig c, int64_t only_sweep,
                         const Visit& visit) {
  const int64_t icpg = std::max<int64_t>(1, g.in_c_per_group());
  const int64_t ocpg = std::max<int64_t>(1, g.out_c_per_group());
  if (g.groups >= threads && only_sweep == 0) {  // (only_sweep: one group, on any threads)
    c.in_block = icpg;
    c.out_block = ocpg;
    constexpr int64_t kVecBlock = 16;
    for (c.vec_block =
             std::max<int64_t>(1, std::min<int64_t>(kVecBlock, CeilDiv(g.groups, threads)));
         c.vec_block >= 1; c.vec_block /= 2) {
      if (visit(c)) return;
    }
  }
  c.vec_block = 1;
  const int64_t want = std::max<int64_t>(1, CeilDiv(threads, g.groups));
  c.out_block = CeilDiv(ocpg, std::min(ocpg, want));
  const int64_t co_units = CeilDiv(ocpg, c.out_block);
  c.in_block = CeilDiv(icpg, std::min(icpg, std::max<int64_t>(1, want / co_units)));
  // With one group, each block also with sweeps of several tiles (vec_block, longest
  // first), then one tile at a time.
  const int64_t tiles = g.batch * c.tiling.tiles_h * c.tiling.tiles_w;
  const auto visit_sweeps = [&](FftConfig& b) {
    if (g.groups == 1 && only_sweep > 0) {
      b.vec_block = only_sweep;
      return visit(b);
    }
    if (g.groups == 1) {
      for (const int64_t sweep : kFilterSweeps) {
        if (sweep > tiles) continue;
        b.vec_block = sweep;
        if (visit(b)) return true;
      }
    }
    b.vec_block = 1;
    return visit(b);
  };
  while (!visit_sweeps(c) && (c.in_block > 1 || c.out_block > 1)) {
    if (c.in_block >= c.out_block) {
      c.in_block = CeilDiv(c.in_block, 2);
    } else {
      c.out_block = CeilDiv(c.out_block, 2);
    }
  }
}

// Runs of tiles per item (BatchesTiles) for the largest blocks `c` that fit, so that each
// filter value read serves the whole run: among destination blocks as large as fit or up
// to two blocks more (smaller blocks leave room for longer runs), each with the whole
// source block, and runs from two tiles up to a slot's share, the cheapest for the slots
// by the cost model (its filter reads against the transforms and the parallel items); one
// tile per item where none is cheaper. The lengths tried grow by about half a step, to 32
// (the reads then cost 1/32 of one per multiply-add; longer runs gain little more, and
// each length tried is a pricing). fits(): whether *c fits the limit.
template <typename Fits>
void ChooseTileRuns(const ConvGeometry& g, ConvPass pass, int64_t dest, int64_t source_block,
                    const Fits& fits, FftConfig* c) {
  constexpr int64_t kRunLengths[] = {2, 3, 4, 6, 8, 12, 16, 24, 32};
  const int64_t tiles = g.batch * c->tiling.tiles_h * c->tiling.tiles_w;
  const int64_t slots = std::max<int64_t>(1, c->slots);
  const FftConfig largest = *c;
  const int64_t fewest = CeilDiv(dest, largest.out_block);
  FftConfig best = largest;
  double best_cost = LongestRunCost(g, pass, largest, slots);
  for (int64_t blocks = fewest; blocks <= std::min(dest, fewest + 2); ++blocks) {
    *c = largest;
    c->out_block = CeilDiv(dest, blocks);
    if (blocks > fewest && c->out_block == CeilDiv(dest, blocks - 1)) continue;
    if (LargestFitting(source_block, &c->in_block, fits) < source_block) continue;
    for (const int64_t run : kRunLengths) {
      c->vec_block = std::min(run, CeilDiv(tiles, slots));  // at most a slot's share
      if (c->vec_block < 2 || !fits()) break;
      const double cost = LongestRunCost(g, pass, *c, slots);
      if (cost < best_cost) {
        best_cost = cost;
        best = *c;
      }
      if (c->vec_block < run) break;
    }
  }
  *c = best;
}

// Blocks for `threads` (filter pass) or `c->slots` slots that fit the limit; false if
// none. Without `price`, the largest that fit; with it, for the filter pass, the cheapest
// by price among all of the ladder's configurations that fit, so that a larger limit, which
// only lets more of them fit, never makes the choice dearer.
bool FitBlocks(const ConvGeometry& g, ConvPass pass, int64_t limit, int real_bytes, int64_t threads,
               FftConfig* c, const std::function<double(const FftConfig&)>& price = nullptr) {
  if (WritesFilter(pass)) {
    // Matrix products (UsesGemm) sum each sweep of kGemmSweep tiles at once, so where the
    // geometry takes them and their smallest blocks fit the limit on one slot (neither
    // follows the thread count), every configuration sweeps kGemmSweep tiles; elsewhere no
    // configuration with that sweep fits, and the ladder's sweeps run tile by tile.
    FftConfig gemm = *c;
    gemm.in_block = gemm.out_block = gemm.slots = 1;
    gemm.vec_block = kGemmSweep;
    const bool sums_sweeps =
        UsesGemm(g, pass, gemm) && FftWorkspaceBytes(g, pass, gemm, real_bytes) <= limit;
    bool found = false;
    double best = 0;
    const int64_t only_sweep = sums_sweeps ? kGemmSweep : 0;
    ForEachFilterBlocks(g, std::max<int64_t>(1, threads), *c, only_sweep,
                        [&](const FftConfig& trial) {
                          if (FftWorkspaceBytes(g, pass, trial, real_bytes) > limit) return false;
                          const double cost = price ? price(trial) : 0;
                          if (!found || cost < best) {
                            found = true;
                            best = cost;
                            *c = trial;
                          }
                          return !price;  // the largest that fits, or go on pricing
                        });
    return found;
  }
  const int64_t dest = std::max<int64_t>(1, g.channels(pass).dst_per_group);
  const auto fits = [&] { return FftWorkspaceBytes(g, pass, *c, real_bytes) <= limit; };
  c->group_block = 1;
  c->vec_block = 1;
  c->out_block = 1;
  c->in_block = 1;
  if (!fits()) return false;
  c->out_block = LargestFitting(dest, &c->out_block, fits);
  if (g.groups == 1 && c->fft_h == 1) {  // rows of height 1: batch tiles (LinePointFactor)
    const int64_t tiles = g.batch * c->tiling.tiles_h * c->tiling.tiles_w;
    for (c->vec_block = std::min(kLineBlock, tiles); c->vec_block > 1; c->vec_block /= 2) {
      if (fits()) break;
    }
    c->vec_block = std::max<int64_t>(1, c->vec_block);
  }
  if (c->out_block >= dest && g.groups > 1) {  // whole groups fit: batch several groups
    // Enough to amortise DUCC's per-call overhead, and 64 bytes of float channels.
    constexpr int64_t kVecBlock = 16;
    c->vec_block = std::min<int64_t>(kVecBlock, g.groups);
    if (!fits()) c->vec_block = 1;
    c->group_block = LargestFitting(g.groups, &c->group_block, fits);
    c->vec_block = std::min(c->vec_block, c->group_block);
  }
  // Source channels whose spectra a slot holds at once (kSourceBlock, cpu/fft.h).
  const int64_t sources = std::max<int64_t>(1, g.channels(pass).src_per_group);
  const int64_t source_block = std::min(kSourceBlock, sources);
  LargestFitting(source_block, &c->in_block, fits);
  if (g.groups == 1 && c->fft_h > 1 && c->in_block == source_block && RunsCanPay(g, pass, *c)) {
    ChooseTileRuns(g, pass, dest, source_block, fits, c);
  }
  return true;
}

// --- Three spatial dimensions: blocks under the limit ------------------------------------

// The largest blocks with which `c->slots` slots fit the limit; false when single channels
// do not. The filter pass keeps at least `threads` units of channel pairs where it has them.
bool FitBlocks(const Conv3dGeometry& g, ConvPass pass, int64_t limit, int real_bytes,
               int64_t threads, Fft3dConfig* c) {
  const auto fits = [&] { return FftWorkspaceBytes(g, pass, *c, real_bytes) <= limit; };
  c->in_block = 1;
  c->out_block = 1;
  if (!fits()) return false;
  if (!WritesFilter(pass)) {
    LargestFitting(std::max<int64_t>(1, g.channels(pass).dst_per_group), &c->out_block, fits);
    return true;
  }
  const int64_t icpg = std::max<int64_t>(1, g.in_c_per_group()),
                ocpg = std::max<int64_t>(1, g.out_c_per_group());
  const int64_t out_units = std::min(ocpg, CeilDiv(std::max<int64_t>(1, threads), g.groups));
  LargestFitting(CeilDiv(ocpg, out_units), &c->out_block, fits);
  const int64_t units = g.groups * CeilDiv(ocpg, c->out_block);
  const int64_t in_units = std::min(icpg, CeilDiv(std::max<int64_t>(1, threads), units));
  LargestFitting(CeilDiv(icpg, in_units), &c->in_block, fits);
  return true;
}

// The best transform size. It must not depend on the thread count (it changes the
// arithmetic), so it is chosen for a fixed reference parallelism: every transform size is
// sized for kReferenceSlots slots and for one, and each candidate is priced as the time it
// takes on kReferenceSlots threads, expressed in single-thread seconds (cost x
// kReferenceSlots / slots it can keep busy). All candidates compete in one search, so a
// larger limit only adds candidates and makes none dearer (larger blocks do fewer
// transforms): the planned cost never increases with the limit. Not searched when the
// direct kernels were asked for.
double FftSearchCost(CpuProblem& pb, PassPlan* p) {
  if (pb.requested == DirectAlgorithm::kAlgorithm || pb.g.no_products()) return -1;
  const ConvGeometry& g = pb.g;
  const ConvPass pass = pb.pass;
  const int real_bytes = pb.req.real_bytes;
  const auto cost = [&](const FftConfig& c) { return ReferenceCost(g, pass, c); };
  for (int64_t nominal : {kReferenceSlots, int64_t{1}}) {
    const auto fit = [&](int64_t fh, int64_t fw, FftConfig* c, int64_t* smallest) {
      c->fft_h = fh;
      c->fft_w = fw;
      if (!MakeFftTiling(g, pass, fh, fw, &c->tiling)) return false;
      c->slots = 1;
      *smallest = FftWorkspaceBytes(g, pass, *c, real_bytes);
      c->slots = nominal;
      return FitBlocks(g, pass, pb.limit, real_bytes, nominal, c, cost);
    };
    const FftSearch<FftConfig> round = SearchFftSizes<FftConfig>(g, pass, 1, fit, cost);
    // Every round reports the same smallest workspace (one slot, smallest blocks).
    if (!pb.fft.found || (round.found && round.cost < pb.fft.cost)) pb.fft = round;
  }
  pb.fft.config.slots = 1;
  if (pb.fft.found && !WritesFilter(pass)) {
    // The same configuration with its filter spectra kept: its cost scaled by the share
    // of the single-thread seconds the filter's transforms leave (they run on the slots
    // as the tiles' do).
    const FftConfig& c = pb.fft.config;
    double flops;
    p->fft_kept_seconds =
        pb.fft.cost * FftCost(g, pass, c, &flops, true) / FftCost(g, pass, c, &flops);
    p->kept_spectra_bytes =
        KeptSpectraValues(g, pass, c) * 2 * real_bytes + g.filter_elements() * real_bytes;
  }
  return pb.fft.cost;
}

// The 3-D transform size: as FftSearchCost, over every combination of per-dimension sizes.
double Fft3dSearchCost(Cpu3dProblem& pb, Pass3dPlan*) {
  std::array<std::vector<int64_t>, kSpatial3d> sizes;
  if (pb.requested == DirectAlgorithm::kAlgorithm || !FftSizeCandidates(pb.g, pb.pass, &sizes))
    return -1;
  const Conv3dGeometry& g = pb.g;
  const ConvPass pass = pb.pass;
  const int real_bytes = pb.req.real_bytes;
  const auto cost = [&](const Fft3dConfig& c) { return ReferenceCost(g, pass, c); };
  for (int64_t nominal : {kReferenceSlots, int64_t{1}}) {
    const auto fit = [&](const Dims3& f, Fft3dConfig* c, int64_t* smallest) {
      c->fft = f;
      if (!MakeFftTiling(g, pass, f, &c->tiling)) return false;
      *smallest = FftWorkspaceBytes(g, pass, *c, real_bytes);  // one slot, single channels
      c->slots = nominal;
      return *smallest <= pb.limit && FitBlocks(g, pass, pb.limit, real_bytes, nominal, c);
    };
    const FftSearch<Fft3dConfig> round = SearchTransformSizes<Fft3dConfig>(sizes, fit, cost);
    if (!pb.fft.found || (round.found && round.cost < pb.fft.cost)) pb.fft = round;
  }
  pb.fft.config.slots = 1;
  return pb.fft.cost;
}

// The blocks FftFinish gives `slots` slots, priced as the search prices them (FitBlocks
// weighs the 2-D filter pass's ladder, whose sweeps of tiles trade transforms against
// accumulator traffic; the other passes take the largest blocks that fit).
bool FinishBlocks(const CpuProblem& pb, int64_t slots, FftConfig* c) {
  const auto cost = [&](const FftConfig& trial) { return ReferenceCost(pb.g, pb.pass, trial); };
  return FitBlocks(pb.g, pb.pass, pb.limit, pb.req.real_bytes, slots, c, cost);
}
bool FinishBlocks(const Cpu3dProblem& pb, int64_t slots, Fft3dConfig* c) {
  return FitBlocks(pb.g, pb.pass, pb.limit, pb.req.real_bytes, slots, c);
}

// Spends the limit on parallelism: as many slots as useful, the largest blocks that fit,
// unless one slot is faster by the model once the wake-up is counted. Slots and blocks
// other than the forward and input-gradient passes' source block do not change the
// arithmetic, so they may depend on the thread count; that source block may not.
template <class Pb>
Status FftFinish(Pb& pb, typename Pb::Plan* p) {
  if (!pb.fft.found) return FftUnavailable(pb.limit, pb.fft.min_bytes, pb.pass);
  const auto& g = pb.g;
  const auto& best = pb.fft.config;
  // Blocks for `slots` slots on *trial (a copy of best); false where none fit.
  const auto finished = [&](int64_t slots, std::decay_t<decltype(best)>* trial) {
    trial->slots = slots;
    if (!FinishBlocks(pb, slots, trial)) return false;
    trial->slots = std::max<int64_t>(1, std::min(slots, ParallelItems(g, pb.pass, *trial)));
    return true;
  };
  // The forward and input-gradient passes sum their products over source channels
  // in_block at a time (MacSources, cpu/fft_products.h), so in_block sets the rounding: it
  // is fixed as the transform size is, for kReferenceSlots slots (or one where those do
  // not fit), from the limit and the geometry only. Any slot count whose blocks leave room
  // for it then takes it.
  int64_t source_block = 0;  // 0: not fixed (the filter pass, or no fit)
  if (!WritesFilter(pb.pass)) {
    for (const int64_t slots : {kReferenceSlots, int64_t{1}}) {
      auto trial = best;
      if (finished(slots, &trial)) {
        source_block = trial.in_block;
        break;
      }
    }
  }
  const auto keep_sums = [&](std::decay_t<decltype(best)>* trial) {
    if (source_block == 0) return true;
    if (trial->in_block < source_block) return false;
    trial->in_block = source_block;  // smaller than what fits: still fits
    return true;
  };
  auto c = best;
  for (int64_t slots = pb.threads; slots >= 1; --slots) {
    auto trial = best;
    if (finished(slots, &trial) && keep_sums(&trial)) {
      c = trial;
      break;
    }
  }
  auto one = best;
  const bool one_fits = finished(1, &one) && keep_sums(&one);
  if (c.slots > 1 && one_fits &&
      LongestRunCost(g, pb.pass, one, 1) <
          LongestRunCost(g, pb.pass, c, c.slots) + kSlotStartSeconds) {
    c = one;
  }
  p->fft = c;
  p->workspace_bytes = FftWorkspaceBytes(g, pb.pass, c, pb.req.real_bytes);
  p->fft_work = CountFftWork(g, pb.pass, c);
  p->fft_work.seconds = FftCost(g, pb.pass, c, &p->flops);
  return OkStatus();
}

// TensorFlow's kernels: only where the caller (the Python layer, which runs them) allows.
// Their temporaries: a 16 MiB im2col chunk (TF's Eigen path caps its patch buffer there)

}  // namespace

double FftAlgorithm::Cost(CpuProblem& pb, PassPlan* p) { return FftSearchCost(pb, p); }
double FftAlgorithm::Cost(Cpu3dProblem& pb, Pass3dPlan* p) { return Fft3dSearchCost(pb, p); }
Status FftAlgorithm::Finish(CpuProblem& pb, PassPlan* p) { return FftFinish(pb, p); }
Status FftAlgorithm::Finish(Cpu3dProblem& pb, Pass3dPlan* p) { return FftFinish(pb, p); }

}  // namespace largeconv
