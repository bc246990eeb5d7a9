// The CPU's algorithms: the one list the CPU planner chooses from (cpu_planner.cc) and the
// op's runner runs from (conv.cc). Each descriptor holds everything about its algorithm
// (AlgorithmList, search.h): whether it can run a request, its cost, workspace and final
// configuration, and how it runs a planned pass.
#ifndef TF_LARGECONV_CORE_PLAN_CPU_ALGORITHMS_H_
#define TF_LARGECONV_CORE_PLAN_CPU_ALGORITHMS_H_

#include "cc/core/plan/cpu_direct.h"
#include "cc/core/plan/cpu_fft.h"
#include "cc/core/plan/cpu_tf.h"
#include "cc/core/plan/search.h"

namespace largeconv {

// Simplest first: the choice keeps the earlier of equally cheap algorithms, and the first
// (the direct kernels) runs every pass, including those another cannot take.
using CpuAlgorithms = AlgorithmList<DirectAlgorithm, FftAlgorithm, TfAlgorithm>;

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_PLAN_CPU_ALGORITHMS_H_
