// OpKernels of the LargeConv family: attrs are read once at construction, shapes are
// checked at the top of Compute. On the CPU the framework-free core does the arithmetic on
// TF's intra-op thread pool; on a GPU (built with LARGECONV_WITH_CUDA, when nvcc is found)
// the CUDA kernels run on the op's stream, their workspace taken through allocate_temp.
#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cc/core/common/dtypes.h"
#include "cc/core/common/geometry.h"
#include "cc/core/common/memory.h"
#include "cc/core/conv.h"
#include "cc/core/cpu/isa.h"
#include "cc/core/cpu/spectrum_cache.h"
#include "cc/core/plan/cpu_algorithms.h"
#include "cc/core/plan/plan.h"
#include "cc/tf/attrs.h"
#include "cc/tf/workspace_pool.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/platform/threadpool.h"

#ifdef LARGECONV_WITH_CUDA
#include "cc/core/cuda/launch.h"
#include "xla/stream_executor/stream.h"
#endif

namespace largeconv {
namespace {

using tensorflow::OpKernel;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;

// TensorFlow's element type for each core storage type (same bits, no conversion).
template <typename C>
struct TfType {
  using type = C;
};
template <>
struct TfType<f16> {
  using type = Eigen::half;
};
template <>
struct TfType<bf16> {
  using type = Eigen::bfloat16;
};
template <typename C>
using TfT = typename TfType<C>::type;
static_assert(sizeof(Eigen::half) == sizeof(f16), "half layout");
static_assert(sizeof(Eigen::bfloat16) == sizeof(bf16), "bfloat16 layout");

template <typename C>
const C* CorePtr(const Tensor& t) {
  return reinterpret_cast<const C*>(t.flat<TfT<C>>().data());
}
template <typename C>
C* CorePtr(Tensor* t) {
  return reinterpret_cast<C*>(t->flat<TfT<C>>().data());
}

// Plans depend only on the operand shapes and the thread count (a kernel's attrs are
// fixed): each kernel caches them, so a training loop plans each shape once. Shared by
// the 2-D and 3-D kernels; Key is anything that identifies the shapes.
template <typename Key, typename Plan>
class PlanCache {
 public:
  template <typename PlanFn>
  absl::Status Get(const Key& key, int64_t threads, PlanFn plan_fn, Plan* plan) {
    const std::pair<Key, int64_t> k{key, threads};
    {
      tensorflow::mutex_lock lock(mu_);
      auto it = plans_.find(k);
      if (it != plans_.end()) {
        *plan = it->second;
        return absl::OkStatus();
      }
    }
    TF_RETURN_IF_ERROR(plan_fn(plan));
    tensorflow::mutex_lock lock(mu_);
    if (plans_.size() >= kMaxCachedPlans) plans_.clear();
    plans_.emplace(k, *plan);
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kMaxCachedPlans = 64;
  tensorflow::mutex mu_;
  std::map<std::pair<Key, int64_t>, Plan> plans_ TF_GUARDED_BY(mu_);
};

ParallelFor PoolFor(OpKernelContext* ctx) {
  auto* pool = ctx->device()->tensorflow_cpu_worker_threads()->workers;
  return [pool](int64_t total, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
    if (total <= 0) return;
    if (total <= pool->NumThreads()) {
      // A few heavy units (FFT slots): one shard each. The cost-based ParallelFor can
      // leave such a range on a single thread.
      pool->TransformRangeConcurrently(1, total, fn);
    } else {
      pool->ParallelFor(total, cost, fn);
    }
  };
}

absl::Status ShapeOf(const Tensor& t, const char* name, std::array<int64_t, 4>* out) {
  if (t.dims() != 4) return NotRank4(name, t.shape().DebugString(), t.dims());
  for (int i = 0; i < 4; ++i) (*out)[i] = t.dim_size(i);
  return absl::OkStatus();
}

// The int32 vector `name` (input_sizes or filter_sizes) of the backprop op `op`, checked
// to be a vector of 4 non-negative sizes, or of 2 where `spatial_ok` (input_sizes may give
// the height and width alone, as TensorFlow's Conv2DBackpropInput accepts).
absl::Status SizesOf(const Tensor& t, const char* name, const char* op, bool spatial_ok,
                     std::vector<int64_t>* out) {
  if (t.dims() != 1) return SizesNotVector(name, op, t.shape().DebugString(), t.dims());
  if (t.NumElements() != 4 && !(spatial_ok && t.NumElements() == 2)) {
    return WrongSizesCount(name, op, spatial_ok, t.NumElements());
  }
  auto v = t.vec<int32_t>();
  out->clear();
  for (int i = 0; i < t.NumElements(); ++i) {
    if (v(i) < 0) return NegativeSize(name, v(i));
    out->push_back(v(i));
  }
  return absl::OkStatus();
}

// The input's shape for Conv2DBackpropInput: input_sizes itself, or, from its two spatial
// sizes, with the batch of out_backprop and the depth of the filter's dimension 2 (as
// TensorFlow takes them, so a grouped filter gives one group).
absl::Status InputShapeOf(OpKernelContext* ctx, DataFormat format, std::array<int64_t, 4>* out) {
  std::vector<int64_t> sizes;
  TF_RETURN_IF_ERROR(
      SizesOf(ctx->input(0), "input_sizes", "Conv2DBackpropInput", /*spatial_ok=*/true, &sizes));
  if (sizes.size() == 4) {
    std::copy(sizes.begin(), sizes.end(), out->begin());
    return absl::OkStatus();
  }
  std::array<int64_t, 4> filter, dy;
  TF_RETURN_IF_ERROR(ShapeOf(ctx->input(1), "filter", &filter));
  TF_RETURN_IF_ERROR(ShapeOf(ctx->input(2), "out_backprop", &dy));
  *out = format == DataFormat::kNHWC ? std::array<int64_t, 4>{dy[0], sizes[0], sizes[1], filter[2]}
                                     : std::array<int64_t, 4>{dy[0], filter[2], sizes[0], sizes[1]};
  return absl::OkStatus();
}

absl::Status FilterShapeOf(OpKernelContext* ctx, std::array<int64_t, 4>* out) {
  std::vector<int64_t> sizes;
  TF_RETURN_IF_ERROR(SizesOf(ctx->input(1), "filter_sizes", "Conv2DBackpropFilter",
                             /*spatial_ok=*/false, &sizes));
  std::copy(sizes.begin(), sizes.end(), out->begin());
  return absl::OkStatus();
}

TensorShape ToShape(const std::array<int64_t, 4>& s) {
  return TensorShape({s[0], s[1], s[2], s[3]});
}

// What a call of the family's ops asks: the plan's algorithm and workspace_limit, and
// whether the call may keep memory for later calls (keep_memory: its workspace in the pool,
// workspace_pool.h; its filter spectra, spectrum_cache.h).
struct CallRequest {
  PlanRequest plan;
  bool keep_memory = true;
};

// The attributes every op of the family has.
absl::Status ReadRequest(OpKernelConstruction* ctx, CallRequest* request) {
  std::string algorithm;
  TF_RETURN_IF_ERROR(ctx->GetAttr("algorithm", &algorithm));
  TF_RETURN_IF_ERROR(ToStatus(ParseAlgorithm(algorithm, &request->plan.algorithm)));
  TF_RETURN_IF_ERROR(ctx->GetAttr("keep_memory", &request->keep_memory));
  return ctx->GetAttr("workspace_limit", &request->plan.workspace_limit);
}

// The request for one pass of element type T on this device's thread pool.
template <typename T>
PlanRequest DeviceRequest(OpKernelContext* ctx, PlanRequest req) {
  req.threads = ctx->device()->tensorflow_cpu_worker_threads()->num_threads;
  req.real_bytes = kComputeBytes<T>;
  req.direct_only = kIsInt<T>;
  return req;
}

// Takes a plan's workspace (if any) from the pool of workspaces kept between calls or else
// from TF's allocator (cc/tf/workspace_pool.h), and asks for huge pages on a fresh one and
// on the pass's output: both are as a rule mapped fresh (large allocations) and then
// written in full. With 4 KiB pages a long conv1d pass takes 8192 page faults a call on
// its 32 MiB output alone, and kernel time is 20-30% of its CPU time.
template <class Plan>
absl::Status AllocateWorkspace(OpKernelContext* ctx, const Plan& plan, bool keep, Tensor* out,
                               PooledWorkspace* workspace) {
  AdviseHugePages(out->data(), static_cast<int64_t>(out->TotalBytes()));
  if (plan.workspace_bytes > 0) {
    bool fresh = false;
    TF_RETURN_IF_ERROR(workspace->Acquire(ctx, plan.workspace_bytes, keep, &fresh));
    if (fresh) AdviseHugePages(workspace->data(), plan.workspace_bytes);
  }
  return absl::OkStatus();
}

#ifdef LARGECONV_WITH_CUDA
// Plans a pass for the op's device (the direct tile kernels or the FFT path through cuFFT,
// found at run time), takes the workspace through allocate_temp and enqueues on the op's
// stream. Geometry: ConvGeometry or Conv3dGeometry.
template <typename T, class Geometry>
void RunOnGpu(OpKernelContext* ctx, const Geometry& g, ConvPass pass, const PlanRequest& request,
              const Tensor& a, const Tensor& b, Tensor* out) {
  cuda::CudaPlan plan;  // PlanCudaPass caches plans per geometry and device
  OP_REQUIRES_OK(ctx, ToStatus(cuda::PlanCudaPass(g, pass, request.algorithm, kComputeBytes<T>,
                                                  request.workspace_limit, &plan)));
  const int64_t bytes = plan.workspace_bytes;
  Tensor workspace;
  if (bytes > 0) {
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT8, TensorShape({bytes}), &workspace));
  }
  auto* stream = ctx->op_device_context() ? ctx->op_device_context()->stream() : nullptr;
  OP_REQUIRES(ctx, stream != nullptr,
              tensorflow::errors::Internal("the GPU op has no stream to run on"));
  const auto handle = static_cast<cuda::Stream>(stream->platform_specific_handle().stream);
  OP_REQUIRES_OK(ctx,
                 ToStatus(cuda::RunCudaPass(g, plan, CorePtr<T>(a), CorePtr<T>(b), CorePtr<T>(out),
                                            bytes > 0 ? workspace.data() : nullptr, handle)));
}
#endif

// Runs one pass on operands in the pass's order: on the op's GPU (kGpu), or planned for
// this device's thread pool (the plan cached in `plans` under `key`, the shapes that
// determine the geometry) with its workspace from AllocateWorkspace, keeping memory for
// later calls only where the request allows it. Geometry: ConvGeometry or Conv3dGeometry.
template <typename T, bool kGpu, class Geometry, typename Key, typename Plan>
void PlanAndRun(OpKernelContext* ctx, const Geometry& g, ConvPass pass, const CallRequest& request,
                PlanCache<Key, Plan>& plans, const Key& key, const Tensor& a, const Tensor& b,
                Tensor* out) {
#ifdef LARGECONV_WITH_CUDA
  if constexpr (kGpu) {
    RunOnGpu<T>(ctx, g, pass, request.plan, a, b, out);  // no pool or spectrum cache there
    return;
  }
#endif
  Plan plan;
  const PlanRequest req = DeviceRequest<T>(ctx, request.plan);
  OP_REQUIRES_OK(ctx, plans.Get(
                          key, req.threads,
                          [&](Plan* p) { return ToStatus(PlanPass(g, pass, req, p)); }, &plan));
  if constexpr (std::is_same_v<Plan, PassPlan>) plan.fft.keep_spectra = request.keep_memory;
  PooledWorkspace workspace;
  OP_REQUIRES_OK(ctx, AllocateWorkspace(ctx, plan, request.keep_memory, out, &workspace));
  RunPass(g, plan, CorePtr<T>(a), a.NumElements(), CorePtr<T>(b), b.NumElements(), CorePtr<T>(out),
          plan.workspace_bytes > 0 ? workspace.data() : nullptr, PoolFor(ctx));
}

class ConvOpBase : public OpKernel {
 public:
  explicit ConvOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadConvAttrs(ctx, &attrs_));
    OP_REQUIRES_OK(ctx, ReadRequest(ctx, &request_));
  }

 protected:
  // Plans, allocates the workspace and runs one pass on operands in the pass's order.
  template <typename T, bool kGpu>
  void Run(OpKernelContext* ctx, const ConvGeometry& g, ConvPass pass, const Tensor& a,
           const Tensor& b, Tensor* out) {
    PlanAndRun<T, kGpu>(ctx, g, pass, request_, plans_, g.key(), a, b, out);
  }

  ConvAttrs attrs_;
  CallRequest request_;
  PlanCache<ConvGeometry::Key, PassPlan> plans_;
};

