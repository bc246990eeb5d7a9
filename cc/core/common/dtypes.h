// The element types the kernels support and their load/store rules: floating types are
// accumulated in float (double for double) and rounded once when a result is stored; int32
// is summed exactly, modulo 2^32. f16/bf16 are layout-compatible with Eigen::half /
// Eigen::bfloat16 (one uint16_t).
#ifndef TF_LARGECONV_CORE_COMMON_DTYPES_H_
#define TF_LARGECONV_CORE_COMMON_DTYPES_H_

#include <cstdint>
#include <cstring>

#include "cc/core/common/hd.h"

namespace largeconv {

struct f16 {
  uint16_t bits;
};
struct bf16 {
  uint16_t bits;
};

// The bits of `from` as a `To` of the same size (a register move on the host and the
// device alike).
template <typename To, typename From>
LC_HD inline To BitCast(From from) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
  To to;
  memcpy(&to, &from, sizeof(To));
  return to;
}
LC_HD inline float BitsToFloat(uint32_t u) { return BitCast<float>(u); }
LC_HD inline uint32_t FloatToBits(float f) { return BitCast<uint32_t>(f); }

LC_HD inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp != 0) return BitsToFloat(sign | ((exp + 112) << 23) | (man << 13));
  // Zero or subnormal: man * 2^-24, exact in float.
  const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;
  return sign ? -mag : mag;
}

// Round-to-nearest-even, overflow to inf, NaN kept quiet.
LC_HD inline uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u);
  }
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                        // below 2^-14: subnormal or zero
    // Scale into the subnormal grid; float addition rounds to nearest even.
    const float mag = BitsToFloat(abs) + 0.5f;  // 0.5 = 2^-1 puts 2^-24 at the ulp of 0.5
    return sign | static_cast<uint16_t>(FloatToBits(mag) - 0x3f000000u);
  }
  const uint32_t odd = (abs >> 13) & 1u;
  const uint32_t r = abs + 0xfffu + odd;  // round to nearest even at bit 13
  return sign | static_cast<uint16_t>((r - (112u << 23)) >> 13);
}

LC_HD inline float Bf16ToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

LC_HD inline uint16_t FloatToBf16(float f) {
  const uint32_t u = FloatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  const uint32_t odd = (u >> 16) & 1u;
  return static_cast<uint16_t>((u + 0x7fffu + odd) >> 16);
}

// The one list of element types, one line each:
//   X(core storage type, name as TensorFlow's dtypes and numpy spell it, TF's attr word)
// in two parts by what can compute them:
//   LARGECONV_FOR_EACH_FLOAT_DTYPE  every algorithm on every device (CPU and CUDA, direct
//                                   and FFT);
//   LARGECONV_FOR_EACH_INT_DTYPE    summed exactly (wrapping as TensorFlow's int32 kernel
//                                   does), so by the CPU's direct kernels only: a transform
//                                   cannot be exact, and TensorFlow keeps int32 tensors of
//                                   GPU kernels in host memory.
// LARGECONV_FOR_EACH_DTYPE, their union, is what the ops and modules offer: the CPU direct
// kernels, TF's CPU registrations, the op's T attribute and the modules' DTYPES expand it;
// the FFT kernels, the CUDA kernels and TF's GPU registrations expand the floating part. A
// new type is added to one of the two and nowhere else but its Load/Store rules below.
#define LARGECONV_FOR_EACH_FLOAT_DTYPE(X) \
  X(f16, float16, half)                   \
  X(bf16, bfloat16, bfloat16)             \
  X(float, float32, float)                \
  X(double, float64, double)
#define LARGECONV_FOR_EACH_INT_DTYPE(X) X(int32_t, int32, int32)
#define LARGECONV_FOR_EACH_DTYPE(X) \
  LARGECONV_FOR_EACH_FLOAT_DTYPE(X) \
  LARGECONV_FOR_EACH_INT_DTYPE(X)

// True for the types of LARGECONV_FOR_EACH_INT_DTYPE: the planners never give them the FFT
// and the dispatch never instantiates it for them.
template <typename T>
inline constexpr bool kIsInt = false;
#define LARGECONV_IS_INT(T, NAME, TF_WORD) \
  template <>                              \
  inline constexpr bool kIsInt<T> = true;
LARGECONV_FOR_EACH_INT_DTYPE(LARGECONV_IS_INT)
#undef LARGECONV_IS_INT

template <typename T>
struct Acc {
  using type = float;
};
template <>
struct Acc<double> {
  using type = double;
};
// int32 products and sums wrap modulo 2^32 in TensorFlow's kernel (Eigen's int32
// contraction), so its result is the exact sum reduced modulo 2^32 whatever the order.
// Unsigned arithmetic is that reduction, with defined overflow: the stored int32 equals
// TensorFlow's bit for bit. A wider accumulator would store the same bits, more slowly.
template <>
struct Acc<int32_t> {
  using type = uint32_t;
};

template <typename T>
using AccT = typename Acc<T>::type;

// Bytes of the type each storage type computes in (the planners size buffers with it).
template <typename T>
constexpr int kComputeBytes = sizeof(AccT<T>);

LC_HD inline float Load(float v) { return v; }
LC_HD inline double Load(double v) { return v; }
LC_HD inline float Load(f16 v) { return HalfToFloat(v.bits); }
LC_HD inline float Load(bf16 v) { return Bf16ToFloat(v.bits); }
LC_HD inline uint32_t Load(int32_t v) { return static_cast<uint32_t>(v); }

template <typename T>
LC_HD inline T Store(AccT<T> v);
template <>
LC_HD inline float Store<float>(float v) {
  return v;
}
template <>
LC_HD inline double Store<double>(double v) {
  return v;
}
template <>
LC_HD inline f16 Store<f16>(float v) {
  return f16{FloatToHalf(v)};
}
template <>
LC_HD inline bf16 Store<bf16>(float v) {
  return bf16{FloatToBf16(v)};
}
// Two's complement: the low 32 bits as int32 (defined since C++20, and what GCC, Clang and
// nvcc do in C++17).
template <>
LC_HD inline int32_t Store<int32_t>(uint32_t v) {
  return static_cast<int32_t>(v);
}

LC_HD inline bool IsFinite(float v) { return (FloatToBits(v) & 0x7f800000u) != 0x7f800000u; }
LC_HD inline bool IsFinite(double v) {
#ifdef __CUDA_ARCH__
  const uint64_t u = static_cast<uint64_t>(__double_as_longlong(v));
#else
  uint64_t u;
  std::memcpy(&u, &v, 8);
#endif
  return (u & 0x7ff0000000000000ull) != 0x7ff0000000000000ull;
}
LC_HD inline bool IsFinite(f16 v) { return (v.bits & 0x7c00u) != 0x7c00u; }
LC_HD inline bool IsFinite(bf16 v) { return (v.bits & 0x7f80u) != 0x7f80u; }

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_COMMON_DTYPES_H_
