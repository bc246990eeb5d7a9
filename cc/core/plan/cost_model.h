// The CPU planner's cost model: the seconds, on one thread, it prices each algorithm's work
// at (the direct kernels, the FFT's configurations, TensorFlow's kernels), from constants
// fitted to this project's machines by `python tools/calibrate_cpu.py` (cost_model.cc
// names the command behind each). Used only to compare configurations and algorithms,
// never reported as timing.
#ifndef TF_LARGECONV_CORE_PLAN_COST_MODEL_H_
#define TF_LARGECONV_CORE_PLAN_COST_MODEL_H_

#include <algorithm>
#include <cstdint>

#include "cc/core/common/geometry.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cpu/fft.h"
#include "cc/core/plan/plan.h"

namespace largeconv {

// Rows of height 1 (conv1d's transforms) are 1-D transforms, which DUCC vectorises across
// the rows of one call, not within a row: measured per point against a 2-D transform's,
// one or two rows at a time cost 4.7x, four 2.2x, eight 1.4x, and 1.3x more again for
// rows longer than 16384 (out of L2 eight at a time). The planner batches this many.
constexpr int64_t kLineBlock = 8;

// Filter spectra (complex values) that stay in cache from one item to the next: 8 MiB of
// float, a quarter of this machine's L3. Of a larger block, the share beyond it is read
// from memory again by each item.
constexpr double kCachedFilterValues = 1024 * 1024;

// Handing a parallel phase to a second thread wakes it, which costs more than a small
// pass gains: a 3x3 filter on one 8x8 image through the FFT took 54 us a call on one
// thread and 88 us on two, a 7x7 filter on 32x32 72 and 103 us (this 2-core machine, the
// op called from Python). Such a pass runs on one slot.
constexpr double kSlotStartSeconds = 30e-6;

// The direct kernels' seconds for `flops` of a pass (by its destination channels per group).
double DirectSeconds(const ConvGeometry& g, ConvPass pass, double flops);
double DirectSeconds(const Conv3dGeometry& g, ConvPass pass, double flops);

// TensorFlow's kernels' seconds for a pass, as fitted for the kernels TfKernels() names.
double TfSeconds(const ConvGeometry& g, ConvPass pass);
double TfSeconds(const Conv3dGeometry& g, ConvPass pass);

// The temporaries of TensorFlow's kernels (TfWorkspaceEstimate): a 16 MiB im2col chunk (TF's Eigen
// path caps its patch buffer there) plus a filter-sized buffer per thread (oneDNN's gradient
// reductions).
template <class Geometry>
int64_t TfBytesOf(const Geometry& g, int64_t threads, int real_bytes) {
  return (int64_t{16} << 20) + (threads + 1) * g.filter_elements() * real_bytes;
}

// Items each parallel phase of an FFT configuration splits over (used to cap useful slots).
int64_t ParallelItems(const ConvGeometry& g, ConvPass pass, const FftConfig& c);
int64_t ParallelItems(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c);

// Complex values of the filter spectra a forward or backprop-input block holds.
double FilterBlockValues(const ConvGeometry& g, ConvPass pass, const FftConfig& c);

// The work of an FFT configuration as the cost model counts it; with `kept_filter`, for a
// call whose filter spectra were kept from an earlier one (its filter transforms left out).
FftWork CountFftWork(const ConvGeometry& g, ConvPass pass, const FftConfig& c,
                     bool kept_filter = false);
FftWork CountFftWork(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c);

// Single-thread seconds of a configuration (`kept_filter`: as CountFftWork); *flops: its
// arithmetic (a real transform of N points costs about 2.5 N log2 N flops, a complex
// multiply-add 8).
double FftCost(const ConvGeometry& g, ConvPass pass, const FftConfig& c, double* flops,
               bool kept_filter = false);
double FftCost(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c, double* flops);

// kReferenceSlots (plan.h) is the parallelism a transform size is chosen for (see
// PlanPass): two threads. Tiles cut for more slots than that cost more in overlap than they
// gain on a 2-core machine (batch-2 321x481 frames ran 15-30% slower with tiles cut for
// four), and a machine with more threads still runs as many slots as its limit pays for.

// The single-thread seconds of the longest of `runs` contiguous runs that share a
// configuration's parallel items.
template <class Geometry, class Config>
double LongestRunCost(const Geometry& g, ConvPass pass, const Config& c, int64_t runs) {
  double flops;
  const double seconds = FftCost(g, pass, c, &flops);
  const int64_t items = std::max<int64_t>(1, ParallelItems(g, pass, c));
  runs = std::max<int64_t>(1, std::min(runs, items));
  const double longest_run = static_cast<double>(CeilDiv(items, runs)) / items;
  return seconds * longest_run;
}
// A configuration's cost on kReferenceSlots threads, in single-thread seconds: its slots
// (at most kReferenceSlots) share its parallel items in contiguous runs, so the time is
// that of the longest run; the other threads idle.
template <class Geometry, class Config>
double ReferenceCost(const Geometry& g, ConvPass pass, const Config& c) {
  return LongestRunCost(g, pass, c, std::min(c.slots, kReferenceSlots)) * kReferenceSlots;
}

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_PLAN_COST_MODEL_H_
