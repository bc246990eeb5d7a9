// Includes DUCC0's FFT headers (shipped inside the TensorFlow wheel) under a private
// namespace name. TensorFlow carries its own DUCC instantiations; renaming keeps our
// template instances, plan caches and scheduler hooks from binding to TF's at load time.
// DUCC is header-only, so each instruction-set level of the kernels (cpu/isa.h) compiles
// its own copy: there the name also carries the level (LARGECONV_ISA_NS), so no level's
// templates are merged with another's.
#ifndef TF_LARGECONV_CORE_COMMON_DUCC_H_
#define TF_LARGECONV_CORE_COMMON_DUCC_H_

#ifdef LARGECONV_ISA_NS
#define LARGECONV_DUCC_NAME_OF(level) LARGECONV_DUCC_NAME_JOIN(level)
#define LARGECONV_DUCC_NAME_JOIN(level) tf_largeconv_ducc0_##level
#define ducc0 LARGECONV_DUCC_NAME_OF(LARGECONV_ISA_NS)
#else
#define ducc0 tf_largeconv_ducc0
#endif
#include "ducc0/fft/fftnd_impl.h"   // IWYU pragma: export
#include "ducc0/infra/threading.h"  // IWYU pragma: export

#endif  // TF_LARGECONV_CORE_COMMON_DUCC_H_
