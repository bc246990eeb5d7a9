// The GPU's algorithms: the one list the GPU planner chooses from (fft_plan.cc) and the
// device (fft.cu) and the host emulation (emulate.h) run from. Each descriptor holds
// everything about its algorithm (AlgorithmList, plan/search.h): its planning, defined in
// fft_plan.cc, and how it runs a planned pass with the platform's runner (the device's
// launches, or the emulation's host loops). TensorFlow's kernels (cuDNN) are not among
// them: a plan only reports their modelled cost, for the caller that can route the whole
// convolution there.
#ifndef TF_LARGECONV_CORE_CUDA_ALGORITHMS_H_
#define TF_LARGECONV_CORE_CUDA_ALGORITHMS_H_

#include <cstdint>
#include <string>
#include <tuple>

#include "cc/core/common/geometry.h"
#include "cc/core/common/status.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cuda/fft_pipeline.h"
#include "cc/core/cuda/fft_plan.h"
#include "cc/core/plan/search.h"

namespace largeconv {
namespace cuda {

// One request as the GPU's algorithms see it (Geometry: ConvGeometry or Conv3dGeometry).
template <class Geometry>
struct GpuProblem : PlanProblemOf<Geometry> {
  int real_bytes;
  const WorkBytesFn* work_bytes;  // null: no transform library
  const std::string& fft_unavailable;
  // The FFT's pricing: the size chosen, cuFFT's work area for it, and why none fits.
  bool found = false;
  GpuFftConfig best{};
  int64_t work = 0;
  int64_t min_bytes = -1;
  Status error{};
};

// Runs are inlined into their caller (RunCudaPass, EmulateCudaPass), so that the direct
// kernels' driver is called from the launch functions only (test_cuda_emulation reads the
// calls from the machine code).
#define LC_RUN_INLINE __attribute__((always_inline)) inline

// A GPU descriptor's planning (plan/search.h), for either geometry: each descriptor's own,
// defined in fft_plan.cc.
template <class Descriptor>
struct GpuPlanning {
  template <class G>
  static Status CanRun(const GpuProblem<G>& pb);
  template <class G>
  static double Cost(GpuProblem<G>& pb, CudaPlan* p);
  template <class G>
  static int64_t WorkspaceBytes(const GpuProblem<G>& pb, const CudaPlan& p);
  template <class G>
  static Status Finish(GpuProblem<G>& pb, CudaPlan* p);
};

// The direct tile kernels: run every pass.
struct GpuDirectAlgorithm : GpuPlanning<GpuDirectAlgorithm> {
  static constexpr Algorithm kAlgorithm = kGpuDirect;
  static constexpr bool kNeedsProducts = false;

  template <typename T, class G, class Runner>
  LC_RUN_INLINE static void Run(const G& g, const CudaPlan& plan, const T* a, const T* b, T* out,
                                char* workspace, Runner& run) {
    run.Direct(g, plan.pass, plan.direct, a, b, out, workspace, nullptr);
  }
};

// The FFT path (fft_pipeline.h): needs a transform library, except on a pass without
// products (which the direct kernels run).
struct GpuFftAlgorithm : GpuPlanning<GpuFftAlgorithm> {
  static constexpr Algorithm kAlgorithm = kGpuFft;
  static constexpr bool kNeedsProducts = true;

  template <typename T, class G, class Runner>
  LC_RUN_INLINE static void Run(const G& g, const CudaPlan& plan, const T* a, const T* b, T* out,
                                char* workspace, Runner& run) {
    RunFftPass(g, plan, a, b, out, workspace, run);
  }
};

// Simplest first (the choice keeps the earlier of equally cheap algorithms).
using GpuAlgorithms = AlgorithmList<GpuDirectAlgorithm, GpuFftAlgorithm>;
static_assert(GpuAlgorithms::size + 1 <= AlgorithmCosts::kCapacity,
              "a plan's costs hold every GPU algorithm and cuDNN's");

// Runs a plan (of a pass with products) through its algorithm's Run in the list, the list's
// first (the direct kernels) where it names none of them.
template <typename T, class G, class Runner, class... A>
LC_RUN_INLINE void RunListed(AlgorithmList<A...>, const G& g, const CudaPlan& plan, const T* a,
                             const T* b, T* out, char* workspace, Runner& run) {
  const bool ran =
      ((A::kAlgorithm == plan.algorithm && (A::Run(g, plan, a, b, out, workspace, run), true)) ||
       ...);
  using First = std::tuple_element_t<0, std::tuple<A...>>;
  if (!ran) First::Run(g, plan, a, b, out, workspace, run);
}

}  // namespace cuda
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CUDA_ALGORITHMS_H_
