// What the CPU's FFT kernels (2-D fft.cc, 3-D fft3d.cc) share: running items in slots,
// and the spectral multiply-add every overlap-save correlation is made of.
#ifndef TF_LARGECONV_CORE_FFT_SHARED_H_
#define TF_LARGECONV_CORE_FFT_SHARED_H_

#include <algorithm>
#include <complex>
#include <cstdint>
#include <functional>

#include "cc/core/parallel.h"
#include "cc/core/vocabulary.h"

namespace largeconv {

// How a pass's workspace is carved up: spectra shared by all slots (a block's filter
// spectra), then per slot its spectra and real planes (a plane: one transform's real
// points).
struct Layout {
  int64_t bins = 0;            // complex bins of one spectrum
  int64_t shared_spectra = 0;  // filter spectra shared by all slots
  int64_t slot_spectra = 0;    // spectra owned by each slot
  int64_t spectrum_bytes = 0, plane_bytes = 0, real_planes = 1;
  int64_t slot_bytes = 0, shared_bytes = 0, total = 0;
};

// The byte sizes of a layout whose counts (bins, spectra, real planes) are set, for planes
// of `plane_points` reals of `rb` bytes and `slots` slots.
inline Layout FinishLayout(Layout l, int64_t plane_points, int64_t slots, int rb) {
  constexpr int64_t kAlign = 64;
  l.spectrum_bytes = AlignUp(l.bins * 2 * rb, kAlign);
  l.plane_bytes = AlignUp(plane_points * rb, kAlign);
  l.shared_bytes = l.shared_spectra * l.spectrum_bytes;
  l.slot_bytes = l.slot_spectra * l.spectrum_bytes + l.real_planes * l.plane_bytes;
  // Whole multiples of 256 bytes, the granule TF's CPU allocator counts in, so the planned
  // number is exactly what the allocator reports.
  l.total = (l.shared_bytes + slots * l.slot_bytes + 255) / 256 * 256;
  return l;
}

// Typed views of the workspace.
template <typename R>
struct Workspace {
  using C = std::complex<R>;
  char* base;
  Layout l;
  C* shared(int64_t i) const { return reinterpret_cast<C*>(base + i * l.spectrum_bytes); }
  char* slot_base(int64_t s) const { return base + l.shared_bytes + s * l.slot_bytes; }
  C* spectrum(int64_t s, int64_t i) const {
    return reinterpret_cast<C*>(slot_base(s) + i * l.spectrum_bytes);
  }
  R* real(int64_t s, int64_t plane = 0) const {
    return reinterpret_cast<R*>(slot_base(s) + l.slot_spectra * l.spectrum_bytes +
                                plane * l.plane_bytes);
  }
};

// Runs fn(slot, item) for items [0, items), split into at most `slots` contiguous runs
// that execute concurrently; a slot's buffers are touched by one thread only.
inline void RunSlots(const ParallelFor& pf, int64_t slots, int64_t items, double cost_per_item,
                     const std::function<void(int64_t, int64_t)>& fn) {
  if (items <= 0) return;
  const int64_t s = std::max<int64_t>(1, std::min(slots, items));
  const double cost = cost_per_item * static_cast<double>(CeilDiv(items, s));
  pf(s, static_cast<int64_t>(std::min(cost, 1e15)) + 1, [&](int64_t b, int64_t e) {
    for (int64_t slot = b; slot < e; ++slot) {
      const int64_t lo = items * slot / s, hi = items * (slot + 1) / s;
      for (int64_t i = lo; i < hi; ++i) fn(slot, i);
    }
  });
}

// acc += a * conj(b) over n complex bins, written on interleaved reals so it vectorises.
template <typename R>
void MacConj(std::complex<R>* acc, const std::complex<R>* a, const std::complex<R>* b, int64_t n) {
  R* __restrict o = reinterpret_cast<R*>(acc);
  const R* __restrict x = reinterpret_cast<const R*>(a);
  const R* __restrict y = reinterpret_cast<const R*>(b);
  for (int64_t i = 0; i < n; ++i) {
    const R xr = x[2 * i], xi = x[2 * i + 1], yr = y[2 * i], yi = y[2 * i + 1];
    o[2 * i] += xr * yr + xi * yi;
    o[2 * i + 1] += xi * yr - xr * yi;
  }
}

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_FFT_SHARED_H_
