// The CPU planner's cost model (cost_model.h): the fitted constants and the seconds they
// price each algorithm's work at.
#include "cc/core/plan/cost_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <string>

#include "cc/core/cpu/isa.h"

namespace largeconv {
namespace {

// Whether `rows` holds one row per pass, in kPasses' order.
template <class Row, size_t N>
constexpr bool ListsEveryPass(const Row (&rows)[N]) {
  if (N != std::size(kPasses)) return false;
  for (size_t i = 0; i < N; ++i) {
    if (rows[i].pass != kPasses[i]) return false;
  }
  return true;
}

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
  ConvPass pass;
  double base, at_base, peak;  // FLOP/s, lanes, FLOP/s
};
constexpr DirectRate kDirectRates[] = {
    {ConvPass::kForward, 7.87e9, 12, 39.3e9},
    {ConvPass::kBackpropInput, 4.77e9, 4, 14.5e9},
    {ConvPass::kBackpropFilter, 3.72e9, 12, 7.13e9},
};
static_assert(ListsEveryPass(kDirectRates), "a direct-kernel rate for every pass, in order");
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
// Many channels' products as matrix products (UsesGemm, cpu/fft_gemm.h): the share of the
// products' seconds above (multiply-adds and filter reads) they take, in the forward
// passes and in the filter gradient. From one-thread passes against the hand-blocked
// kernels' build (benchmarks/cpu/ab_core.py, 64 x 64 channels, 15x15 and 7x7 filters, at
// the levels that run them; docs/benchmarks.md): a pass's time ratio r where the model
// gives the products a share p of its seconds makes their own share 1 - (1 - r) / p. The
// medians over those runs, 0.47 (13 runs) and 0.77 (6), rounded up: the machine was shared.
constexpr double kGemmProductShare = 0.5, kGemmFilterProductShare = 0.8;
// Rows of height 1 (conv1d's transforms, kLineBlock in cost_model.h) cost more per point.
double LinePointFactor(const FftConfig& c) {
  if (c.fft_h != 1) return 1;
  const double lines = c.vec_block >= kLineBlock ? 1.4 : c.vec_block >= 4 ? 2.2 : 4.7;
  return lines * (c.fft_w > 16384 ? 1.3 : 1.0);
}
// The op's kernels at each instruction-set level (cpu/isa.h): the share of the seconds the
// constants above price (fitted at the AVX level) that they take at that level. To be
// measured as `LARGECONV_ISA=<level> python tools/calibrate_cpu.py --model-ratio` on one
// machine, levels alternated: a level's share is the AVX level's printed median over its
// own, times the share the model held while it ran (the FFT's configurations and the
// direct passes apart). Not measured yet (the machine was shared): every level is priced
// as AVX, so the planner chooses alike at every level.
struct LevelSpeed {
  CpuIsa isa;
  double fft, direct;  // seconds at the level / seconds at AVX
};
constexpr LevelSpeed kLevelSpeeds[] = {
    {CpuIsa::kAvx, 1.0, 1.0},
    {CpuIsa::kAvx2, 1.0, 1.0},
    {CpuIsa::kAvx512, 1.0, 1.0},
};
constexpr bool ListsEveryLevel() {
  if (std::size(kLevelSpeeds) != std::size(kCpuIsas)) return false;
  for (size_t i = 0; i < std::size(kCpuIsas); ++i) {
    if (kLevelSpeeds[i].isa != kCpuIsas[i]) return false;
  }
  return true;
}
static_assert(ListsEveryLevel(), "a speed for every instruction-set level, in order");
const LevelSpeed& Speed() { return kLevelSpeeds[static_cast<int>(ActiveCpuIsa().level)]; }
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
struct TfFit {
  ConvPass pass;
  double k[8];  // a (s/flop), b, c, d, e, f, h, g (s)
};
constexpr TfFit kTfEigen[] = {
    {ConvPass::kForward, {1.15e-11, 8.2e-11, 3.36e-11, 8.31e-10, 1.45e-9, 0, 5.18e-8, 0}},
    {ConvPass::kBackpropInput, {1.27e-11, 3.13e-10, 8.37e-13, 8.98e-9, 2.54e-9, 9e-10, 0, 0}},
    {ConvPass::kBackpropFilter, {1.45e-11, 7.16e-10, 0, 2.47e-9, 3.49e-9, 7.87e-10, 4.65e-9, 0}},
};
constexpr TfFit kTfOneDnn[] = {
    {ConvPass::kForward, {6.82e-12, 9.08e-11, 0, 1.56e-9, 1.02e-10, 1.04e-10, 6.14e-10, 49e-6}},
    {ConvPass::kBackpropInput, {6.04e-12, 0, 1.74e-10, 1.35e-9, 9.62e-11, 0, 2.37e-11, 42e-6}},
    {ConvPass::kBackpropFilter,
     {7.19e-12, 9.58e-11, 0, 1.94e-9, 9.53e-11, 1.22e-10, 3.78e-11, 108e-6}},
};
static_assert(ListsEveryPass(kTfEigen) && ListsEveryPass(kTfOneDnn),
              "a fit of TensorFlow's kernels for every pass, in order");
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

}  // namespace