// One kernel class for the three ops, driven by the pass's operand roles. Their inputs
// line up: input 0 describes the convolution's input and input 1 its filter, each as the
// tensor itself or, for the one the pass writes, as its sizes (input_sizes, filter_sizes);
// the backprop ops take out_backprop as input 2.
template <typename T, bool kGpu, ConvPass kPass>
class ConvPassOp : public ConvOpBase {
 public:
  using ConvOpBase::ConvOpBase;
  void Compute(OpKernelContext* ctx) override {
    constexpr PassRoles kRoles = RolesOf(kPass);
    std::array<int64_t, 4> in_shape, f_shape;
    OP_REQUIRES_OK(ctx, kRoles.out == ConvTensor::kInput
                            ? InputShapeOf(ctx, attrs_.data_format, &in_shape)
                            : ShapeOf(ctx->input(0), "input", &in_shape));
    OP_REQUIRES_OK(ctx, kRoles.out == ConvTensor::kFilter
                            ? FilterShapeOf(ctx, &f_shape)
                            : ShapeOf(ctx->input(1), "filter", &f_shape));
    ConvGeometry g;
    OP_REQUIRES_OK(ctx, ToStatus(MakeGeometry(attrs_, in_shape, f_shape, &g, WindowRuleOf(kPass))));
    if (kPass != ConvPass::kForward) {
      std::array<int64_t, 4> dy;
      OP_REQUIRES_OK(ctx, ShapeOf(ctx->input(2), "out_backprop", &dy));
      OP_REQUIRES_OK(ctx, ToStatus(CheckOutBackprop(g, dy)));
    }
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ToShape(g.shape(kRoles.out)), &out));
    const auto operand = [ctx](ConvTensor t) -> const Tensor& {
      return ctx->input(t == ConvTensor::kInput ? 0 : t == ConvTensor::kFilter ? 1 : 2);
    };
    Run<T, kGpu>(ctx, g, kPass, operand(kRoles.a), operand(kRoles.b), out);
  }
};

