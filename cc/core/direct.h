// Cache-tiled direct convolution on the CPU: forward, backprop-input, backprop-filter.
// No im2col: each pass keeps an output tile and a channel block in a fixed-size stack
// accumulator, so the extra memory is independent of batch, image and filter size.
#ifndef TF_LARGECONV_CORE_DIRECT_H_
#define TF_LARGECONV_CORE_DIRECT_H_

#include "cc/core/geometry.h"
#include "cc/core/parallel.h"

namespace largeconv {

// Layouts: input/output/out_backprop in g.data_format; filter is [KH, KW, C_in/groups, C_out].
// Every output element is written (zeros where nothing contributes). Results do not depend
// on how `pf` splits the work: each element is summed by one thread in a fixed order.
template <typename T>
void DirectForward(const ConvGeometry& g, const T* input, const T* filter, T* output,
                   const ParallelFor& pf);

template <typename T>
void DirectBackpropInput(const ConvGeometry& g, const T* filter, const T* out_backprop,
                         T* in_backprop, const ParallelFor& pf);

template <typename T>
void DirectBackpropFilter(const ConvGeometry& g, const T* input, const T* out_backprop,
                          T* filter_backprop, const ParallelFor& pf);

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_DIRECT_H_
