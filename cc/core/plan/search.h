// The one search both planners run (the CPU's plan/cpu_fft.cc and the GPU's
// cuda/fft_plan.cc): the
// FFT transform sizes are tried in one order, each sized under the workspace limit by the
// platform's own rule and priced by its own cost model, the cheapest kept; then one rule
// picks the algorithm from the descriptors the planner lists (can run, cost, workspace,
// finish) and obeys an explicit request. What differs between the platforms (how a
// configuration is cut up, its workspace, its cost) stays in their planners' descriptors;
// what a search is, is written here once.
#ifndef TF_LARGECONV_CORE_PLAN_SEARCH_H_
#define TF_LARGECONV_CORE_PLAN_SEARCH_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <string>
#include <vector>

#include "cc/core/common/geometry.h"
#include "cc/core/common/status.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/plan/tiling.h"

namespace largeconv {

template <typename Config>
struct FftSearch {
  bool found = false;      // some transform size fits the limit
  Config config{};         // the cheapest that fits
  double cost = -1;        // its cost-model seconds (< 0: none found)
  int64_t min_bytes = -1;  // the smallest workspace any size needed (< 0: no size at all)
};

// Tries every combination of the per-dimension transform sizes `sizes` (the first
// dimension outermost; the first of equally cheap sizes wins). For each, fit(size, &config,
// &smallest) sizes a configuration under the limit and returns whether one fits, setting
// `smallest` to the least workspace the size can take (left < 0 when the size cannot run
// at all); cost(config) prices a fitting one. The one search of every dimensionality.
template <typename Config, size_t N, typename Fit, typename Cost>
FftSearch<Config> SearchTransformSizes(const std::array<std::vector<int64_t>, N>& sizes,
                                       const Fit& fit, const Cost& cost) {
  FftSearch<Config> best;
  for (const auto& s : sizes) {
    if (s.empty()) return best;
  }
  std::array<size_t, N> at{};
  while (true) {
    std::array<int64_t, N> size;
    for (size_t i = 0; i < N; ++i) size[i] = sizes[i][at[i]];
    Config config{};
    int64_t smallest = -1;
    const bool fits = fit(size, &config, &smallest);
    if (smallest >= 0 && (best.min_bytes < 0 || smallest < best.min_bytes)) {
      best.min_bytes = smallest;
    }
    if (fits) {
      const double c = cost(config);
      if (!best.found || c < best.cost) {
        best.found = true;
        best.config = config;
        best.cost = c;
      }
    }
    size_t i = N;  // the next combination, the last dimension fastest
    while (i > 0 && ++at[i - 1] == sizes[i - 1].size()) at[--i] = 0;
    if (i == 0) return best;
  }
}

// The 2-D search: every transform size FftSizeCandidates offers (heights outer, widths
// inner), fit(fh, fw, &config, &smallest) as SearchTransformSizes' fit.
template <typename Config, typename Fit, typename Cost>
FftSearch<Config> SearchFftSizes(const ConvGeometry& g, ConvPass pass, int64_t min_side,
                                 const Fit& fit, const Cost& cost) {
  std::array<std::vector<int64_t>, 2> sizes;
  if (!FftSizeCandidates(g, pass, min_side, &sizes[0], &sizes[1])) return FftSearch<Config>{};
  return SearchTransformSizes<Config>(
      sizes,
      [&](const std::array<int64_t, 2>& f, Config* config, int64_t* smallest) {
        return fit(f[0], f[1], config, smallest);
      },
      cost);
}

// Cost-model seconds of each algorithm on one pass, by Algorithm (< 0: it cannot run here,
// or was not priced). What a plan reports and the choice is made on. It holds up to
// kCapacity algorithms; each platform's list checks at compile time that it fits.
class AlgorithmCosts {
 public:
  static constexpr size_t kCapacity = 8;

  // The algorithm's entry, made (at -1) on first use.
  double& operator[](Algorithm a) {
    for (size_t i = 0; i < size_; ++i) {
      if (algorithms_[i] == a) return seconds_[i];
    }
    if (size_ == kCapacity) std::abort();  // the platforms' static_asserts rule this out
    algorithms_[size_] = a;
    seconds_[size_] = -1;
    return seconds_[size_++];
  }
  double operator[](Algorithm a) const {
    for (size_t i = 0; i < size_; ++i) {
      if (algorithms_[i] == a) return seconds_[i];
    }
    return -1;
  }

