// Pass dispatch between the FFT and direct kernels.
#include "cc/core/conv.h"

#include <algorithm>

#include "cc/core/direct.h"
#include "cc/core/dtypes.h"
#include "cc/core/fft.h"

namespace largeconv {

namespace {

// Runs the pass by transforms when the plan says so and every operand is finite; false
// when the direct kernels must run instead. Integer types never get here: they are summed
// exactly, and no FFT kernel is instantiated for them.
template <typename T>
bool RunFft(const ConvGeometry& g, const PassPlan& plan, const T* a, int64_t a_size, const T* b,
            int64_t b_size, T* out, void* workspace, const ParallelFor& pf) {
  if constexpr (kIsInt<T>) {
    return false;
  } else {
    if (plan.algorithm != Algorithm::kFft || !AllFinite(a, a_size, pf) ||
        !AllFinite(b, b_size, pf)) {
      return false;
    }
    switch (plan.pass) {
      case ConvPass::kForward:
        FftForward(g, plan.fft, a, b, out, workspace, pf);
        break;
      case ConvPass::kBackpropInput:
        FftBackpropInput(g, plan.fft, a, b, out, workspace, pf);
        break;
      case ConvPass::kBackpropFilter:
        FftBackpropFilter(g, plan.fft, a, b, out, workspace, pf);
        break;
    }
    return true;
  }
}

}  // namespace

template <typename T>
void RunPass(const ConvGeometry& g, const PassPlan& plan, const T* a, int64_t a_size, const T* b,
             int64_t b_size, T* out, void* workspace, const ParallelFor& pf) {
  if (g.no_products()) {  // zeros, or nothing at all; what the kernels would write
    std::fill_n(out, g.elements(RolesOf(plan.pass).out), T{});
    return;
  }
  if (RunFft(g, plan, a, a_size, b, b_size, out, workspace, pf)) return;
  switch (plan.pass) {
    case ConvPass::kForward:
      DirectForward(g, a, b, out, pf);
      break;
    case ConvPass::kBackpropInput:
      DirectBackpropInput(g, a, b, out, pf);
      break;
    case ConvPass::kBackpropFilter:
      DirectBackpropFilter(g, a, b, out, pf);
      break;
  }
}

#define LARGECONV_INSTANTIATE_RUN(T, NAME, TF_WORD)                                           \
  template void RunPass<T>(const ConvGeometry&, const PassPlan&, const T*, int64_t, const T*, \
                           int64_t, T*, void*, const ParallelFor&);
LARGECONV_FOR_EACH_DTYPE(LARGECONV_INSTANTIATE_RUN)
#undef LARGECONV_INSTANTIATE_RUN

}  // namespace largeconv
