// LC_HD marks functions that run on both the host and a CUDA device. Under a host compiler
// it expands to nothing, so the same code also builds into the CPU libraries (and the host
// emulation of the CUDA tile kernels).
#ifndef TF_LARGECONV_CORE_COMMON_HD_H_
#define TF_LARGECONV_CORE_COMMON_HD_H_

#if defined(__CUDACC__)
#define LC_HD __host__ __device__
#else
#define LC_HD
#endif

#endif  // TF_LARGECONV_CORE_COMMON_HD_H_
