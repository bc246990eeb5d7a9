// The direct kernels as a CPU algorithm (cpu_algorithms.h): they run every pass of every
// dtype, in no workspace, priced by their fitted rates (cost_model.h).
#ifndef TF_LARGECONV_CORE_PLAN_CPU_DIRECT_H_
#define TF_LARGECONV_CORE_PLAN_CPU_DIRECT_H_

#include <cstdint>

#include "cc/core/common/parallel.h"
#include "cc/core/common/status.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cpu/direct.h"
#include "cc/core/plan/cost_model.h"

namespace largeconv {

struct DirectAlgorithm {
  static constexpr Algorithm kAlgorithm{"direct"};
  static constexpr bool kNeedsProducts = false;

  template <class Pb>
  static Status CanRun(const Pb&) {
    return OkStatus();
  }
  template <class Pb>
  static double Cost(Pb& pb, typename Pb::Plan* p) {
    return DirectSeconds(pb.g, pb.pass, p->flops);
  }
  template <class Pb>
  static int64_t WorkspaceBytes(const Pb&, const typename Pb::Plan&) {
    return 0;
  }
  template <class Pb>
  static Status Finish(Pb&, typename Pb::Plan*) {
    return OkStatus();
  }

  // Runs a planned pass of either geometry (G, with its Plan) on operands in the pass's
  // order; false when it cannot take these operands (the direct kernels then run it).
  template <typename T, class G, class Plan>
  static bool Run(const G& g, const Plan& plan, const T* a, int64_t, const T* b, int64_t, T* out,
                  void*, const ParallelFor& pf) {
    DirectPass(g, plan.pass, a, b, out, pf);
    return true;
  }
};

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_PLAN_CPU_DIRECT_H_
