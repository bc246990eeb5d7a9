// The choice of instruction-set level (isa.h) and the public kernel entries, which run the
// chosen level's. Compiled once, at the lowest level, like the rest of the core: it runs
// before anything of a higher level may.
#include "cc/core/cpu/isa.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "cc/core/common/dtypes.h"
#include "cc/core/cpu/direct.h"
#include "cc/core/cpu/fft.h"

namespace largeconv {
namespace {

// The levels this CPU (and its operating system, which must save the wider registers)
// runs; AVX, TensorFlow's floor, always.
std::vector<CpuIsa> DetectCpuIsas() {
  std::vector<CpuIsa> levels = {CpuIsa::kAvx};
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return levels;
  levels.push_back(CpuIsa::kAvx2);
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl")) {
    levels.push_back(CpuIsa::kAvx512);
  }
#endif
  return levels;
}

std::string Names(const std::vector<CpuIsa>& levels) {
  std::string s;
  for (CpuIsa l : levels) s += (s.empty() ? "" : ", ") + std::string(CpuIsaName(l));
  return s;
}

}  // namespace

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx:
      return "avx";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

CpuIsaChoice ChooseCpuIsa(const std::vector<CpuIsa>& available, const char* requested) {
  CpuIsaChoice c;
  c.available = available;
  c.level = CpuIsa::kAvx;  // the default: the one level whose FFT is bitwise across threads
  c.requested = requested ? requested : "";
  std::string want;
  for (char ch : c.requested) {
    if (!std::isspace(static_cast<unsigned char>(ch))) {
      want += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    }
  }
  if (want.empty()) return c;
  const std::string all = Names(std::vector<CpuIsa>(std::begin(kCpuIsas), std::end(kCpuIsas)));
  const std::string running = std::string("; running ") + CpuIsaName(c.level) + " instead";
  for (CpuIsa l : kCpuIsas) {
    if (want != CpuIsaName(l)) continue;
    if (std::find(available.begin(), available.end(), l) != available.end()) {
      c.level = l;
    } else {
      c.problem = "LARGECONV_ISA='" + c.requested + "' asks for a level this CPU lacks: it runs " +
                  Names(available) + " (the variable takes " + all + ")" + running;
    }
    return c;
  }
  c.problem = "LARGECONV_ISA='" + c.requested + "' is not an instruction-set level: it takes " +
              all + ", or is unset for avx" + running;
  return c;
}

const CpuIsaChoice& ActiveCpuIsa() {
  static const CpuIsaChoice choice = ChooseCpuIsa(DetectCpuIsas(), std::getenv("LARGECONV_ISA"));
  return choice;
}

// The chosen level's CALL (a kernel entry of isa.h and its arguments).
#define LARGECONV_RUN_LEVEL(CALL) \
  switch (ActiveCpuIsa().level) { \
    case CpuIsa::kAvx512:         \
      return isa_avx512::CALL;    \
    case CpuIsa::kAvx2:           \
      return isa_avx2::CALL;      \
    case CpuIsa::kAvx:            \
      break;                      \
  }                               \
  return isa_avx::CALL

template <typename T>
void DirectPass(const ConvGeometry& g, ConvPass pass, const T* a, const T* b, T* out,
                const ParallelFor& pf) {
  LARGECONV_RUN_LEVEL(DirectPass<T>(g, pass, a, b, out, pf));
}

template <typename T>
void DirectPass(const Conv3dGeometry& g, ConvPass pass, const T* a, const T* b, T* out,
                const ParallelFor& pf) {
  LARGECONV_RUN_LEVEL(DirectPass<T>(g, pass, a, b, out, pf));
}

template <typename T>
void FftPass(const ConvGeometry& g, ConvPass pass, const FftConfig& c, const T* a, const T* b,
             T* out, void* workspace, const ParallelFor& pf) {
  LARGECONV_RUN_LEVEL(FftPass<T>(g, pass, c, a, b, out, workspace, pf));
}

template <typename T>
void FftPass(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c, const T* a, const T* b,
             T* out, void* workspace, const ParallelFor& pf) {
  LARGECONV_RUN_LEVEL(FftPass<T>(g, pass, c, a, b, out, workspace, pf));
}

template <typename T>
bool AllFinite(const T* p, int64_t n, const ParallelFor& pf) {
  LARGECONV_RUN_LEVEL(AllFinite<T>(p, n, pf));
}

#undef LARGECONV_RUN_LEVEL

#define LARGECONV_INSTANTIATE_DIRECT(T, NAME, TF_WORD)                                 \
  template void DirectPass<T>(const ConvGeometry&, ConvPass, const T*, const T*, T*,   \
                              const ParallelFor&);                                     \
  template void DirectPass<T>(const Conv3dGeometry&, ConvPass, const T*, const T*, T*, \
                              const ParallelFor&);
LARGECONV_FOR_EACH_DTYPE(LARGECONV_INSTANTIATE_DIRECT)
#undef LARGECONV_INSTANTIATE_DIRECT

#define LARGECONV_INSTANTIATE_FFT(T, NAME, TF_WORD)                                             \
  template bool AllFinite<T>(const T*, int64_t, const ParallelFor&);                            \
  template void FftPass<T>(const ConvGeometry&, ConvPass, const FftConfig&, const T*, const T*, \
                           T*, void*, const ParallelFor&);                                      \
  template void FftPass<T>(const Conv3dGeometry&, ConvPass, const Fft3dConfig&, const T*,       \
                           const T*, T*, void*, const ParallelFor&);
LARGECONV_FOR_EACH_FLOAT_DTYPE(LARGECONV_INSTANTIATE_FFT)
#undef LARGECONV_INSTANTIATE_FFT

}  // namespace largeconv
