// The one search both planners run (the CPU's plan.cc and the GPU's cuda/fft_plan.cc): the
// FFT transform sizes are tried in one order, each sized under the workspace limit by the
// platform's own rule and priced by its own cost model, the cheapest kept; then one rule
// picks the algorithm from the candidates' costs and obeys an explicit request. What differs
// between the platforms (how a configuration is cut up, its workspace, its cost) stays in
// their planners; what a search is, is written here once.
#ifndef TF_LARGECONV_CORE_PLAN_SEARCH_H_
#define TF_LARGECONV_CORE_PLAN_SEARCH_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "cc/core/fft.h"
#include "cc/core/geometry.h"
#include "cc/core/vocabulary.h"

namespace largeconv {

template <typename Config>
struct FftSearch {
  bool found = false;      // some transform size fits the limit
  Config config{};         // the cheapest that fits
  double cost = -1;        // its cost-model seconds (< 0: none found)
  int64_t min_bytes = -1;  // the smallest workspace any size needed (< 0: no size at all)
};

// Tries every transform size FftSizeCandidates offers (heights outer, widths inner; the
// first of equally cheap sizes wins). For each, fit(fh, fw, &config, &smallest) sizes a
// configuration under the limit and returns whether one fits, setting `smallest` to the
// least workspace the size can take (left < 0 when the size cannot run at all);
// cost(config) prices a fitting one.
template <typename Config, typename Fit, typename Cost>
FftSearch<Config> SearchFftSizes(const ConvGeometry& g, ConvPass pass, int64_t min_side,
                                 const Fit& fit, const Cost& cost) {
  FftSearch<Config> best;
  std::vector<int64_t> heights, widths;
  if (!FftSizeCandidates(g, pass, min_side, &heights, &widths)) return best;
  for (int64_t fh : heights) {
    for (int64_t fw : widths) {
      Config config{};
      int64_t smallest = -1;
      const bool fits = fit(fh, fw, &config, &smallest);
      if (smallest >= 0 && (best.min_bytes < 0 || smallest < best.min_bytes)) {
        best.min_bytes = smallest;
      }
      if (!fits) continue;
      const double c = cost(config);
      if (!best.found || c < best.cost) {
        best.found = true;
        best.config = config;
        best.cost = c;
      }
    }
  }
  return best;
}

// The algorithm a pass runs, given each one's cost-model seconds (< 0: it cannot run here):
// an explicit request as asked (the caller has refused one that cannot run), kAuto the
// cheapest, the simpler algorithm on a tie (direct, then the FFT, then TF's kernels).
inline Algorithm ChooseAlgorithm(Algorithm requested, double cost_direct, double cost_fft,
                                 double cost_tf) {
  if (requested != Algorithm::kAuto) return requested;
  Algorithm best = Algorithm::kDirect;
  double best_cost = cost_direct;
  for (const auto& [algorithm, cost] :
       {std::pair<Algorithm, double>{Algorithm::kFft, cost_fft}, {Algorithm::kTf, cost_tf}}) {
    if (cost >= 0 && cost < best_cost) {
      best = algorithm;
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_PLAN_SEARCH_H_
