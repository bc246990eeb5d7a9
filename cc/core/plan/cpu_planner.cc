// The CPU planner (plan.h): one pass of either geometry, planned over the CPU's algorithms
// (cpu_algorithms.h) by the one choice (search.h).
#include <algorithm>
#include <cstdint>

#include "cc/core/plan/cpu_algorithms.h"
#include "cc/core/plan/cpu_problem.h"
#include "cc/core/plan/plan.h"
#include "cc/core/plan/search.h"

namespace largeconv {
namespace {

template <class Pb, class Geometry>
Status PlanCpuPass(const Geometry& g, ConvPass pass, const PlanRequest& req,
                   typename Pb::Plan* plan) {
  const int64_t limit = req.workspace_limit < 0 ? kDefaultWorkspaceLimit : req.workspace_limit;
  Pb pb{{g, pass, req.algorithm, limit}, req, std::max<int64_t>(1, req.threads)};
  typename Pb::Plan p;
  p.pass = pass;
  p.flops = 2.0 * g.macs();
  LC_RETURN_IF_ERROR(PlanWithAlgorithms<CpuAlgorithms>("on the CPU", pb, &p));
  *plan = p;
  return OkStatus();
}

}  // namespace

Status PlanPass(const ConvGeometry& g, ConvPass pass, const PlanRequest& req, PassPlan* plan) {
  return PlanCpuPass<CpuProblem>(g, pass, req, plan);
}

Status PlanPass(const Conv3dGeometry& g, ConvPass pass, const PlanRequest& req, Pass3dPlan* plan) {
  return PlanCpuPass<Cpu3dProblem>(g, pass, req, plan);
}

}  // namespace largeconv
