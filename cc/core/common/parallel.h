// The "parallel for" the caller hands to the core: TF passes its intra-op thread pool,
// the pybind11 module a small std::thread splitter. Work units must be independent.
#ifndef TF_LARGECONV_CORE_COMMON_PARALLEL_H_
#define TF_LARGECONV_CORE_COMMON_PARALLEL_H_

#include <cstdint>
#include <functional>
#include <vector>

namespace largeconv {

// Calls fn(begin, end) over disjoint ranges covering [0, total). cost_per_unit is a rough
// count of operations per unit, a hint for how finely to split.
using ParallelFor = std::function<void(int64_t total, int64_t cost_per_unit,
                                       const std::function<void(int64_t, int64_t)>& fn)>;

// True when chunk_ok(p + lo, count) holds for every chunk of p[0, n), the chunks evaluated
// in parallel.
template <typename T, typename ChunkOk>
bool ParallelAll(const T* p, int64_t n, ChunkOk chunk_ok, const ParallelFor& pf) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<char> ok(static_cast<size_t>(chunks), 1);
  pf(chunks, kChunk, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      const int64_t lo = c * kChunk, hi = lo + kChunk < n ? lo + kChunk : n;
      ok[static_cast<size_t>(c)] = chunk_ok(p + lo, hi - lo);
    }
  });
  for (char v : ok) {
    if (!v) return false;
  }
  return true;
}

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_COMMON_PARALLEL_H_
