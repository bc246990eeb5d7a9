// One planning request as the CPU's algorithms (cpu_algorithms.h) see it.
#ifndef TF_LARGECONV_CORE_PLAN_CPU_PROBLEM_H_
#define TF_LARGECONV_CORE_PLAN_CPU_PROBLEM_H_

#include <cstdint>

#include "cc/core/common/geometry.h"
#include "cc/core/cpu/fft.h"
#include "cc/core/plan/plan.h"
#include "cc/core/plan/search.h"

namespace largeconv {

// One request as the CPU's algorithms see it, for either geometry (Config: its FFT's
// configuration).
template <class Geometry, class Config>
struct CpuProblemOf : PlanProblemOf<Geometry> {
  using Plan = PassPlanOf<Config>;
  const PlanRequest& req;
  int64_t threads;
  FftSearch<Config> fft{};  // the FFT's best transform size, once priced
};
using CpuProblem = CpuProblemOf<ConvGeometry, FftConfig>;
using Cpu3dProblem = CpuProblemOf<Conv3dGeometry, Fft3dConfig>;

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_PLAN_CPU_PROBLEM_H_
