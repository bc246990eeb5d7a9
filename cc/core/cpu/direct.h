// Cache-tiled direct convolution on the CPU: forward, backprop-input, backprop-filter.
// No im2col: each pass keeps an output tile and a channel block in a fixed-size stack
// accumulator, so the extra memory is independent of batch, image and filter size.
#ifndef TF_LARGECONV_CORE_CPU_DIRECT_H_
#define TF_LARGECONV_CORE_CPU_DIRECT_H_

#include "cc/core/common/geometry.h"
#include "cc/core/common/parallel.h"
#include "cc/core/common/vocabulary.h"

namespace largeconv {

// Runs `pass` (operands in its order, RolesOf: forward (input, filter) -> output,
// backprop-input (filter, out_backprop) -> in_backprop, backprop-filter (input,
// out_backprop) -> filter_backprop). Layouts: images in g.data_format; the filter is
// [KH, KW, C_in/groups, C_out]. Every result element is written (zeros where nothing
// contributes). Results do not depend on how `pf` splits the work: each element is summed
// by one thread in a fixed order.
template <typename T>
void DirectPass(const ConvGeometry& g, ConvPass pass, const T* a, const T* b, T* out,
                const ParallelFor& pf);

// The same for three spatial dimensions (direct3d.cc): the filter is [KD, KH, KW,
// C_in/groups, C_out].
template <typename T>
void DirectPass(const Conv3dGeometry& g, ConvPass pass, const T* a, const T* b, T* out,
                const ParallelFor& pf);

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CPU_DIRECT_H_