// --- Three spatial dimensions (CPU) --------------------------------------------------------

absl::Status Shape5Of(const Tensor& t, const char* name, Shape5* out) {
  if (t.dims() != 5) return NotRank(name, t.shape().DebugString(), t.dims(), 5);
  for (int i = 0; i < 5; ++i) (*out)[i] = t.dim_size(i);
  return absl::OkStatus();
}

// input_sizes or filter_sizes of a 3-D backprop op: a vector of 5 non-negative sizes.
absl::Status Sizes5Of(const Tensor& t, const char* name, Shape5* out) {
  if (t.dims() != 1 || t.NumElements() != 5) {
    return tensorflow::errors::InvalidArgument(name, " must be a vector of 5 sizes, got shape ",
                                               t.shape().DebugString());
  }
  auto v = t.vec<int32_t>();
  for (int i = 0; i < 5; ++i) {
    if (v(i) < 0) return NegativeSize(name, v(i));
    (*out)[i] = v(i);
  }
  return absl::OkStatus();
}

// The three Conv3D ops, as ConvPassOp runs the 2-D ones: inputs 0 and 1 describe the input
// and the filter (the tensor, or the sizes of the one the pass writes), input 2 is
// out_backprop. kGpu: the CUDA kernels on the op's device.
template <typename T, bool kGpu, ConvPass kPass>
class Conv3dPassOp : public OpKernel {
 public:
  explicit Conv3dPassOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadConv3dAttrs(ctx, &attrs_));
    OP_REQUIRES_OK(ctx, ReadRequest(ctx, &request_));
  }

  void Compute(OpKernelContext* ctx) override {
    constexpr PassRoles kRoles = RolesOf(kPass);
    Shape5 in_shape, f_shape;
    OP_REQUIRES_OK(ctx, kRoles.out == ConvTensor::kInput
                            ? Sizes5Of(ctx->input(0), "input_sizes", &in_shape)
                            : Shape5Of(ctx->input(0), "input", &in_shape));
    OP_REQUIRES_OK(ctx, kRoles.out == ConvTensor::kFilter
                            ? Sizes5Of(ctx->input(1), "filter_sizes", &f_shape)
                            : Shape5Of(ctx->input(1), "filter", &f_shape));
    Conv3dGeometry g;
    OP_REQUIRES_OK(ctx, ToStatus(MakeGeometry(attrs_, in_shape, f_shape, &g, WindowRuleOf(kPass))));
    if (kPass != ConvPass::kForward) {
      Shape5 dy;
      OP_REQUIRES_OK(ctx, Shape5Of(ctx->input(2), "out_backprop", &dy));
      OP_REQUIRES_OK(ctx, ToStatus(CheckOutBackprop(g, dy)));
    }
    const Shape5 shape = g.shape(kRoles.out);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape(shape), &out));
    const auto operand = [ctx](ConvTensor t) -> const Tensor& {
      return ctx->input(t == ConvTensor::kInput ? 0 : t == ConvTensor::kFilter ? 1 : 2);
    };
    // The shapes determine the geometry (the attrs are the kernel's own).
    const std::pair<Shape5, Shape5> shapes{in_shape, f_shape};
    PlanAndRun<T, kGpu>(ctx, g, kPass, request_, plans_, shapes, operand(kRoles.a),
                        operand(kRoles.b), out);
  }

 private:
  Conv3dAttrs attrs_;
  CallRequest request_;
  PlanCache<std::pair<Shape5, Shape5>, Pass3dPlan> plans_;
};

