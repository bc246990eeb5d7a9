// Cost model and search behind PassPlan. The FFT tile is chosen from the limit and the
// geometry only (never the thread count), so results are bitwise identical whatever the
// number of threads; blocks and slots, which do not change the arithmetic, then use the
// threads the limit can pay for.
#include "cc/core/plan.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

namespace largeconv {
namespace {

// The cost model, fitted to single-thread warm times of the forward pass on the project's
// CPU machines (float32, 2-core x86 without AVX-512) by `python tools/calibrate_cpu.py`,
// which measures the configurations the planner makes over a grid of problems and limits
// and prints these constants. Used only to compare configurations and algorithms, never
// reported as timing.
//
// Direct kernels: the inner loop runs over a group's destination channels ("lanes"), so
// the rate grows with them: rate = min(peak, base * max(1, lanes / at_base)), fitted per
// pass, as each pass has kernels of its own (`python tools/calibrate_cpu.py --direct`,
// 2026-11-26: filters 3x3-15x15, 1->1 to 128->128 channels, grouped and depthwise). The
// forward kernels reach 27-50 GFLOP/s with 32-128 lanes, the input gradient's 13-31 and
// the filter gradient's 5-9. Predicted/measured off by a median 1.16 / 1.47 / 1.25, 90th
// percentile 1.51 / 2.18 / 1.48; the worst (4-5x) are 16 lanes from one input channel and
// depthwise filter gradients.
struct DirectRate {
  double base, at_base, peak;  // FLOP/s, lanes, FLOP/s
};
constexpr DirectRate kDirectRates[3] = {
    {7.87e9, 12, 39.3e9},  // forward
    {4.77e9, 4, 14.5e9},   // backprop_input
    {3.72e9, 12, 7.13e9},  // backprop_filter
};
// FFT kernels: DUCC's 2-D transforms of tiles that fit in cache cost about the same per
// point whatever the size and radix (the log2 term fits to zero), plus a fixed cost per
// transform, plus the spectral products (complex multiply-adds).
constexpr double kSecondsPerTransformPoint = 2.3e-9;
constexpr double kSecondsPerTransform = 2.6e-6;
// A complex multiply-add cost 0.56 ns as fitted, with every tile reading the filter values
// afresh. Reading the value is most of that once the block's spectra outgrow the cache:
// the 31x31 stride-2 transpose pass (1 thread, 120x120 transforms, 135M multiply-adds) ran
// 227-262 ms with one tile per item and 154-162 ms with nine tiles sharing each value
// read, 0.6-0.8 ns per read saved. Split so that one read per multiply-add still costs
// the fitted 0.56 ns, which credits shared reads conservatively.
constexpr double kSecondsPerComplexMac = 0.12e-9;
constexpr double kSecondsPerFilterRead = 0.44e-9;
// Filter spectra (complex values) that stay in cache from one item to the next: 8 MiB of
// float, a quarter of this machine's L3. Of a larger block, the share beyond it is read
// from memory again by each item.
constexpr double kCachedFilterValues = 1024 * 1024;
// Rows of height 1 (conv1d's transforms) are 1-D transforms, which DUCC vectorises across
// the rows of one call, not within a row: measured per point against a 2-D transform's,
// one or two rows at a time cost 4.7x, four 2.2x, eight 1.4x, and 1.3x more again for
// rows longer than 16384 (out of L2 eight at a time).
constexpr int64_t kLineBlock = 8;
double LinePointFactor(const FftConfig& c) {
  if (c.fft_h != 1) return 1;
  const double lines = c.vec_block >= kLineBlock ? 1.4 : c.vec_block >= 4 ? 2.2 : 4.7;
  return lines * (c.fft_w > 16384 ? 1.3 : 1.0);
}
// TensorFlow's CPU kernels, fitted per pass to single-thread warm times (float32, SAME,
// filters 1x1-15x15, 1->1 to 128->128 channels, batch 1 and 8, a few larger images and a
// few calls of tens of microseconds) by `python tools/calibrate_cpu.py --tf --seconds 0.6`,
// once for each of TF's two sets of CPU kernels: Eigen's, which TF runs unless oneDNN is on
// (2026-11-26, a 2-core x86 without AVX-512, where TF leaves oneDNN off), and oneDNN's
// (2026-11-26, a 2-core AMD EPYC with AVX-512, VNNI and BF16, where TF turns it on). With
// P output pixels (batch x height x width), K filter taps, ci and co channels:
//   seconds = a flops + b P K ci + c P K co + d P + e P K + [big] f P K ci + [small] h P,
// [big] where one image's patch matrix (its output pixels x K x ci values, 4 bytes each)
// exceeds kTfBigPatchBytes; [small] for a 3x3 or 5x5 filter on fewer than kTfFewChannels
// input channels.
// - Eigen's: the forward kernel peaks near 80 GFLOP/s with many channels but pays per pixel
//   and tap with few, and about 50 ns a pixel more with [small] (a 3x3 1->1 filter on
//   512x512: 16 ms, 3.6x the fit without the term); the backprop kernels run 2-10x slower
//   than the forward one with few channels (an 8->8 3x3 filter on a 512x512 image: 14 ms
//   forward, 105 and 103 ms backward) and slower again on large single images.
//   Predicted/measured off by a median 1.11-1.16x, 90th percentile 1.45-1.87x; the worst
//   (2.5-4.5x) are 1x1 filters on 512x512 images with few channels.
// - oneDNN's: all three passes near 150 GFLOP/s with many channels, the backprop ones as
//   fast as the forward one with few (that 8->8 3x3 filter on 512x512: 6.1, 6.2 and 6.6
//   ms). Off by a median 1.14-1.18x, 90th percentile 1.36-1.48x; the worst (2-5x) are 1x1
//   filters again. Its filter gradient takes a slow path for some filters of 15x15 and
//   more (0.1-1 s an image: a 15x15 8->8 filter on one 117x117 image 1.07 s, a 13x13 one
//   6 ms), left out of the fit: the FFT is far cheaper there whichever way it is priced.
//   Where oneDNN is capped below AVX-512 (ONEDNN_MAX_CPU_ISA=AVX2) its forward kernel runs
//   2-3x slower than this fit (that 3x3 filter: 14.2 ms; 7x7 128->128 on 64x64: 186
//   against 58 ms), its backprop ones as fast: no fit of its own yet.
// g, the fit's constant, is TF's cost of a call beyond the op's own (the calibration
// subtracts the op's): on calls of tens of microseconds it decides between the two (a 7x7
// 1->1 filter on one 64x64 image: 0.2 ms through oneDNN's forward kernel, 0.1 through the
// op). Eigen's is left at 0: its forward fit's 31 us beyond the op's raw call is less than
// conv2d's own Python costs the op (a 1x1 8->8 filter on 2x32x32: 32 us through Eigen's
// kernel, 64 through the op's direct path; 178 through oneDNN's). planning.py adds what a
// call that mixes the two pays besides.
constexpr double kTfBigPatchBytes = 64.0 * (1 << 20);
constexpr int64_t kTfSmallFilter = 5, kTfFewChannels = 8;
constexpr double kTfCoefficients[2][3][8] = {
    {
        // Eigen's. a (s/flop), b, c, d, e, f, h, g (s)
        {1.15e-11, 8.2e-11, 3.36e-11, 8.31e-10, 1.45e-9, 0, 5.18e-8, 0},  // forward
        {1.27e-11, 3.13e-10, 8.37e-13, 8.98e-9, 2.54e-9, 9e-10, 0, 0},    // backprop_input
        {1.45e-11, 7.16e-10, 0, 2.47e-9, 3.49e-9, 7.87e-10, 4.65e-9, 0},  // backprop_filter
    },
    {
        // oneDNN's.
        {6.82e-12, 9.08e-11, 0, 1.56e-9, 1.02e-10, 1.04e-10, 6.14e-10, 49e-6},   // forward
        {6.04e-12, 0, 1.74e-10, 1.35e-9, 9.62e-11, 0, 2.37e-11, 42e-6},          // backprop_input
        {7.19e-12, 9.58e-11, 0, 1.94e-9, 9.53e-11, 1.22e-10, 3.78e-11, 108e-6},  // filter
    },
};
// Whether TensorFlow runs its oneDNN kernels here, decided as TF decides it: the
// TF_ENABLE_ONEDNN_OPTS environment variable where it is 0, 1, false or true (any case),
// else, on Linux x86, on where the CPU has AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX.
bool DecideOneDnn() {
  if (const char* value = std::getenv("TF_ENABLE_ONEDNN_OPTS")) {
    std::string v(value);
    for (char& ch : v) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (v == "0" || v == "false") return false;
    if (v == "1" || v == "true") return true;
  }
#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__))
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni") || __builtin_cpu_supports("avx512bf16") ||
         __builtin_cpu_supports("avxvnni") || __builtin_cpu_supports("amx-tile") ||
         __builtin_cpu_supports("amx-int8") || __builtin_cpu_supports("amx-bf16");
#else
  return false;
#endif
}
bool OneDnn() {
  static const bool on = DecideOneDnn();
  return on;
}

// The op's constants above price its kernels in the seconds of the machine they were
// fitted on; on the machine oneDNN's fit was made on, the op's kernels ran 1.4x faster
// than they price them (`python tools/calibrate_cpu.py --model-ratio --seconds 0.6`, the
// median over 70 FFT configurations and 162 direct-kernel passes: 1.43 and 1.40 in two
// runs; the FFT's alone 1.56-1.60, the direct kernels' 1.32). oneDNN's seconds are
// multiplied by that, so that TF's passes and the op's compare as they ran there: a 7x7
// 32->32 forward pass on 8x64x64 ran 14.4 ms through oneDNN and 10.1 through the FFT (2
// threads), which the model, unscaled, priced at 27.4 and 28.8 ms on one thread.
constexpr double kOneDnnFitToModelSeconds = 1.4;
double TfScale() { return OneDnn() ? kOneDnnFitToModelSeconds : 1.0; }

double TfSeconds(const ConvGeometry& g, ConvPass pass) {
  const double* k = kTfCoefficients[OneDnn() ? 1 : 0][static_cast<int>(pass)];
  const double image = static_cast<double>(g.out_h) * g.out_w;
  const double pixels = image * g.batch, taps = static_cast<double>(g.filter_h) * g.filter_w;
  const double ci = g.in_c_per_group(), co = g.out_c_per_group();
  const double big = image * taps * ci * 4 > kTfBigPatchBytes ? 1 : 0;
  const bool small_filter = g.filter_h <= kTfSmallFilter && g.filter_w <= kTfSmallFilter;
  const double small = taps > 1 && small_filter && ci < kTfFewChannels ? 1 : 0;
  return TfScale() * (k[0] * 2.0 * g.macs() + k[1] * pixels * taps * ci +
                      k[2] * pixels * taps * co + k[3] * pixels + k[4] * pixels * taps +
                      big * k[5] * pixels * taps * ci + small * k[6] * pixels + k[7]);
}
// Three spatial dimensions (priced only where algorithm='tf' asks for tf.nn.conv3d): the
// forward fit's flop rate.
double TfSeconds(const Conv3dGeometry& g, ConvPass) {
  return TfScale() * 2.0 * g.macs() * kTfCoefficients[OneDnn() ? 1 : 0][0][0];
}

template <class Geometry>
double DirectSeconds(const Geometry& g, ConvPass pass, double flops) {
  const double lanes = g.channels(pass).dst_per_group;
  const DirectRate& r = kDirectRates[static_cast<int>(pass)];
  const double rate = std::min(r.peak, r.base * std::max(1.0, lanes / r.at_base));
  return flops / rate;
}

// Items each parallel phase splits over (used to cap useful slots).
int64_t ParallelItems(const ConvGeometry& g, ConvPass pass, const FftConfig& c) {
  const FftTiling& t = c.tiling;
  if (WritesFilter(pass)) {
    return CeilDiv(g.groups, std::max<int64_t>(1, c.vec_block)) *
           CeilDiv(g.in_c_per_group(), c.in_block) * CeilDiv(g.out_c_per_group(), c.out_block);
  }
  const int64_t tiles = g.batch * t.tiles_h * t.tiles_w;
  if (BatchesTiles(g, c)) return CeilDiv(tiles, c.vec_block);  // runs of tiles
  return tiles * std::max<int64_t>(1, c.group_block);
}

// Complex values of the filter spectra a forward or backprop-input block holds.
double FilterBlockValues(const ConvGeometry& g, ConvPass pass, const FftConfig& c) {
  const double bins = static_cast<double>(c.fft_h) * (c.fft_w / 2 + 1);
  return bins * c.group_block * g.channels(pass).src_per_group * c.out_block;
}

// The work of an FFT configuration as the cost model counts it; with `kept_filter`, for a
// call whose filter spectra were kept from an earlier one (its filter transforms left out).
FftWork CountFftWork(const ConvGeometry& g, ConvPass pass, const FftConfig& c,
                     bool kept_filter = false) {
  const FftTiling& t = c.tiling;
  const double bins = static_cast<double>(c.fft_h) * (c.fft_w / 2 + 1);
  const double tiles = static_cast<double>(g.batch) * t.tiles_h * t.tiles_w * g.groups;
  FftWork w;
  w.transforms = FftTransformCount(g, pass, c);
  w.transform_points = FftTransformPoints(g, pass, c);
  if (kept_filter) {
    const double filters = FilterTransformCount(g.groups, g.in_c_per_group(), g.out_c_per_group());
    w.transforms -= filters;
    w.transform_points -= filters * c.fft_h * c.fft_w;
  }
  w.complex_macs = tiles * bins * g.in_c_per_group() * g.out_c_per_group();
  w.filter_reads = w.complex_macs;
  if (WritesFilter(pass)) {
    // The accumulators' traffic: each is read and written once per sweep of tiles, which
    // beyond what stays in cache costs two reads per multiply-add of the sweep's first
    // tile (1 thread, 160x160 transforms, 16 x 32 pairs a unit: 0.9-1.0 ns a multiply-add
    // one tile at a time).
    const bool sweeps = BatchesTiles(g, c);
    const double groups = sweeps ? 1 : std::max<int64_t>(1, c.vec_block);
    const double held = bins * c.in_block * c.out_block * groups;
    const double missed = std::max(0.0, 1.0 - kCachedFilterValues / held);
    const double sweep = sweeps ? c.vec_block : 1;
    w.filter_reads *= 1.0 - missed + 2.0 * missed / sweep;
  } else if (BatchesTiles(g, c)) {
    const double missed = std::max(0.0, 1.0 - kCachedFilterValues / FilterBlockValues(g, pass, c));
    w.filter_reads *= 1.0 - missed + missed / c.vec_block;
  }
  return w;
}

// Runs of tiles per item (BatchesTiles) are priced as the model counts them. A margin that
// raised their price by 1/0.9 (against 2-thread runs on 160x288 transforms that were
// slower than 160x160 ones) no longer paid once the tiles' channels loaded in one pass:
// without it (2 threads, builds alternated) a 512x512x8 image with a 31x31x8x8 filter went
// from 13.4-13.6 to 12.2-12.7 ms (160x288 transforms in runs of 4), four 128x128x16 images
// with a 63x63x16x16 filter from 11.8-12.0 to 8.7-10.3 ms (runs of 2, each filter value
// read once per two images), two 512x512x8 images from 31.3-32.7 to 25.3-31.4 ms; one
// thread 22.3-28.0 -> 21.3, 18.9-20.4 -> 14.6 and 49.0 -> 40.7-41.5 ms.

// Single-thread seconds of a configuration (`kept_filter`: as CountFftWork); *flops: its
// arithmetic (a real 2-D transform of N points costs about 2.5 N log2 N flops, a complex
// multiply-add 8).
double FftCost(const ConvGeometry& g, ConvPass pass, const FftConfig& c, double* flops,
               bool kept_filter = false) {
  const FftWork w = CountFftWork(g, pass, c, kept_filter);
  const double n = static_cast<double>(c.fft_h) * c.fft_w;
  *flops = w.transform_points * 2.5 * std::log2(std::max(n, 2.0)) + 8.0 * w.complex_macs;
  return kSecondsPerTransformPoint * LinePointFactor(c) * w.transform_points +
         kSecondsPerTransform * w.transforms + kSecondsPerComplexMac * w.complex_macs +
         kSecondsPerFilterRead * w.filter_reads;
}

// --- Three spatial dimensions: the same cost model over 3-D transforms -------------------

int64_t ParallelItems(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c) {
  if (!WritesFilter(pass)) return g.batch * c.tiling.count();
  return g.groups * CeilDiv(g.in_c_per_group(), c.in_block) *
         CeilDiv(g.out_c_per_group(), c.out_block);
}

FftWork CountFftWork(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c) {
  FftWork w;
  w.transforms = FftTransformCount(g, pass, c);
  w.transform_points = w.transforms * static_cast<double>(Volume(c.fft));
  const double spectrum = static_cast<double>(c.fft[0]) * c.fft[1] * (c.fft[2] / 2 + 1);
  w.complex_macs =
      spectrum * g.batch * c.tiling.count() * g.groups * g.in_c_per_group() * g.out_c_per_group();
  w.filter_reads = w.complex_macs;  // every tile reads the filter values afresh
  return w;
}

double FftCost(const Conv3dGeometry& g, ConvPass pass, const Fft3dConfig& c, double* flops) {
  const FftWork w = CountFftWork(g, pass, c);
  const double log_points = std::log2(std::max(static_cast<double>(Volume(c.fft)), 2.0));
  *flops = 2.5 * log_points * w.transform_points + 8.0 * w.complex_macs;
  return kSecondsPerTransformPoint * w.transform_points + kSecondsPerTransform * w.transforms +
         kSecondsPerComplexMac * w.complex_macs + kSecondsPerFilterRead * w.filter_reads;
}

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

// Whether some run of tiles per item could make a one-group 2-D configuration (its
// largest destination block, one tile per item) cheaper: one as long as all the tiles,
// which saves every filter read it can, against the same without runs. Smaller blocks
// only add transforms and save fewer reads.
bool RunsCanPay(const ConvGeometry& g, ConvPass pass, const FftConfig& c) {
  if (FilterBlockValues(g, pass, c) <= kCachedFilterValues) return false;
  FftConfig all = c;
  all.vec_block = std::max<int64_t>(2, g.batch * c.tiling.tiles_h * c.tiling.tiles_w);
  double flops;
  return FftCost(g, pass, all, &flops) < FftCost(g, pass, c, &flops);
}

// Largest v in [1, hi] for which fits() holds with *field = v, given that it holds for 1
// (fits() grows with *field). Leaves *field at the result.
template <typename Fits>
int64_t LargestFitting(int64_t hi, int64_t* field, const Fits& fits) {
  int64_t lo = 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    *field = mid;
    if (fits()) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  *field = lo;
  return lo;
}

// Tiles per sweep of the filter pass (with one group) the planner tries: the accumulators
// are read and written once per sweep, so eight take their traffic to an eighth.
constexpr int64_t kFilterSweeps[] = {8, 4, 2};

// The filter pass's block configurations for `threads` units of work, largest first:
// calls visit(config) for each until it returns true. Many groups keep the threads busy
// with whole groups per unit, batched (vec_block halving); otherwise enough (input,
// output) units to keep `threads` busy, output channels split first, then both halved in
// turn down to single channels.
template <typename Visit>
void ForEachFilterBlocks(const ConvGeometry& g, int64_t threads, FftConfig c, const Visit& visit) {
  const int64_t icpg = std::max<int64_t>(1, g.in_c_per_group());
  const int64_t ocpg = std::max<int64_t>(1, g.out_c_per_group());
  if (g.groups >= threads) {
    c.in_block = icpg;
    c.out_block = ocpg;
    constexpr int64_t kVecBlock = 16;
    for (c.vec_block =
             std::max<int64_t>(1, std::min<int64_t>(kVecBlock, CeilDiv(g.groups, threads)));
         c.vec_block >= 1; c.vec_block /= 2) {
      if (visit(c)) return;
    }
  }
  c.vec_block = 1;
  const int64_t want = std::max<int64_t>(1, CeilDiv(threads, g.groups));
  c.out_block = CeilDiv(ocpg, std::min(ocpg, want));
  const int64_t co_units = CeilDiv(ocpg, c.out_block);
  c.in_block = CeilDiv(icpg, std::min(icpg, std::max<int64_t>(1, want / co_units)));
  // With one group, each block also with sweeps of several tiles (vec_block, longest
  // first), then one tile at a time.
  const int64_t tiles = g.batch * c.tiling.tiles_h * c.tiling.tiles_w;
  const auto visit_sweeps = [&](FftConfig& b) {
    if (g.groups == 1) {
      for (const int64_t sweep : kFilterSweeps) {
        if (sweep > tiles) continue;
        b.vec_block = sweep;
        if (visit(b)) return true;
      }
    }
    b.vec_block = 1;
    return visit(b);
  };
  while (!visit_sweeps(c) && (c.in_block > 1 || c.out_block > 1)) {
    if (c.in_block >= c.out_block) {
      c.in_block = CeilDiv(c.in_block, 2);
    } else {
      c.out_block = CeilDiv(c.out_block, 2);
    }
  }
}

// Blocks for `threads` (filter pass) or `c->slots` slots that fit the limit; false if
// none. Without `price`, the largest that fit; with it, for the filter pass, the cheapest
// by price among all of the ladder's configurations that fit, so that a larger limit, which
// only lets more of them fit, never makes the choice dearer.
bool FitBlocks(const ConvGeometry& g, ConvPass pass, int64_t limit, int real_bytes, int64_t threads,
               FftConfig* c, const std::function<double(const FftConfig&)>& price = nullptr) {
  if (WritesFilter(pass)) {
    bool found = false;
    double best = 0;
    ForEachFilterBlocks(g, std::max<int64_t>(1, threads), *c, [&](const FftConfig& trial) {
      if (FftWorkspaceBytes(g, pass, trial, real_bytes) > limit) return false;
      const double cost = price ? price(trial) : 0;
      if (!found || cost < best) {
        found = true;
        best = cost;
        *c = trial;
      }
      return !price;  // the largest that fits, or go on pricing
    });
    return found;
  }
  const int64_t dest = std::max<int64_t>(1, g.channels(pass).dst_per_group);
  const auto fits = [&] { return FftWorkspaceBytes(g, pass, *c, real_bytes) <= limit; };
  c->group_block = 1;
  c->vec_block = 1;
  c->out_block = 1;
  c->in_block = 1;
  if (!fits()) return false;
  c->out_block = LargestFitting(dest, &c->out_block, fits);
  if (g.groups == 1 && c->fft_h == 1) {  // rows of height 1: batch tiles (LinePointFactor)
    const int64_t tiles = g.batch * c->tiling.tiles_h * c->tiling.tiles_w;
    for (c->vec_block = std::min(kLineBlock, tiles); c->vec_block > 1; c->vec_block /= 2) {
      if (fits()) break;
    }
    c->vec_block = std::max<int64_t>(1, c->vec_block);
  }
  if (c->out_block >= dest && g.groups > 1) {  // whole groups fit: batch several groups
    // Enough to amortise DUCC's per-call overhead, and 64 bytes of float channels.
    constexpr int64_t kVecBlock = 16;
    c->vec_block = std::min<int64_t>(kVecBlock, g.groups);
    if (!fits()) c->vec_block = 1;
    c->group_block = LargestFitting(g.groups, &c->group_block, fits);
    c->vec_block = std::min(c->vec_block, c->group_block);
  }
  // Source channels whose spectra a slot holds at once: their products with the filter
  // spectra then run a block of bins at a time over all of them (fft.cc MultiplySources),
  // so a destination spectrum is read and written once per block of sources, not once
  // per source. Sixteen take the accumulators' traffic down to a sixteenth.
  constexpr int64_t kSourceBlock = 16;
  const int64_t sources = std::max<int64_t>(1, g.channels(pass).src_per_group);
  const int64_t source_block = std::min(kSourceBlock, sources);
  LargestFitting(source_block, &c->in_block, fits);
  if (g.groups == 1 && c->fft_h > 1 && c->in_block == source_block && RunsCanPay(g, pass, *c)) {
    // Runs of tiles per item (BatchesTiles), so that each filter value read serves the
    // whole run: among destination blocks as large as fit or up to two blocks more
    // (smaller blocks leave room for longer runs), each with the whole source block, and
    // runs from two tiles up to a slot's share, the cheapest for the slots by the cost
    // model (its filter reads against the transforms and the parallel items); one tile per
    // item where none is cheaper. The lengths tried grow by about half a step, to 32 (the
    // reads then cost 1/32 of one per multiply-add; longer runs gain little more, and each
    // length tried is a pricing).
    constexpr int64_t kRunLengths[] = {2, 3, 4, 6, 8, 12, 16, 24, 32};
    const int64_t tiles = g.batch * c->tiling.tiles_h * c->tiling.tiles_w;
    const int64_t slots = std::max<int64_t>(1, c->slots);
    const FftConfig largest = *c;
    const int64_t fewest = CeilDiv(dest, largest.out_block);
    FftConfig best = largest;
    double best_cost = LongestRunCost(g, pass, largest, slots);
    for (int64_t blocks = fewest; blocks <= std::min(dest, fewest + 2); ++blocks) {
      *c = largest;
      c->out_block = CeilDiv(dest, blocks);
      if (blocks > fewest && c->out_block == CeilDiv(dest, blocks - 1)) continue;
      if (LargestFitting(source_block, &c->in_block, fits) < source_block) continue;
      for (const int64_t run : kRunLengths) {
        c->vec_block = std::min(run, CeilDiv(tiles, slots));  // at most a slot's share
        if (c->vec_block < 2 || !fits()) break;
        const double cost = LongestRunCost(g, pass, *c, slots);
        if (cost < best_cost) {
          best_cost = cost;
          best = *c;
        }
        if (c->vec_block < run) break;
      }
    }
    *c = best;
  }
  return true;
}

// --- Three spatial dimensions: blocks under the limit ------------------------------------

// The largest blocks with which `c->slots` slots fit the limit; false when single channels
// do not. The filter pass keeps at least `threads` units of channel pairs where it has them.
bool FitBlocks(const Conv3dGeometry& g, ConvPass pass, int64_t limit, int real_bytes,
               int64_t threads, Fft3dConfig* c) {
  const auto fits = [&] { return FftWorkspaceBytes(g, pass, *c, real_bytes) <= limit; };
  c->in_block = 1;
  c->out_block = 1;
  if (!fits()) return false;
  if (!WritesFilter(pass)) {
    LargestFitting(std::max<int64_t>(1, g.channels(pass).dst_per_group), &c->out_block, fits);
    return true;
  }
  const int64_t icpg = std::max<int64_t>(1, g.in_c_per_group()),
                ocpg = std::max<int64_t>(1, g.out_c_per_group());
  const int64_t out_units = std::min(ocpg, CeilDiv(std::max<int64_t>(1, threads), g.groups));
  LargestFitting(CeilDiv(ocpg, out_units), &c->out_block, fits);
  const int64_t units = g.groups * CeilDiv(ocpg, c->out_block);
  const int64_t in_units = std::min(icpg, CeilDiv(std::max<int64_t>(1, threads), units));
  LargestFitting(CeilDiv(icpg, in_units), &c->in_block, fits);
  return true;
}

// --- The CPU's algorithms -----------------------------------------------------------------

// One request as the CPU's algorithms see it, for either geometry (Config: its FFT's
// configuration).
template <class Geometry, class Config>
struct CpuProblemOf : PlanProblemOf<Geometry> {
  using Plan = PassPlanOf<Config>;
  const PlanRequest& req;
  int64_t threads;
  FftSearch<Config> fft{};  // the FFT's best transform size, once priced
};
using CpuProblem = CpuProblemOf<ConvGeometry, FftConfig>;
using Cpu3dProblem = CpuProblemOf<Conv3dGeometry, Fft3dConfig>;

// The direct kernels: run every pass of every dtype, in no workspace.
template <class Pb>
Status CanAlways(const Pb&) {
  return OkStatus();
}
template <class Pb>
double DirectCost(Pb& pb, typename Pb::Plan* p) {
  return DirectSeconds(pb.g, pb.pass, p->flops);
}
template <class Pb>
int64_t NoWorkspace(const Pb&, const typename Pb::Plan&) {
  return 0;
}
template <class Pb>
Status DirectFinish(Pb&, typename Pb::Plan*) {
  return OkStatus();
}

// The FFT kernels: floating types only (integer types are summed exactly).
template <class Pb>
Status FftCanRun(const Pb& pb) {
  if (!pb.req.direct_only) return OkStatus();
  return InvalidArgument(
      "algorithm='fft' cannot compute integer dtypes exactly: use 'direct' or 'auto'");
}

// The best transform size. It must not depend on the thread count (it changes the
// arithmetic), so it is chosen for a fixed reference parallelism: every transform size is
// sized for kReferenceSlots slots and for one, and each candidate is priced as the time it
// takes on kReferenceSlots threads, expressed in single-thread seconds (cost x
// kReferenceSlots / slots it can keep busy). All candidates compete in one search, so a
// larger limit only adds candidates and makes none dearer (larger blocks do fewer
// transforms): the planned cost never increases with the limit. Not searched when the
// direct kernels were asked for.
double FftSearchCost(CpuProblem& pb, PassPlan* p) {
  if (pb.requested == Algorithm::kDirect || pb.g.no_products()) return -1;
  const ConvGeometry& g = pb.g;
  const ConvPass pass = pb.pass;
  const int real_bytes = pb.req.real_bytes;
  const auto cost = [&](const FftConfig& c) { return ReferenceCost(g, pass, c); };
  for (int64_t nominal : {kReferenceSlots, int64_t{1}}) {
    const auto fit = [&](int64_t fh, int64_t fw, FftConfig* c, int64_t* smallest) {
      c->fft_h = fh;
      c->fft_w = fw;
      if (!MakeFftTiling(g, pass, fh, fw, &c->tiling)) return false;
      c->slots = 1;
      *smallest = FftWorkspaceBytes(g, pass, *c, real_bytes);
      c->slots = nominal;
      return FitBlocks(g, pass, pb.limit, real_bytes, nominal, c, cost);
    };
    const FftSearch<FftConfig> round = SearchFftSizes<FftConfig>(g, pass, 1, fit, cost);
    // Every round reports the same smallest workspace (one slot, smallest blocks).
    if (!pb.fft.found || (round.found && round.cost < pb.fft.cost)) pb.fft = round;
  }
  pb.fft.config.slots = 1;
  if (pb.fft.found && !WritesFilter(pass)) {
    // The same configuration with its filter spectra kept: its cost scaled by the share
    // of the single-thread seconds the filter's transforms leave (they run on the slots
    // as the tiles' do).
    const FftConfig& c = pb.fft.config;
    double flops;
    p->fft_kept_seconds =
        pb.fft.cost * FftCost(g, pass, c, &flops, true) / FftCost(g, pass, c, &flops);
    p->kept_spectra_bytes =
        KeptSpectraValues(g, pass, c) * 2 * real_bytes + g.filter_elements() * real_bytes;
  }
  return pb.fft.cost;
}

// The 3-D transform size: as FftSearchCost, over every combination of per-dimension sizes.
double Fft3dSearchCost(Cpu3dProblem& pb, Pass3dPlan*) {
  std::array<std::vector<int64_t>, kSpatial3d> sizes;
  if (pb.requested == Algorithm::kDirect || !FftSizeCandidates(pb.g, pb.pass, &sizes)) return -1;
  const Conv3dGeometry& g = pb.g;
  const ConvPass pass = pb.pass;
  const int real_bytes = pb.req.real_bytes;
  const auto cost = [&](const Fft3dConfig& c) { return ReferenceCost(g, pass, c); };
  for (int64_t nominal : {kReferenceSlots, int64_t{1}}) {
    const auto fit = [&](const Dims3& f, Fft3dConfig* c, int64_t* smallest) {
      c->fft = f;
      if (!MakeFftTiling(g, pass, f, &c->tiling)) return false;
      *smallest = FftWorkspaceBytes(g, pass, *c, real_bytes);  // one slot, single channels
      c->slots = nominal;
      return *smallest <= pb.limit && FitBlocks(g, pass, pb.limit, real_bytes, nominal, c);
    };
    const FftSearch<Fft3dConfig> round = SearchTransformSizes<Fft3dConfig>(sizes, fit, cost);
    if (!pb.fft.found || (round.found && round.cost < pb.fft.cost)) pb.fft = round;
  }
  pb.fft.config.slots = 1;
  return pb.fft.cost;
}

// The blocks FftFinish gives `slots` slots, priced as the search prices them (FitBlocks
// weighs the 2-D filter pass's ladder, whose sweeps of tiles trade transforms against
// accumulator traffic; the other passes take the largest blocks that fit).
bool FinishBlocks(const CpuProblem& pb, int64_t slots, FftConfig* c) {
  const auto cost = [&](const FftConfig& trial) { return ReferenceCost(pb.g, pb.pass, trial); };
  return FitBlocks(pb.g, pb.pass, pb.limit, pb.req.real_bytes, slots, c, cost);
}
bool FinishBlocks(const Cpu3dProblem& pb, int64_t slots, Fft3dConfig* c) {
  return FitBlocks(pb.g, pb.pass, pb.limit, pb.req.real_bytes, slots, c);
}

template <class Pb>
int64_t FftBytes(const Pb& pb, const typename Pb::Plan&) {
  return FftWorkspaceBytes(pb.g, pb.pass, pb.fft.config, pb.req.real_bytes);
}

// Handing a parallel phase to a second thread wakes it, which costs more than a small
// pass gains: a 3x3 filter on one 8x8 image through the FFT took 54 us a call on one
// thread and 88 us on two, a 7x7 filter on 32x32 72 and 103 us (this 2-core machine, the
// op called from Python). Such a pass runs on one slot.
constexpr double kSlotStartSeconds = 30e-6;

// Spends the limit on parallelism: as many slots as useful, the largest blocks that fit,
// unless one slot is faster by the model once the wake-up is counted. Slots and blocks do
// not change the arithmetic, so this choice may depend on the thread count.
template <class Pb>
Status FftFinish(Pb& pb, typename Pb::Plan* p) {
  if (!pb.fft.found) return FftUnavailable(pb.limit, pb.fft.min_bytes, pb.pass);
  const auto& g = pb.g;
  const auto& best = pb.fft.config;
  // Blocks for `slots` slots on *trial (a copy of best); false where none fit.
  const auto finished = [&](int64_t slots, std::decay_t<decltype(best)>* trial) {
    trial->slots = slots;
    if (!FinishBlocks(pb, slots, trial)) return false;
    trial->slots = std::max<int64_t>(1, std::min(slots, ParallelItems(g, pb.pass, *trial)));
    return true;
  };
  auto c = best;
  for (int64_t slots = pb.threads; slots >= 1; --slots) {
    auto trial = best;
    if (finished(slots, &trial)) {
      c = trial;
      break;
    }
  }
  auto one = best;
  if (c.slots > 1 && finished(1, &one) &&
      LongestRunCost(g, pb.pass, one, 1) <
          LongestRunCost(g, pb.pass, c, c.slots) + kSlotStartSeconds) {
    c = one;
  }
  p->fft = c;
  p->workspace_bytes = FftWorkspaceBytes(g, pb.pass, c, pb.req.real_bytes);
  p->fft_work = CountFftWork(g, pb.pass, c);
  p->fft_work.seconds = FftCost(g, pb.pass, c, &p->flops);
  return OkStatus();
}

// TensorFlow's kernels: only where the caller (the Python layer, which runs them) allows.
// Their temporaries: a 16 MiB im2col chunk (TF's Eigen path caps its patch buffer there)
// plus a filter-sized buffer per thread (oneDNN's gradient reductions).
template <class Geometry>
int64_t TfBytesOf(const Geometry& g, int64_t threads, int real_bytes) {
  return (int64_t{16} << 20) + (threads + 1) * g.filter_elements() * real_bytes;
}
template <class Pb>
Status TfCanRun(const Pb& pb) {
  if (pb.req.allow_tf) return OkStatus();
  return InvalidArgument("algorithm='tf' is not available for this configuration");
}
template <class Pb>
double TfCost(Pb& pb, typename Pb::Plan*) {
  return TfSeconds(pb.g, pb.pass);
}
template <class Pb>
int64_t TfBytes(const Pb& pb, const typename Pb::Plan&) {
  return TfBytesOf(pb.g, pb.threads, pb.req.real_bytes);
}
template <class Pb>
Status TfFinish(Pb& pb, typename Pb::Plan* p) {
  p->workspace_bytes = TfBytes(pb, *p);
  return OkStatus();
}

// The CPU's algorithms for a problem type, simplest first (the choice keeps the earlier of
// equally cheap algorithms). The geometries differ only in the FFT's size search.
template <class Pb, double (*kFftSearch)(Pb&, typename Pb::Plan*)>
constexpr AlgorithmDescriptor<Pb, typename Pb::Plan> kCpuAlgorithms[] = {
    {Algorithm::kDirect, false, CanAlways<Pb>, DirectCost<Pb>, NoWorkspace<Pb>, DirectFinish<Pb>},
    {Algorithm::kFft, true, FftCanRun<Pb>, kFftSearch, FftBytes<Pb>, FftFinish<Pb>},
    {Algorithm::kTf, false, TfCanRun<Pb>, TfCost<Pb>, TfBytes<Pb>, TfFinish<Pb>},
};

// Plans one pass of either geometry over its algorithms.
template <class Pb, class Geometry, size_t N>
Status PlanCpuPass(const AlgorithmDescriptor<Pb, typename Pb::Plan> (&algorithms)[N],
                   const Geometry& g, ConvPass pass, const PlanRequest& req,
                   typename Pb::Plan* plan) {
  const int64_t limit = req.workspace_limit < 0 ? kDefaultWorkspaceLimit : req.workspace_limit;
  Pb pb{{g, pass, req.algorithm, limit}, req, std::max<int64_t>(1, req.threads)};
  typename Pb::Plan p;
  p.pass = pass;
  p.flops = 2.0 * g.macs();
  LC_RETURN_IF_ERROR(PlanWithAlgorithms(algorithms, "on the CPU", pb, &p));
  *plan = p;
  return OkStatus();
}

}  // namespace

const char* TfKernels() { return OneDnn() ? "onednn" : "eigen"; }

int64_t TfWorkspaceEstimate(const ConvGeometry& g, int64_t threads, int real_bytes) {
  return TfBytesOf(g, threads, real_bytes);
}

Status PlanPass(const ConvGeometry& g, ConvPass pass, const PlanRequest& req, PassPlan* plan) {
  return PlanCpuPass(kCpuAlgorithms<CpuProblem, FftSearchCost>, g, pass, req, plan);
}

Status PlanPass(const Conv3dGeometry& g, ConvPass pass, const PlanRequest& req, Pass3dPlan* plan) {
  return PlanCpuPass(kCpuAlgorithms<Cpu3dProblem, Fft3dSearchCost>, g, pass, req, plan);
}

}  // namespace largeconv
