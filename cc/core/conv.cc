// Pass dispatch between the FFT and direct kernels.
#include "cc/core/conv.h"

#include <algorithm>

#include "cc/core/direct.h"
#include "cc/core/dtypes.h"
#include "cc/core/fft.h"

namespace largeconv {

namespace {

// How an algorithm the op runs carries out a planned pass (of either geometry, G with its
// Plan): false when it cannot take these operands, and the direct kernels, which take any,
// run the pass instead.
template <typename T, class G, class Plan>
struct Runner {
  Algorithm algorithm;
  bool (*run)(const G& g, const Plan& plan, const T* a, int64_t a_size, const T* b, int64_t b_size,
              T* out, void* workspace, const ParallelFor& pf);
};

template <typename T, class G, class Plan>
bool RunDirect(const G& g, const Plan& plan, const T* a, int64_t, const T* b, int64_t, T* out,
               void*, const ParallelFor& pf) {
  DirectPass(g, plan.pass, a, b, out, pf);
  return true;
}

// The FFT kernels, for finite operands only (a transform would smear Inf/NaN over its
// tile). Integer types never get here: they are summed exactly, and no FFT kernel is
// instantiated for them.
template <typename T, class G, class Plan>
bool RunFft(const G& g, const Plan& plan, const T* a, int64_t a_size, const T* b, int64_t b_size,
            T* out, void* workspace, const ParallelFor& pf) {
  if constexpr (kIsInt<T>) {
    return false;
  } else {
    if (!AllFinite(a, a_size, pf) || !AllFinite(b, b_size, pf)) return false;
    FftPass(g, plan.pass, plan.fft, a, b, out, workspace, pf);
    return true;
  }
}

// TensorFlow's kernels (Algorithm::kTf) are not here: only the Python layer runs them.
template <typename T, class G, class Plan>
constexpr Runner<T, G, Plan> kRunners[] = {{Algorithm::kDirect, RunDirect<T, G, Plan>},
                                           {Algorithm::kFft, RunFft<T, G, Plan>}};

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
  RunDirect(g, plan, a, a_size, b, b_size, out, workspace, pf);
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
