// Host memory hints for the CPU kernels' workspaces and outputs, and the budgets of what
// they keep between calls.
#ifndef TF_LARGECONV_CORE_COMMON_MEMORY_H_
#define TF_LARGECONV_CORE_COMMON_MEMORY_H_

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace largeconv {

// Asks the kernel to back the whole 2 MiB pages inside [data, data + bytes) with huge
// pages where transparent huge pages are in "madvise" mode. A workspace or output of tens
// of MiB is mapped fresh by the allocator on every call: with 4 KiB pages each call takes
// one fault per page, and the workspace's spectra, streamed many times per pass, miss the
// TLB every 4 KiB. The hint changes no value; where it is refused (or the range holds no
// whole huge page) nothing happens.
inline void AdviseHugePages(void* data, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + kHuge - 1) & ~(kHuge - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + uintptr_t(bytes)) & ~(kHuge - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

// A budget in bytes for memory held between calls, from environment variable `name` in
// MiB (read on every call): `default_mib` where unset or empty, 0 (off) where 0, negative
// or unreadable.
inline int64_t BudgetFromEnvironment(const char* name, int64_t default_mib) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return default_mib << 20;
  char* end = nullptr;
  const double mib = std::strtod(v, &end);
  if (end == v || !(mib > 0)) return 0;
  return static_cast<int64_t>(std::min(mib, 1e9) * (1 << 20));
}

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_COMMON_MEMORY_H_
