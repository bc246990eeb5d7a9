// Includes Eigen's dense matrix products (the headers TensorFlow's wheel ships, reached
// through the build's own include folder, which holds nothing else of TensorFlow) under a
// private namespace name, as ducc.h does for DUCC: TensorFlow carries its own Eigen
// instantiations, and each instruction-set level of the kernels (cpu/isa.h) compiles its
// own copy, whose name carries the level (LARGECONV_ISA_NS), so no level's templates are
// merged with another's or bound to TensorFlow's. Eigen runs single-threaded here: the
// kernels call it inside their own parallel loop.
#ifndef TF_LARGECONV_CORE_COMMON_EIGEN_H_
#define TF_LARGECONV_CORE_COMMON_EIGEN_H_

#ifndef EIGEN_DONT_PARALLELIZE
#define EIGEN_DONT_PARALLELIZE
#endif
#ifdef LARGECONV_ISA_NS
#define LARGECONV_EIGEN_NAME_OF(level) LARGECONV_EIGEN_NAME_JOIN(level)
#define LARGECONV_EIGEN_NAME_JOIN(level) tf_largeconv_eigen_##level
#define Eigen LARGECONV_EIGEN_NAME_OF(LARGECONV_ISA_NS)
#else
#define Eigen tf_largeconv_eigen
#endif
// GCC 12 warns that the placeholder of _mm512_undefined_pd (GCC's AVX-512 header) "may be
// used uninitialized" wherever Eigen's AVX-512 packet transposes are inlined (its packing of
// complex<double> products): a false positive of the intrinsic, silenced for Eigen's
// headers alone.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>  // IWYU pragma: export
#pragma GCC diagnostic pop

#endif  // TF_LARGECONV_CORE_COMMON_EIGEN_H_
