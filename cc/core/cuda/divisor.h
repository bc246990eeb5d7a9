// Division by a number fixed before a launch, for the FFT path's element kernels. A GPU has
// no integer divider: a 32-bit division is a call of some twenty instructions and a 64-bit
// one several times that, and an element kernel that decodes its index into tile, channel,
// row and column divides a dozen times per element. Measured on an H200 (tests/gpu/
// prune_probe.py --profile), packing the tiles took half of a depthwise training step.
//
// Divisor d (1 <= d < 2^31) keeps m = ceil(2^(31 + l) / d), l = ceil(log2 d). For
// 0 <= n < 2^31, floor(n * m / 2^(31 + l)) = floor(n / d): writing m = (2^(31 + l) + e) / d
// with 0 <= e < d, n * m / 2^(31 + l) = n / d + n e / (d 2^(31 + l)), and the second term is
// below 2^-l <= 1 / d, less than the gap between n / d and the next integer. m < 2^32, so the
// product is one 32 x 32 -> 64-bit multiply. Larger dividends (and divisors of 2^31 or more)
// take the plain division; the same code runs on the host, so the emulator checks it.
#ifndef TF_LARGECONV_CORE_CUDA_DIVISOR_H_
#define TF_LARGECONV_CORE_CUDA_DIVISOR_H_

#include <cstdint>

#include "cc/core/common/hd.h"

namespace largeconv {
namespace cuda {

class Divisor {
 public:
  constexpr Divisor() = default;
  // d >= 1.
  constexpr explicit Divisor(int64_t d) : divisor_(d), mul_(0), shift_(0) {
    if (d >= 1 && d < kLimit) {
      int l = 0;
      while ((int64_t{1} << l) < d) ++l;
      shift_ = 31 + l;
      mul_ = static_cast<uint32_t>(((uint64_t{1} << shift_) + static_cast<uint64_t>(d) - 1) /
                                   static_cast<uint64_t>(d));
    }
  }
  LC_HD constexpr int64_t value() const { return divisor_; }

  // floor(n / d) for n >= 0.
  LC_HD constexpr int64_t Quot(int64_t n) const {
    return (shift_ != 0 && n < kLimit) ? Fast(static_cast<uint32_t>(n)) : n / divisor_;
  }
  LC_HD constexpr int32_t Quot(int32_t n) const {
    return shift_ != 0 ? static_cast<int32_t>(Fast(static_cast<uint32_t>(n)))
                       : static_cast<int32_t>(n / divisor_);
  }
  // n mod d in [0, d), for any sign of n.
  LC_HD constexpr int64_t Mod(int64_t n) const {
    return n >= 0 ? n - Quot(n) * divisor_ : divisor_ - 1 - (-(n + 1) - Quot(-(n + 1)) * divisor_);
  }

 private:
  static constexpr int64_t kLimit = int64_t{1} << 31;
  LC_HD constexpr int64_t Fast(uint32_t n) const {
    return static_cast<int64_t>((static_cast<uint64_t>(n) * mul_) >> shift_);
  }
  int64_t divisor_ = 1;
  uint32_t mul_ = 0;
  int shift_ = 0;  // 0: the plain division
};

}  // namespace cuda
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CUDA_DIVISOR_H_
