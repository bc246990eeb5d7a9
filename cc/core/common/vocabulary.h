// The words every layer of the project shares, on the host and on a CUDA device: the passes
// of a convolution and the role each of its three tensors plays in them, the algorithms,
// and the integer helpers of index arithmetic. Nothing here knows about TensorFlow, CUDA,
// FFTs or planning, so any file can name a pass without pulling those in.
#ifndef TF_LARGECONV_CORE_COMMON_VOCABULARY_H_
#define TF_LARGECONV_CORE_COMMON_VOCABULARY_H_

#include <cstdint>
#include <iterator>
#include <string>

#include "cc/core/common/hd.h"

namespace largeconv {

// --- Passes and operand roles ----------------------------------------------------------

// The three tensors of a convolution: input x, filter w ([KH, KW, C_in / groups, C_out])
// and output y. A gradient has the shape of the tensor it is the gradient of.
enum class ConvTensor { kInput, kFilter, kOutput };

enum class ConvPass { kForward, kBackpropInput, kBackpropFilter };
constexpr ConvPass kPasses[] = {ConvPass::kForward, ConvPass::kBackpropInput,
                                ConvPass::kBackpropFilter};

// Which tensors a pass reads (operands a and b, in the order every kernel takes them) and
// which it writes:
//   forward          (x, w)  -> y
//   backprop-input   (w, dy) -> dx
//   backprop-filter  (x, dy) -> dw
struct PassRoles {
  ConvTensor a, b, out;
};
LC_HD constexpr PassRoles RolesOf(ConvPass p) {
  return p == ConvPass::kForward
             ? PassRoles{ConvTensor::kInput, ConvTensor::kFilter, ConvTensor::kOutput}
         : p == ConvPass::kBackpropInput
             ? PassRoles{ConvTensor::kFilter, ConvTensor::kOutput, ConvTensor::kInput}
             : PassRoles{ConvTensor::kInput, ConvTensor::kOutput, ConvTensor::kFilter};
}

// The two image-shaped tensors of a pass as its correlation sees them: `src`, the one it
// reads tiles of, and `dst`, the one whose channels it produces (for a pass that writes the
// filter, the one it pairs `src` with):
//   forward          input  -> output
//   backprop-input   output -> input
//   backprop-filter  input  x  output
struct PassImages {
  ConvTensor src, dst;
};
LC_HD constexpr PassImages ImagesOf(ConvPass p) {
  return {RolesOf(p).a == ConvTensor::kFilter ? RolesOf(p).b : RolesOf(p).a,
          RolesOf(p).out == ConvTensor::kFilter ? RolesOf(p).b : RolesOf(p).out};
}
// Whether a pass writes the filter, a sum over every image and position, rather than an
// image: the planners size and price such passes by channel pairs instead of by tiles.
LC_HD constexpr bool WritesFilter(ConvPass p) { return RolesOf(p).out == ConvTensor::kFilter; }

// The pass's name as the Python API and the plans spell it.
inline const char* PassName(ConvPass p) {
  constexpr const char* kNames[] = {"forward", "backprop_input", "backprop_filter"};
  return kNames[static_cast<int>(p)];
}

// --- Algorithms --------------------------------------------------------------------------

// An algorithm, known by the name the Python API and the plans spell it. Which algorithms
// exist is said in one place, the CPU's list of descriptors (CpuAlgorithms,
// plan/cpu_algorithms.h), where each descriptor carries its name as kAlgorithm; the GPU
// offers some of them (GpuAlgorithms, cuda/algorithms.h). The default, kAutoAlgorithm,
// asks a planner to choose. An Algorithm holds a pointer to its name: build one only from
// a string literal (ParseAlgorithm returns the listed one for a caller's text), as plan
// caches keep them for the life of the process.
class Algorithm {
 public:
  constexpr Algorithm() = default;
  constexpr explicit Algorithm(const char* name) : name_(name) {}
  constexpr const char* name() const { return name_; }

  friend constexpr bool operator==(Algorithm a, Algorithm b) { return Compare(a, b) == 0; }
  friend constexpr bool operator!=(Algorithm a, Algorithm b) { return Compare(a, b) != 0; }
  friend constexpr bool operator<(Algorithm a, Algorithm b) { return Compare(a, b) < 0; }

 private:
  // The names' order, character by character.
  static constexpr int Compare(Algorithm a, Algorithm b) {
    const char *x = a.name_, *y = b.name_;
    while (*x != 0 && *x == *y) ++x, ++y;
    return *x == *y ? 0 : static_cast<unsigned char>(*x) < static_cast<unsigned char>(*y) ? -1 : 1;
  }
  const char* name_ = "auto";
};
inline constexpr Algorithm kAutoAlgorithm{};

// "'auto', 'direct' or 'fft'": the names of `algorithms`, for messages.
template <class Algorithms>
std::string AlgorithmChoices(const Algorithms& algorithms) {
  std::string out;
  const size_t n = std::size(algorithms);
  size_t i = 0;
  for (Algorithm a : algorithms) {
    out += i == 0 ? "'" : i + 1 == n ? " or '" : ", '";
    out += std::string(a.name()) + "'";
    ++i;
  }
  return out;
}

constexpr int64_t kDefaultWorkspaceLimit = int64_t{64} << 20;  // 64 MiB

// --- Index arithmetic ----------------------------------------------------------------

// Quotients rounded towards minus / plus infinity, for negative numerators too (b > 0).
LC_HD constexpr int64_t FloorDiv(int64_t a, int64_t b) {
  return (a / b) * b > a ? a / b - 1 : a / b;
}
LC_HD constexpr int64_t CeilDiv(int64_t a, int64_t b) { return -FloorDiv(-a, b); }
// a mod m in [0, m), for negative a too.
LC_HD constexpr int64_t Mod(int64_t a, int64_t m) { return ((a % m) + m) % m; }
LC_HD constexpr int64_t AlignUp(int64_t bytes, int64_t align) {
  return CeilDiv(bytes, align) * align;
}
// Positions a filter of k taps spaced d apart spans.
LC_HD constexpr int64_t DilatedExtent(int64_t k, int64_t d) { return (k - 1) * d + 1; }
LC_HD constexpr int64_t MinOf(int64_t a, int64_t b) { return a < b ? a : b; }

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_COMMON_VOCABULARY_H_