// LargeConv>Conv2DRoute: its output is its first input, forwarded without a copy; what it
// adds is its registered gradient, which reads the route (see the op's doc).
class RouteOp : public OpKernel {
 public:
  explicit RouteOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    std::string route;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("route", &route));
    OP_REQUIRES(ctx, !route.empty(),
                tensorflow::errors::InvalidArgument(
                    "route must be the JSON of a convolution's attributes and routes, got an "
                    "empty string"));
  }
  void Compute(OpKernelContext* ctx) override { ctx->set_output(0, ctx->input(0)); }
};

// Kernels are templated on the core storage type and registered for its TF type: OP's
// three passes (OP: Conv2D or Conv3D) run by KERNEL (ConvPassOp or Conv3dPassOp).
#define LARGECONV_REGISTER_OP(OP, KERNEL, DEVICE, C, GPU)                                   \
  REGISTER_KERNEL_BUILDER(Name("LargeConv>" OP).Device(DEVICE).TypeConstraint<TfT<C>>("T"), \
                          KERNEL<C, GPU, ConvPass::kForward>);                              \
  REGISTER_KERNEL_BUILDER(Name("LargeConv>" OP "BackpropInput")                             \
                              .Device(DEVICE)                                               \
                              .TypeConstraint<TfT<C>>("T")                                  \
                              .HostMemory("input_sizes"),                                   \
                          KERNEL<C, GPU, ConvPass::kBackpropInput>);                        \
  REGISTER_KERNEL_BUILDER(Name("LargeConv>" OP "BackpropFilter")                            \
                              .Device(DEVICE)                                               \
                              .TypeConstraint<TfT<C>>("T")                                  \
                              .HostMemory("filter_sizes"),                                  \
                          KERNEL<C, GPU, ConvPass::kBackpropFilter>);
