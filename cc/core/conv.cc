// Runs a planned pass through the CPU's algorithms (plan/cpu_algorithms.h), the list the
// planner chose from.
#include "cc/core/conv.h"

#include <algorithm>

#include "cc/core/common/dtypes.h"
#include "cc/core/plan/cpu_algorithms.h"

namespace largeconv {

namespace {

// How an algorithm carries out a planned pass (of either geometry, G with its Plan): false
// when it cannot take these operands, and the list's first (the direct kernels), which
// takes any, runs the pass instead.
template <typename T, class G, class Plan>
struct Runner {
  Algorithm algorithm;
  bool (*run)(const G& g, const Plan& plan, const T* a, int64_t a_size, const T* b, int64_t b_size,
              T* out, void* workspace, const ParallelFor& pf);
};

// The runners of a list of algorithms, in its order: each descriptor's Run.
template <typename T, class G, class Plan, class List>
struct RunnersOf;
template <typename T, class G, class Plan, class... A>
struct RunnersOf<T, G, Plan, AlgorithmList<A...>> {
  static constexpr Runner<T, G, Plan> kAll[] = {{A::kAlgorithm, &A::template Run<T, G, Plan>}...};
};
template <typename T, class G, class Plan>
constexpr const auto& kRunners = RunnersOf<T, G, Plan, CpuAlgorithms>::kAll;

template <typename T, class G, class Plan>
void RunPlanned(const G& g, const Plan& plan, const T* a, int64_t a_size, const T* b,
                int64_t b_size, T* out, void* workspace, const ParallelFor& pf) {
  if (g.no_products()) {  // zeros, or nothing at all; what the kernels would write
    std::fill_n(out, g.elements(RolesOf(plan.pass).out), T{});
    return;
  }
  for (const Runner<T, G, Plan>& r : kRunners<T, G, Plan>) {
    if (r.algorithm == plan.algorithm && r.run(g, plan, a, a_size, b, b_size, out, workspace, pf)) {
      return;
    }
  }
  kRunners<T, G, Plan>[0].run(g, plan, a, a_size, b, b_size, out, workspace, pf);  // direct
}

}  // namespace

template <typename T>
void RunPass(const ConvGeometry& g, const PassPlan& plan, const T* a, int64_t a_size, const T* b,
             int64_t b_size, T* out, void* workspace, const ParallelFor& pf) {
  RunPlanned(g, plan, a, a_size, b, b_size, out, workspace, pf);
}

template <typename T>
void RunPass(const Conv3dGeometry& g, const Pass3dPlan& plan, const T* a, int64_t a_size,
             const T* b, int64_t b_size, T* out, void* workspace, const ParallelFor& pf) {
  RunPlanned(g, plan, a, a_size, b, b_size, out, workspace, pf);
}

#define LARGECONV_INSTANTIATE_RUN(T, NAME, TF_WORD)                                               \
  template void RunPass<T>(const ConvGeometry&, const PassPlan&, const T*, int64_t, const T*,     \
                           int64_t, T*, void*, const ParallelFor&);                               \
  template void RunPass<T>(const Conv3dGeometry&, const Pass3dPlan&, const T*, int64_t, const T*, \
                           int64_t, T*, void*, const ParallelFor&);
LARGECONV_FOR_EACH_DTYPE(LARGECONV_INSTANTIATE_RUN)
#undef LARGECONV_INSTANTIATE_RUN

}  // namespace largeconv