 private:
  Algorithm algorithms_[kCapacity];
  double seconds_[kCapacity] = {};
  size_t size_ = 0;
};

// What every planner's view of one request holds; each planner extends it with its own
// (the request's details, and what its algorithms leave there while pricing). Geometry:
// ConvGeometry, or Conv3dGeometry for the 3-D ops.
template <class Geometry>
struct PlanProblemOf {
  const Geometry& g;
  ConvPass pass;
  Algorithm requested;  // as asked, until the search settles it
  int64_t limit;        // workspace bytes
};
using PlanProblem = PlanProblemOf<ConvGeometry>;

// An algorithm as a planner sees it. Problem: the planner's PlanProblem; Plan: its plan,
// with `algorithm` and `costs`.
//   can_run(pb)            OK when it can run this request, else the error an explicit
//                          request of it gets (an automatic choice passes it by);
//   cost(pb, plan)         its cost-model seconds (< 0: nothing of it fits the limit, or
//                          not priced for this request), the configuration it priced left
//                          in *plan or in the planner's own part of the problem;
//   workspace_bytes(pb, plan)  the bytes of that configuration; an automatic choice takes
//                          it only within the limit;
//   finish(pb, plan)       the chosen algorithm's final configuration and workspace in
//                          *plan, or the error when an explicit request has nothing that fits.
// needs_products: it has nothing to do on a pass without products (an empty operand or
// result), which the first algorithm (the direct kernels) then runs even when this one was
// asked for.
template <class Problem, class Plan>
struct AlgorithmDescriptor {
  Algorithm algorithm;
  bool needs_products;
  Status (*can_run)(const Problem&);
  double (*cost)(Problem&, Plan*);
  int64_t (*workspace_bytes)(const Problem&, const Plan&);
  Status (*finish)(Problem&, Plan*);
};

// The algorithms of a platform, simplest first: the one list its planner chooses from and
// its runner runs from (the CPU's CpuAlgorithms, plan/cpu_algorithms.h; the GPU's
// GpuAlgorithms, cuda/algorithms.h). Each is a descriptor type A holding everything about
// one algorithm:
//   A::kAlgorithm, A::kNeedsProducts     its name and needs_products (as above);
//   A::CanRun, A::Cost, A::WorkspaceBytes, A::Finish
//                                        the planner's four functions, for each problem
//                                        type the platform plans (overloads or templates);
//   A::Run                               how it runs a planned pass (its signature is the
//                                        platform's: conv.cc on the CPU, cuda/fft.cu and
//                                        cuda/emulate.h on the GPU).
template <class... A>
struct AlgorithmList {
  static constexpr size_t size = sizeof...(A);
  static_assert(size <= AlgorithmCosts::kCapacity, "a plan's costs hold every algorithm");
};

// The planner's view of a list: one AlgorithmDescriptor per algorithm, in its order.
template <class Problem, class Plan, class List>
struct DescriptorsOf;
template <class Problem, class Plan, class... A>
struct DescriptorsOf<Problem, Plan, AlgorithmList<A...>> {
  static constexpr AlgorithmDescriptor<Problem, Plan> kAll[] = {
      {A::kAlgorithm, A::kNeedsProducts, &A::CanRun, &A::Cost, &A::WorkspaceBytes, &A::Finish}...};
};

// The one choice both planners make over their algorithms (listed simplest first: the
// first is the direct kernels, which run everything). An explicit request is planned as
// asked once its algorithm can run (`where` names the platform in the refusal of one the
// planner does not offer); kAutoAlgorithm takes the cheapest that fits, the earlier on a
// tie. Every algorithm that can run is priced, so the plan reports each one's cost.
template <class Problem, class Plan, size_t N>
Status PlanWithAlgorithms(const AlgorithmDescriptor<Problem, Plan> (&algorithms)[N],
                          const char* where, Problem& pb, Plan* plan) {
  if (pb.requested != kAutoAlgorithm) {
    const auto* asked = std::find_if(std::begin(algorithms), std::end(algorithms),
                                     [&](const auto& d) { return d.algorithm == pb.requested; });
    if (asked == std::end(algorithms)) {
      std::vector<Algorithm> offered = {kAutoAlgorithm};
      for (const auto& d : algorithms) offered.push_back(d.algorithm);
      return InvalidArgument(std::string("algorithm='") + pb.requested.name() +
                             "' is not available " + where + ": use " + AlgorithmChoices(offered));
    }
    LC_RETURN_IF_ERROR(asked->can_run(pb));
    if (asked->needs_products && pb.g.no_products()) pb.requested = algorithms[0].algorithm;
  }
  const AlgorithmDescriptor<Problem, Plan>* chosen = nullptr;
  double best = 0;
  for (const auto& d : algorithms) {
    if (!d.can_run(pb).ok()) continue;
    const double cost = d.cost(pb, plan);
    plan->costs[d.algorithm] = cost;
    const bool take = pb.requested != kAutoAlgorithm
                          ? d.algorithm == pb.requested
                          : cost >= 0 && (chosen == nullptr || cost < best) &&
                                d.workspace_bytes(pb, *plan) <= pb.limit;
    if (take) {
      chosen = &d;
      best = cost;
    }
  }
  plan->algorithm = chosen->algorithm;
  return chosen->finish(pb, plan);
}

// The same over a platform's list.
template <class List, class Problem, class Plan>
Status PlanWithAlgorithms(const char* where, Problem& pb, Plan* plan) {
  return PlanWithAlgorithms(DescriptorsOf<Problem, Plan, List>::kAll, where, pb, plan);
}

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_PLAN_SEARCH_H_
