// Pass dispatch between the FFT and direct kernels.
#include "cc/core/conv.h"

#include "cc/core/direct.h"
#include "cc/core/dtypes.h"
#include "cc/core/fft.h"

namespace largeconv {

template <typename T>
void RunPass(const ConvGeometry& g, const PassPlan& plan, const T* a, int64_t a_size, const T* b,
             int64_t b_size, T* out, void* workspace, const ParallelFor& pf) {
  const bool fft =
      plan.algorithm == Algorithm::kFft && AllFinite(a, a_size, pf) && AllFinite(b, b_size, pf);
  switch (plan.pass) {
    case ConvPass::kForward:
      if (fft) {
        FftForward(g, plan.fft, a, b, out, workspace, pf);
      } else {
        DirectForward(g, a, b, out, pf);
      }
      break;
    case ConvPass::kBackpropInput:
      if (fft) {
        FftBackpropInput(g, plan.fft, a, b, out, workspace, pf);
      } else {
        DirectBackpropInput(g, a, b, out, pf);
      }
      break;
    case ConvPass::kBackpropFilter:
      if (fft) {
        FftBackpropFilter(g, plan.fft, a, b, out, workspace, pf);
      } else {
        DirectBackpropFilter(g, a, b, out, pf);
      }
      break;
  }
}

#define LARGECONV_INSTANTIATE_RUN(T, NAME, TF_WORD)                                           \
  template void RunPass<T>(const ConvGeometry&, const PassPlan&, const T*, int64_t, const T*, \
                           int64_t, T*, void*, const ParallelFor&);
LARGECONV_FOR_EACH_DTYPE(LARGECONV_INSTANTIATE_RUN)
#undef LARGECONV_INSTANTIATE_RUN

}  // namespace largeconv
