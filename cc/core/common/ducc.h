// Includes DUCC0's FFT headers (shipped inside the TensorFlow wheel) under a private
// namespace name. TensorFlow carries its own DUCC instantiations; renaming keeps our
// template instances, plan caches and scheduler hooks from binding to TF's at load time.
#ifndef TF_LARGECONV_CORE_COMMON_DUCC_H_
#define TF_LARGECONV_CORE_COMMON_DUCC_H_

#define ducc0 tf_largeconv_ducc0
#include "ducc0/fft/fftnd_impl.h"   // IWYU pragma: export
#include "ducc0/infra/threading.h"  // IWYU pragma: export

#endif  // TF_LARGECONV_CORE_COMMON_DUCC_H_
