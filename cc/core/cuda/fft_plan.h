// Planning of a pass on the GPU: the direct tile kernels or the FFT path (cuFFT transforms
// plus the element kernels of fft_pipeline.h), chosen by a cost model under the workspace
// limit. CUDA-free: the device launcher (fft.cu), the host emulation (emulate.h) and the
// adapters share this one description of the work and of the workspace bytes.
#ifndef TF_LARGECONV_CORE_CUDA_FFT_PLAN_H_
#define TF_LARGECONV_CORE_CUDA_FFT_PLAN_H_

#include <cstdint>
#include <functional>
#include <string>

#include "cc/core/common/geometry.h"
#include "cc/core/common/status.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cuda/tiles.h"
#include "cc/core/plan/search.h"
#include "cc/core/plan/tiling.h"

namespace largeconv {
namespace cuda {

// The FFT path cuts a pass into overlap-save tiles (MakeFftTiling, shared with the CPU) and
// runs `chunk` of the batch x tiles "items" per round: every transform of a round is one
// batched in-place cuFFT call. Spectra are fft_d x fft_h x (fft_w / 2 + 1) complex bins,
// stored contiguously; a real plane (volume) sits in the same place with rows padded to
// 2 (fft_w / 2 + 1). A 2-D pass has fft_d = 1 and one tile of depth 1; a 3-D pass tiles
// depth as the CPU's 3-D tiling does (height and width in `tiling`, without wrap-around).
struct GpuFftConfig {
  int64_t fft_h = 0, fft_w = 0;
  FftTiling tiling{};
  int64_t fft_d = 1;
  int64_t dense_d = 1, tile_d = 1, tiles_d = 1;  // the tiling's depth
  int64_t items = 0;                             // batch x tiles per image
  int64_t chunk = 0;                             // items per round
  int rank() const { return fft_d > 1 ? 3 : 2; }
};

// Byte offsets of the FFT path's workspace, one formula for the launcher, the emulation and
// the reported workspace size. Every array starts on a 256-byte boundary.
//   flag:    one int, set when an operand holds Inf or NaN (the direct kernels then redo
//            the pass exactly, as the CPU path does; see fft_pipeline.h)
//   filters: forward / backprop-input: the filter spectra, (group, source ch, dest ch);
//            backprop-filter: the gradient spectra being accumulated, (group, in, out)
//   src:     a round's source transforms, (item, source channel)
//   dst:     forward / backprop-input: the round's products, (item, dest channel);
//            backprop-filter: the round's out_backprop transforms, (item, out channel)
//   work:    cuFFT's work area (the largest any of the pass's transforms asks for)
// The direct fallback's own workspace reuses everything after the flag: it runs after the
// FFT path is done with it, in stream order.
struct GpuFftLayout {
  int64_t bins = 0;            // complex bins per spectrum
  int64_t spectrum_reals = 0;  // = 2 * bins: a spectrum's (and a padded plane's) reals
  int64_t filter_spectra = 0, src_channels = 0, dst_channels = 0;
  int64_t filters = 0, src = 0, dst = 0;  // byte offsets
  int64_t fft_bytes = 0;                  // end of dst, where cuFFT's work area starts
};
constexpr int64_t kFlagBytes = 256;

// Destination channels (in backprop-filter, output channels) one thread of the product
// kernels (fft_pipeline.h) owns: each source value it reads serves that many outputs.
constexpr int kChannelBlock = 4;
GpuFftLayout MakeGpuFftLayout(const ConvGeometry& g, ConvPass pass, const GpuFftConfig& c,
                              int real_bytes);
GpuFftLayout MakeGpuFftLayout(const Conv3dGeometry& g, ConvPass pass, const GpuFftConfig& c,
                              int real_bytes);

// One batched in-place transform of `batch` planes of fft_h x fft_w (volumes of fft_d x
// fft_h x fft_w when fft_d > 1: a rank-3 transform).
struct TransformShape {
  bool inverse = false;  // false: real to complex, true: complex to real
  int real_bytes = 4;    // 4: single precision, 8: double
  int64_t fft_h = 0, fft_w = 0, batch = 0;
  int64_t fft_d = 1;
};
// Every transform a pass runs with this config (at most five distinct shapes).
std::vector<TransformShape> PassTransforms(const ConvGeometry& g, ConvPass pass,
                                           const GpuFftConfig& c, int real_bytes);
std::vector<TransformShape> PassTransforms(const Conv3dGeometry& g, ConvPass pass,
                                           const GpuFftConfig& c, int real_bytes);

// A transform library's work-area bytes for a shape, or < 0 (with *error set) if it cannot
// make that transform. The device asks cuFFT; the host emulation needs none.
using WorkBytesFn = std::function<int64_t(const TransformShape&, Status* error)>;

// The FFT path's cost-model terms (fft_plan.cc), for fitting its rates
// (benchmarks/gpu/fft_steps.py).
struct FftModelTerms {
  double transform_bytes = 0, product_bytes = 0, launches = 0;
};

// The GPU's algorithms, by the names the project's one list gives them (CpuAlgorithms,
// plan/cpu_algorithms.h; the bindings check at compile time that each is listed there), and
// TensorFlow's own GPU kernels (cuDNN, listed as 'tf'), which a plan prices but never runs.
inline constexpr Algorithm kGpuDirect{"direct"}, kGpuFft{"fft"}, kCudnn{"tf"};

struct CudaPlan {
  ConvPass pass = ConvPass::kForward;
  Algorithm algorithm = kGpuDirect;  // kGpuDirect or kGpuFft
  // The direct kernels; with kGpuFft, the exact redo for non-finite input.
  TileConfig direct;
  GpuFftConfig fft;            // with kGpuFft
  int64_t fft_work_bytes = 0;  // cuFFT's work area (kGpuFft)
  FftModelTerms fft_terms;     // with kGpuFft
  int64_t workspace_bytes = 0;
  // Cost-model seconds of each algorithm; < 0: not available. kCudnn's: cuDNN (TensorFlow's
  // GPU kernel) on the same pass, never run by these kernels, weighed by the caller that can
  // route the whole convolution there.
  AlgorithmCosts costs;
};

// Whether cuDNN's modelled time beats the algorithm this plan chose.
//
// A caller routing a whole convolution by this (tf_largeconv's 'auto' under TensorFlow on
// a GPU) asks it for a batch of kRouteBatch images, whatever the actual batch: the choice
// must not depend on a batch size a graph may not know, and at one image the kernels'
// launch costs, not their work, would decide it.
constexpr int64_t kRouteBatch = 8;
inline bool TfFaster(const CudaPlan& p) {
  const double tf = p.costs[kCudnn];
  return tf >= 0 && tf < p.costs[p.algorithm];
}

// Plans a pass. algorithm: kAutoAlgorithm, kGpuDirect or kGpuFft (any other is refused).
// `work_bytes` is null when no transform library is loaded (then only the direct kernels
// can run, and `fft_unavailable` says why, for an explicit request of the FFT path).
// Returns OK or an error naming what does not fit.
Status PlanGpuPass(const ConvGeometry& g, ConvPass pass, Algorithm algorithm, int real_bytes,
                   int64_t workspace_limit, const WorkBytesFn* work_bytes,
                   const std::string& fft_unavailable, CudaPlan* plan);
// The same for a Conv3D pass: the direct tile kernels or the FFT path with rank-3
// transforms, by the same search, cost model and workspace rule.
Status PlanGpuPass(const Conv3dGeometry& g, ConvPass pass, Algorithm algorithm, int real_bytes,
                   int64_t workspace_limit, const WorkBytesFn* work_bytes,
                   const std::string& fft_unavailable, CudaPlan* plan);

}  // namespace cuda
}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CUDA_FFT_PLAN_H_