double TfSeconds(const ConvGeometry& g, ConvPass pass) {
  const double* k = (OneDnn() ? kTfOneDnn : kTfEigen)[static_cast<int>(pass)].k;
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
  return TfScale() * 2.0 * g.macs() * (OneDnn() ? kTfOneDnn : kTfEigen)[0].k[0];
}

template <class Geometry>
double DirectSecondsOf(const Geometry& g, ConvPass pass, double flops) {
  const double lanes = g.channels(pass).dst_per_group;
  const DirectRate& r = kDirectRates[static_cast<int>(pass)];
  const double rate = std::min(r.peak, r.base * std::max(1.0, lanes / r.at_base));
  return Speed().direct * flops / rate;
}

double DirectSeconds(const ConvGeometry& g, ConvPass pass, double flops) {
  return DirectSecondsOf(g, pass, flops);
}
double DirectSeconds(const Conv3dGeometry& g, ConvPass pass, double flops) {
  return DirectSecondsOf(g, pass, flops);
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
FftWork CountFftWork(const ConvGeometry& g, ConvPass pass, const FftConfig& c, bool kept_filter) {
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

// Single-thread seconds of a configuration (`kept_filter`: as CountFftWork); *flops: its
// arithmetic (a real 2-D transform of N points costs about 2.5 N log2 N flops, a complex
// multiply-add 8). Runs of tiles per item (BatchesTiles) are priced as the model counts
// them, with no margin.
double FftCost(const ConvGeometry& g, ConvPass pass, const FftConfig& c, double* flops,
               bool kept_filter) {
  const FftWork w = CountFftWork(g, pass, c, kept_filter);
  const double n = static_cast<double>(c.fft_h) * c.fft_w;
  *flops = w.transform_points * 2.5 * std::log2(std::max(n, 2.0)) + 8.0 * w.complex_macs;
  const double products =
      (kSecondsPerComplexMac * w.complex_macs + kSecondsPerFilterRead * w.filter_reads) *
      (!UsesGemm(g, pass, c) ? 1.0
       : WritesFilter(pass)  ? kGemmFilterProductShare
                             : kGemmProductShare);
  return Speed().fft * (kSecondsPerTransformPoint * LinePointFactor(c) * w.transform_points +
                        kSecondsPerTransform * w.transforms + products);
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
  return Speed().fft *
         (kSecondsPerTransformPoint * w.transform_points + kSecondsPerTransform * w.transforms +
          kSecondsPerComplexMac * w.complex_macs + kSecondsPerFilterRead * w.filter_reads);
}

const char* TfKernels() { return OneDnn() ? "onednn" : "eigen"; }

int64_t TfWorkspaceEstimate(const ConvGeometry& g, int64_t threads, int real_bytes) {
  return TfBytesOf(g, threads, real_bytes);
}

}  // namespace largeconv
