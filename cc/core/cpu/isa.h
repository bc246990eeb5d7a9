// The CPU kernels' instruction-set levels. The hot translation units (direct.cc,
// direct3d.cc, fft.cc, fft3d.cc and DUCC's transforms through ducc_threading.cc) are
// compiled once per level, each time with the level's -m flags and LARGECONV_ISA_NS naming
// the level's namespace (the Makefile's ISA_LEVELS), so that nothing a level compiles,
// DUCC's templates included, is merged with another level's copy. The public entries
// (DirectPass, FftPass, AllFinite in direct.h and fft.h) are defined once, in isa.cc,
// and run the level chosen on first use: AVX, or the level LARGECONV_ISA names where the CPU
// runs it. Every level gives the same bits on any number of threads (the Makefile builds
// the FFT files with nothing fused); the wider levels are asked for, not taken by default,
// until their speed is measured against AVX's.
#ifndef TF_LARGECONV_CORE_CPU_ISA_H_
#define TF_LARGECONV_CORE_CPU_ISA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cc/core/common/geometry.h"
#include "cc/core/common/parallel.h"
#include "cc/core/common/vocabulary.h"

// Inside a level's compile, what follows LARGECONV_ISA_BEGIN up to LARGECONV_ISA_END lies in
// namespace largeconv::<level>; elsewhere (the planner's share of fft.cc and fft3d.cc)
// directly in largeconv.
#ifdef LARGECONV_ISA_NS
#define LARGECONV_ISA_BEGIN namespace LARGECONV_ISA_NS {
#define LARGECONV_ISA_END }
#else
#define LARGECONV_ISA_BEGIN
#define LARGECONV_ISA_END
#endif

namespace largeconv {

// The levels, lowest first. kAvx is TensorFlow's own floor; kAvx2 adds AVX2 and FMA;
// kAvx512 adds AVX-512 F, DQ, BW and VL.
enum class CpuIsa : int { kAvx = 0, kAvx2 = 1, kAvx512 = 2 };
inline constexpr CpuIsa kCpuIsas[] = {CpuIsa::kAvx, CpuIsa::kAvx2, CpuIsa::kAvx512};

// "avx", "avx2", "avx512": the names LARGECONV_ISA takes and info() reports.
const char* CpuIsaName(CpuIsa isa);

// The level the kernels run at, and why: chosen on first use and fixed for the process.
struct CpuIsaChoice {
  CpuIsa level = CpuIsa::kAvx;
  std::vector<CpuIsa> available;  // what this CPU runs, lowest first
  std::string requested;          // LARGECONV_ISA as set ("" where unset)
  std::string problem;            // why the request was not followed ("" where it was, or unset)
};
const CpuIsaChoice& ActiveCpuIsa();

// The choice for a CPU that runs `available` and a LARGECONV_ISA of `requested` (null where
// unset): AVX, or the requested level where it is available; a request of a level the CPU
// lacks, or of no level, runs AVX and says why.
CpuIsaChoice ChooseCpuIsa(const std::vector<CpuIsa>& available, const char* requested);

// One level's kernels, declared in the level's namespace (isa.cc calls them; the level's
// direct.cc, direct3d.cc, fft.cc and fft3d.cc define and instantiate them).
struct FftConfig;
struct Fft3dConfig;
#define LARGECONV_DECLARE_ISA_KERNELS(NS)                                                        \
  namespace NS {                                                                                 \
  template <typename T>                                                                          \
  void DirectPass(const ConvGeometry& g, ConvPass pass, const T* a, const T* b, T* out,          \
                  const ParallelFor& pf);                                                        \
  template <typename T>                                                                          \
  void DirectPass(const Conv3dGeometry& g, ConvPass pass, const T* a, const T* b, T* out,        \
                  const ParallelFor& pf);                                                        \
  template <typename T>                                                                          \
  void FftPass(const ConvGeometry& g, ConvPass pass, const FftConfig& c, const T* a, const T* b, \
               T* out, void* workspace, const ParallelFor& pf);                                  \
  template <typename T>                                                                          \
  void FftPass(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c, const T* a,         \
               const T* b, T* out, void* workspace, const ParallelFor& pf);                      \
  template <typename T>                                                                          \
  bool AllFinite(const T* p, int64_t n, const ParallelFor& pf);                                  \
  }
LARGECONV_DECLARE_ISA_KERNELS(isa_avx)
LARGECONV_DECLARE_ISA_KERNELS(isa_avx2)
LARGECONV_DECLARE_ISA_KERNELS(isa_avx512)
#undef LARGECONV_DECLARE_ISA_KERNELS

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CPU_ISA_H_
