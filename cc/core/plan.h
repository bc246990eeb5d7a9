// The planner: for each pass of a convolution, picks the algorithm (direct or FFT), the FFT
// tile, channel blocks and concurrent slots under a hard workspace limit, and reports the
// workspace bytes (exactly what the kernels take) and estimated FLOPs.
#ifndef TF_LARGECONV_CORE_PLAN_H_
#define TF_LARGECONV_CORE_PLAN_H_

#include <cstdint>
#include <string>

#include "cc/core/fft.h"
#include "cc/core/geometry.h"

namespace largeconv {

// kTf: TensorFlow's own tf.nn.conv2d kernels. Only the Python layer can run them, so only
// a request with allow_tf (made there, for configurations TF's CPU kernels support) may be
// planned onto them; the op itself never is.
enum class Algorithm { kAuto, kDirect, kFft, kTf };

// Inline, so the CUDA module, which links no planner of the CPU, has them too.
inline std::string ParseAlgorithm(const std::string& s, Algorithm* out) {
  if (s == "auto") { *out = Algorithm::kAuto; return ""; }
  if (s == "direct") { *out = Algorithm::kDirect; return ""; }
  if (s == "fft") { *out = Algorithm::kFft; return ""; }
  if (s == "tf") { *out = Algorithm::kTf; return ""; }
  return "algorithm must be 'auto', 'direct', 'fft' or 'tf', got '" + s + "'";
}

inline const char* AlgorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kAuto: return "auto";
    case Algorithm::kDirect: return "direct";
    case Algorithm::kFft: return "fft";
    case Algorithm::kTf: return "tf";
  }
  return "?";
}

constexpr int64_t kDefaultWorkspaceLimit = int64_t{64} << 20;  // 64 MiB

struct PlanRequest {
  Algorithm algorithm = Algorithm::kAuto;
  int64_t workspace_limit = kDefaultWorkspaceLimit;  // bytes; < 0 means the default
  int64_t threads = 1;                               // workers the caller's pool has
  int real_bytes = 4;                                // 4: float/half/bfloat16, 8: double
  bool allow_tf = false;
};

struct PassPlan {
  ConvPass pass = ConvPass::kForward;
  Algorithm algorithm = Algorithm::kDirect;  // never kAuto once planned
  FftConfig fft;                             // meaningful when algorithm == kFft
  FftTiling tiling{};
  int64_t workspace_bytes = 0;
  double flops = 0;        // estimated floating-point operations
  double cost_direct = 0;  // cost-model seconds (one thread) of each algorithm; <0: n/a
  double cost_fft = -1;
  double cost_tf = -1;
};

// Estimated temporary bytes of TensorFlow's own CPU kernels for this pass: a 16 MiB
// im2col chunk (TF's Eigen path caps its patch buffer there) plus a filter-sized buffer
// per thread (oneDNN's gradient reductions). Used to keep kTf within the limit.
int64_t TfWorkspaceEstimate(const ConvGeometry& g, int64_t threads, int real_bytes);

// Returns "" and fills `plan`, or an error (e.g. the FFT was requested but even its
// smallest configuration needs more than the limit: the message names the minimum).
std::string PlanPass(const ConvGeometry& g, ConvPass pass, const PlanRequest& req,
                     PassPlan* plan);

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_PLAN_H_
