// Runs one planned pass: the FFT kernels when the plan says so and every input is finite
// (a transform would smear Inf/NaN over its tile), the direct kernels otherwise. The one
// dispatch both the TF op and the pybind11 module use.
#ifndef TF_LARGECONV_CORE_CONV_H_
#define TF_LARGECONV_CORE_CONV_H_

#include <cstdint>

#include "cc/core/common/geometry.h"
#include "cc/core/common/parallel.h"
#include "cc/core/plan/plan.h"

namespace largeconv {

// Operands in each pass's order: forward (input, filter) -> output; backprop-input
// (filter, out_backprop) -> in_backprop; backprop-filter (input, out_backprop) ->
// filter_backprop. `workspace` holds plan.workspace_bytes (64-byte aligned).
template <typename T>
void RunPass(const ConvGeometry& g, const PassPlan& plan, const T* a, int64_t a_size, const T* b,
             int64_t b_size, T* out, void* workspace, const ParallelFor& pf);

// The same dispatch for three spatial dimensions.
template <typename T>
void RunPass(const Conv3dGeometry& g, const Pass3dPlan& plan, const T* a, int64_t a_size,
             const T* b, int64_t b_size, T* out, void* workspace, const ParallelFor& pf);

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CONV_H_
