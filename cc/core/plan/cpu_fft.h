// The FFT kernels as a CPU algorithm (cpu_algorithms.h): floating types only; the search
// over transform sizes, channel blocks and slots under the workspace limit (cpu_fft.cc),
// priced by the cost model (cost_model.h); run where every operand is finite.
#ifndef TF_LARGECONV_CORE_PLAN_CPU_FFT_H_
#define TF_LARGECONV_CORE_PLAN_CPU_FFT_H_

#include <cstdint>

#include "cc/core/common/dtypes.h"
#include "cc/core/common/parallel.h"
#include "cc/core/common/status.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cpu/fft.h"
#include "cc/core/plan/cpu_problem.h"

namespace largeconv {

struct FftAlgorithm {
  static constexpr Algorithm kAlgorithm{"fft"};
  static constexpr bool kNeedsProducts = true;

  // Floating types only (integer types are summed exactly).
  template <class Pb>
  static Status CanRun(const Pb& pb) {
    if (!pb.req.direct_only) return OkStatus();
    return InvalidArgument(
        "algorithm='fft' cannot compute integer dtypes exactly: use 'direct' or 'auto'");
  }
  // The cheapest transform size that fits, left in pb.fft (cpu_fft.cc).
  static double Cost(CpuProblem& pb, PassPlan* p);
  static double Cost(Cpu3dProblem& pb, Pass3dPlan* p);
  template <class Pb>
  static int64_t WorkspaceBytes(const Pb& pb, const typename Pb::Plan&) {
    return FftWorkspaceBytes(pb.g, pb.pass, pb.fft.config, pb.req.real_bytes);
  }
  // Its blocks and slots for the caller's threads.
  static Status Finish(CpuProblem& pb, PassPlan* p);
  static Status Finish(Cpu3dProblem& pb, Pass3dPlan* p);

  // The FFT kernels, for finite operands only (a transform would smear Inf/NaN over its
  // tile). Integer types never get here: they are summed exactly, and no FFT kernel is
  // instantiated for them.
  template <typename T, class G, class Plan>
  static bool Run(const G& g, const Plan& plan, const T* a, int64_t a_size, const T* b,
                  int64_t b_size, T* out, void* workspace, const ParallelFor& pf) {
    if constexpr (kIsInt<T>) {
      return false;
    } else {
      if (!AllFinite(a, a_size, pf) || !AllFinite(b, b_size, pf)) return false;
      FftPass(g, plan.pass, plan.fft, a, b, out, workspace, pf);
      return true;
    }
  }
};

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_PLAN_CPU_FFT_H_
