// The "parallel for" the caller hands to the core: TF passes its intra-op thread pool,
// the pybind11 module a small std::thread splitter. Work units must be independent.
#ifndef TF_LARGECONV_CORE_PARALLEL_H_
#define TF_LARGECONV_CORE_PARALLEL_H_

#include <cstdint>
#include <functional>

namespace largeconv {

// Calls fn(begin, end) over disjoint ranges covering [0, total). cost_per_unit is a rough
// count of operations per unit, a hint for how finely to split.
using ParallelFor = std::function<void(int64_t total, int64_t cost_per_unit,
                                       const std::function<void(int64_t, int64_t)>& fn)>;

// Runs everything on the calling thread.
inline void SerialFor(int64_t total, int64_t /*cost_per_unit*/,
                      const std::function<void(int64_t, int64_t)>& fn) {
  if (total > 0) fn(0, total);
}

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_PARALLEL_H_
