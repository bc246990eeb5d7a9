// Host memory hints for the CPU kernels' workspaces and outputs.
#ifndef TF_LARGECONV_CORE_MEMORY_H_
#define TF_LARGECONV_CORE_MEMORY_H_

#include <cstdint>

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

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_MEMORY_H_
