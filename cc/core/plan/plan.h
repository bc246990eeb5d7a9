// The CPU planner: for each pass of a convolution, picks the algorithm (direct, FFT, or
// TensorFlow's own kernels where the caller allows them), the FFT tile, channel blocks and
// concurrent slots under a hard workspace limit, and reports the workspace bytes (exactly
// what the kernels take) and estimated FLOPs.
#ifndef TF_LARGECONV_CORE_PLAN_PLAN_H_
#define TF_LARGECONV_CORE_PLAN_PLAN_H_

#include <cstdint>
#include <string>

#include "cc/core/common/geometry.h"
#include "cc/core/common/vocabulary.h"
#include "cc/core/cpu/fft.h"
#include "cc/core/plan/search.h"

namespace largeconv {

// The parallelism the cost model prices every configuration and algorithm on: a cost is
// the time on this many threads, in single-thread seconds (cost_model.h, ReferenceCost).
constexpr int64_t kReferenceSlots = 2;

struct PlanRequest {
  Algorithm algorithm = kAutoAlgorithm;
  int64_t workspace_limit = kDefaultWorkspaceLimit;  // bytes; < 0 means the default
  int64_t threads = 1;                               // workers the caller's pool has
  int real_bytes = 4;                                // 4: float/half/bfloat16, 8: double
  bool allow_tf = false;
  bool direct_only = false;  // an integer type (kIsInt): summed exactly, never by the FFT
};

// What the FFT cost model counts for a configuration (reported so that the calibration
// measures exactly the quantities the model prices).
struct FftWork {
  double transforms = 0;        // 2-D transforms, forward and inverse
  double transform_points = 0;  // their points, summed
  double complex_macs = 0;      // spectral multiply-adds
  // Filter spectrum values the products stream from memory: one per multiply-add, except
  // where an item's run of tiles shares each value read (BatchesTiles) and the block's
  // filter spectra are too large to stay in cache from one item to the next.
  double filter_reads = 0;
  double seconds = 0;  // what the cost model prices this work at, on one thread
};

// A planned pass; Config is the FFT's configuration (FftConfig in 2-D, Fft3dConfig in 3-D).
template <class Config>
struct PassPlanOf {
  ConvPass pass = ConvPass::kForward;
  Algorithm algorithm;  // the planner's choice, never 'auto' once planned
  Config fft;           // meaningful when the FFT was chosen
  int64_t workspace_bytes = 0;
  double flops = 0;      // estimated floating-point operations
  AlgorithmCosts costs;  // cost-model seconds (one thread) of each algorithm; < 0: n/a
  FftWork fft_work;      // meaningful when the FFT was chosen
  // The FFT's cost as `costs` has it, for a call whose filter spectra were kept from an
  // earlier call of the same filter (spectrum_cache.h: the filter's transforms left out),
  // and the bytes the cache holds for them (the spectra and the filter's copy, counted at
  // real_bytes an element: twice the copy of a float16 or bfloat16 filter); < 0 and 0
  // where the FFT was not priced or keeps no spectra (the filter pass, 3-D, 'direct',
  // int32, a pass with nothing to compute, or no FFT configuration fits).
  double fft_kept_seconds = -1;
  int64_t kept_spectra_bytes = 0;
};
using PassPlan = PassPlanOf<FftConfig>;
using Pass3dPlan = PassPlanOf<Fft3dConfig>;

// Estimated temporary bytes of TensorFlow's own CPU kernels for this pass: a 16 MiB
// im2col chunk (TF's Eigen path caps its patch buffer there) plus a filter-sized buffer
// per thread (oneDNN's gradient reductions). Used to keep TF's kernels within the limit.
int64_t TfWorkspaceEstimate(const ConvGeometry& g, int64_t threads, int real_bytes);

// Which of TensorFlow's CPU kernels the planner prices TF's passes as: "onednn" where TF
// runs its oneDNN kernels (TF_ENABLE_ONEDNN_OPTS, or by default on Linux x86 CPUs with
// AVX512_VNNI, AVX512_BF16, AVX_VNNI or AMX), "eigen" otherwise. Decided once, on the
// first call, as TF decides it once.
const char* TfKernels();

// Returns OK and fills `plan`, or an error (e.g. the FFT was requested but even its
// smallest configuration needs more than the limit: the message names the minimum).
Status PlanPass(const ConvGeometry& g, ConvPass pass, const PlanRequest& req, PassPlan* plan);

// The same for three spatial dimensions, through the same choice over the same algorithms
// (direct, fft, tf) and the same cost model.
Status PlanPass(const Conv3dGeometry& g, ConvPass pass, const PlanRequest& req, Pass3dPlan* plan);

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_PLAN_PLAN_H_