// Both ops' passes for type C on DEVICE (GPU: the CUDA kernels).
#define LARGECONV_REGISTER(DEVICE, C, GPU)                    \
  LARGECONV_REGISTER_OP("Conv2D", ConvPassOp, DEVICE, C, GPU) \
  LARGECONV_REGISTER_OP("Conv3D", Conv3dPassOp, DEVICE, C, GPU)
#define LARGECONV_REGISTER_CPU(C, NAME, TF_WORD) \
  LARGECONV_REGISTER(tensorflow::DEVICE_CPU, C, false)
LARGECONV_FOR_EACH_DTYPE(LARGECONV_REGISTER_CPU)
#undef LARGECONV_REGISTER_CPU
REGISTER_KERNEL_BUILDER(Name("LargeConv>Conv2DRoute").Device(tensorflow::DEVICE_CPU), RouteOp);
#ifdef LARGECONV_WITH_CUDA
// The floating types only: the CUDA kernels take no integer type (TensorFlow keeps int32
// tensors of GPU kernels in host memory), so an int32 call is placed on the CPU.
#define LARGECONV_REGISTER_GPU(C, NAME, TF_WORD) LARGECONV_REGISTER(tensorflow::DEVICE_GPU, C, true)
LARGECONV_FOR_EACH_FLOAT_DTYPE(LARGECONV_REGISTER_GPU)
#undef LARGECONV_REGISTER_GPU
REGISTER_KERNEL_BUILDER(Name("LargeConv>Conv2DRoute").Device(tensorflow::DEVICE_GPU), RouteOp);
#endif
#undef LARGECONV_REGISTER
#undef LARGECONV_REGISTER_OP

}  // namespace
}  // namespace largeconv

// The instruction-set level this library's CPU kernels run at (cc/core/cpu/isa.h), for
// tf_largeconv.info(): the library chooses it on its own first use, as _core does.
extern "C" __attribute__((visibility("default"))) const char* LargeConvCpuIsa() {
  return largeconv::CpuIsaName(largeconv::ActiveCpuIsa().level);
}

// What this library's filter-spectrum cache holds (cc/core/cpu/spectrum_cache.h), for the
// package's tests (tf_largeconv/_loader.py reads it by ctypes): entries and their bytes.
extern "C" __attribute__((visibility("default"))) void LargeConvSpectrumCacheStats(int64_t* entries,
                                                                                   int64_t* bytes) {
  largeconv::SpectrumCache& cache = largeconv::SpectrumCache::Global();
  *entries = cache.entries();
  *bytes = cache.bytes_held();
}
