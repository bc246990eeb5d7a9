// The CPU's algorithms: the one list of the project's algorithms. The CPU planner chooses
// from it (cpu_planner.cc), the op's runner runs from it (conv.cc), a request may name any
// of them (ParseAlgorithm), plans report each one's cost, and the Python modules export
// their names as ALGORITHMS. Each descriptor holds everything about its algorithm
// (AlgorithmList, search.h): its name, whether it can run a request, its cost, workspace
// and final configuration, and how it runs a planned pass.
#ifndef TF_LARGECONV_CORE_PLAN_CPU_ALGORITHMS_H_
#define TF_LARGECONV_CORE_PLAN_CPU_ALGORITHMS_H_

#include <array>
#include <string>

#include "cc/core/common/status.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/plan/cpu_direct.h"
#include "cc/core/plan/cpu_fft.h"
#include "cc/core/plan/cpu_tf.h"
#include "cc/core/plan/search.h"

namespace largeconv {

// Simplest first: the choice keeps the earlier of equally cheap algorithms, and the first
// (the direct kernels) runs every pass, including those another cannot take.
using CpuAlgorithms = AlgorithmList<DirectAlgorithm, FftAlgorithm, TfAlgorithm>;

// What a request may name: 'auto', then every algorithm of the list.
template <class... A>
constexpr std::array<Algorithm, 1 + sizeof...(A)> RequestableOf(AlgorithmList<A...>) {
  return {kAutoAlgorithm, A::kAlgorithm...};
}
inline constexpr auto kAlgorithms = RequestableOf(CpuAlgorithms{});

// Whether no two of `algorithms` share a name.
template <size_t N>
constexpr bool DistinctNames(const std::array<Algorithm, N>& algorithms) {
  for (size_t i = 0; i < N; ++i) {
    for (size_t j = i + 1; j < N; ++j) {
      if (algorithms[i] == algorithms[j]) return false;
    }
  }
  return true;
}
static_assert(DistinctNames(kAlgorithms), "each algorithm has a name of its own, not 'auto'");

// Sets *out to the listed algorithm `s` names.
inline Status ParseAlgorithm(const std::string& s, Algorithm* out) {
  for (Algorithm a : kAlgorithms) {
    if (s == a.name()) {
      *out = a;
      return OkStatus();
    }
  }
  return InvalidArgument("algorithm must be " + AlgorithmChoices(kAlgorithms) + ", got '" + s +
                         "'");
}

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_PLAN_CPU_ALGORITHMS_H_
