// TensorFlow's own kernels as a CPU algorithm (cpu_algorithms.h): planned only where the
// caller allows them (the Python layer, which runs them), priced by their fit
// (cost_model.h). The op never runs them.
#ifndef TF_LARGECONV_CORE_PLAN_CPU_TF_H_
#define TF_LARGECONV_CORE_PLAN_CPU_TF_H_

#include <cstdint>

#include "cc/core/common/parallel.h"
#include "cc/core/common/status.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/plan/cost_model.h"

namespace largeconv {

struct TfAlgorithm {
  static constexpr Algorithm kAlgorithm{"tf"};
  static constexpr bool kNeedsProducts = false;

  template <class Pb>
  static Status CanRun(const Pb& pb) {
    if (pb.req.allow_tf) return OkStatus();
    return InvalidArgument("algorithm='tf' is not available for this configuration");
  }
  template <class Pb>
  static double Cost(Pb& pb, typename Pb::Plan*) {
    return TfSeconds(pb.g, pb.pass);
  }
  template <class Pb>
  static int64_t WorkspaceBytes(const Pb& pb, const typename Pb::Plan&) {
    return TfBytesOf(pb.g, pb.threads, pb.req.real_bytes);
  }
  template <class Pb>
  static Status Finish(Pb& pb, typename Pb::Plan* p) {
    p->workspace_bytes = WorkspaceBytes(pb, *p);
    return OkStatus();
  }

  // Only the Python layer runs TensorFlow's kernels: a plan of them that reaches the core
  // runs the direct kernels.
  template <typename T, class G, class Plan>
  static bool Run(const G&, const Plan&, const T*, int64_t, const T*, int64_t, T*, void*,
                  const ParallelFor&) {
    return false;
  }
};

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_PLAN_CPU_TF_H_
