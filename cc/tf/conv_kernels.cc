// OpKernels of the LargeConv family: attrs are read once at construction, shapes are
// checked at the top of Compute. On the CPU the framework-free core does the arithmetic on
// TF's intra-op thread pool; on a GPU (built with LARGECONV_WITH_CUDA, when nvcc is found)
// the CUDA kernels run on the op's stream, their workspace taken through allocate_temp.
#include <array>
#include <map>
#include <string>

#include "cc/core/conv.h"
#include "cc/core/dtypes.h"
#include "cc/core/geometry.h"
#include "cc/core/plan.h"
#include "cc/tf/attrs.h"
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

// Core storage type for each TF element type (same bits, no conversion).
template <typename T>
struct CoreType {
  using type = T;
};
template <>
struct CoreType<Eigen::half> {
  using type = f16;
};
template <>
struct CoreType<Eigen::bfloat16> {
  using type = bf16;
};
static_assert(sizeof(Eigen::half) == sizeof(f16), "half layout");
static_assert(sizeof(Eigen::bfloat16) == sizeof(bf16), "bfloat16 layout");

template <typename T>
const typename CoreType<T>::type* CorePtr(const Tensor& t) {
  return reinterpret_cast<const typename CoreType<T>::type*>(t.flat<T>().data());
}
template <typename T>
typename CoreType<T>::type* CorePtr(Tensor* t) {
  return reinterpret_cast<typename CoreType<T>::type*>(t->flat<T>().data());
}

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
  if (t.dims() != 4) {
    return tensorflow::errors::InvalidArgument(name, " must be a 4-D tensor, got shape ",
                                               t.shape().DebugString());
  }
  for (int i = 0; i < 4; ++i) (*out)[i] = t.dim_size(i);
  return absl::OkStatus();
}

absl::Status SizesOf(const Tensor& t, const char* name, std::array<int64_t, 4>* out) {
  if (t.dims() != 1 || t.NumElements() != 4) {
    return tensorflow::errors::InvalidArgument(name, " must be a vector of 4 sizes, got shape ",
                                               t.shape().DebugString());
  }
  auto v = t.vec<int32_t>();
  for (int i = 0; i < 4; ++i) {
    if (v(i) < 0) {
      return tensorflow::errors::InvalidArgument(name, " must be non-negative, got ",
                                                 t.DebugString());
    }
    (*out)[i] = v(i);
  }
  return absl::OkStatus();
}

TensorShape ToShape(const std::array<int64_t, 4>& s) {
  return TensorShape({s[0], s[1], s[2], s[3]});
}

absl::Status CheckOutBackprop(const Tensor& dy, const ConvGeometry& g) {
  std::array<int64_t, 4> got;
  TF_RETURN_IF_ERROR(ShapeOf(dy, "out_backprop", &got));
  if (got != g.output_shape()) {
    return tensorflow::errors::InvalidArgument(
        "out_backprop has shape ", dy.shape().DebugString(),
        " but the convolution produces ", ToShape(g.output_shape()).DebugString());
  }
  return absl::OkStatus();
}

class ConvOpBase : public OpKernel {
 public:
  explicit ConvOpBase(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ReadConvAttrs(ctx, &attrs_));
    std::string algorithm;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("algorithm", &algorithm));
    OP_REQUIRES_OK(ctx, ToStatus(ParseAlgorithm(algorithm, &request_.algorithm)));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("workspace_limit", &request_.workspace_limit));
  }

 protected:
  // Plans the pass for this geometry and this device's thread pool, and takes the plan's
  // workspace (if any) from TF's allocator so that it is counted and bounded.
  template <typename T>
  absl::Status PlanAndAllocate(OpKernelContext* ctx, const ConvGeometry& g, ConvPass pass,
                               PassPlan* plan, Tensor* workspace) {
    PlanRequest req = request_;
    req.threads = ctx->device()->tensorflow_cpu_worker_threads()->num_threads;
    req.real_bytes = sizeof(AccT<typename CoreType<T>::type>);
    // Plans depend only on the shapes here (attrs are fixed per kernel): cache them, so a
    // training loop plans each shape once.
    const PlanKey key{g.batch, g.in_h, g.in_w, g.in_c, g.filter_h, g.filter_w,
                      g.filter_in_c, g.out_c, req.threads};
    {
      tensorflow::mutex_lock lock(plan_mu_);
      auto it = plans_.find(key);
      if (it != plans_.end()) {
        *plan = it->second;
        return AllocateWorkspace(ctx, *plan, workspace);
      }
    }
    TF_RETURN_IF_ERROR(ToStatus(PlanPass(g, pass, req, plan)));
    {
      tensorflow::mutex_lock lock(plan_mu_);
      if (plans_.size() >= kMaxCachedPlans) plans_.clear();
      plans_.emplace(key, *plan);
    }
    return AllocateWorkspace(ctx, *plan, workspace);
  }

  static absl::Status AllocateWorkspace(OpKernelContext* ctx, const PassPlan& plan,
                                        Tensor* workspace) {
    if (plan.workspace_bytes > 0) {
      TF_RETURN_IF_ERROR(ctx->allocate_temp(tensorflow::DT_INT8,
                                            TensorShape({plan.workspace_bytes}), workspace));
    }
    return absl::OkStatus();
  }

  // Plans, allocates the workspace and runs one pass on operands in the pass's order.
  template <typename T, bool kGpu>
  void Run(OpKernelContext* ctx, const ConvGeometry& g, ConvPass pass, const Tensor& a,
           const Tensor& b, Tensor* out) {
#ifdef LARGECONV_WITH_CUDA
    if constexpr (kGpu) {
      RunOnGpu<T>(ctx, g, pass, a, b, out);
      return;
    }
#endif
    PassPlan plan;
    Tensor workspace;
    OP_REQUIRES_OK(ctx, PlanAndAllocate<T>(ctx, g, pass, &plan, &workspace));
    RunPass(g, plan, CorePtr<T>(a), a.NumElements(), CorePtr<T>(b), b.NumElements(),
            CorePtr<T>(out), plan.workspace_bytes > 0 ? workspace.data() : nullptr,
            PoolFor(ctx));
  }

#ifdef LARGECONV_WITH_CUDA
  // Plans for the op's device (the direct tile kernels or the FFT path through cuFFT, found
  // at run time), takes the workspace through allocate_temp and enqueues on the op's stream.
  template <typename T>
  void RunOnGpu(OpKernelContext* ctx, const ConvGeometry& g, ConvPass pass, const Tensor& a,
                const Tensor& b, Tensor* out) {
    using C = typename CoreType<T>::type;
    cuda::CudaPlan plan;  // PlanCudaPass caches plans per geometry and device
    OP_REQUIRES_OK(ctx, ToStatus(cuda::PlanCudaPass(g, pass, request_.algorithm,
                                                    sizeof(AccT<C>), request_.workspace_limit,
                                                    &plan)));
    const int64_t bytes = plan.workspace_bytes;
    Tensor workspace;
    if (bytes > 0) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(tensorflow::DT_INT8, TensorShape({bytes}),
                                             &workspace));
    }
    auto* stream = ctx->op_device_context() ? ctx->op_device_context()->stream() : nullptr;
    OP_REQUIRES(ctx, stream != nullptr,
                tensorflow::errors::Internal("the GPU op has no stream to run on"));
    const auto handle = static_cast<cuda::Stream>(stream->platform_specific_handle().stream);
    OP_REQUIRES_OK(ctx, ToStatus(cuda::RunCudaPass(g, plan, CorePtr<T>(a), CorePtr<T>(b),
                                                   CorePtr<T>(out),
                                                   bytes > 0 ? workspace.data() : nullptr,
                                                   handle)));
  }
#endif

  using PlanKey = std::array<int64_t, 9>;
  static constexpr size_t kMaxCachedPlans = 64;

  ConvAttrs attrs_;
  PlanRequest request_;
  tensorflow::mutex plan_mu_;
  std::map<PlanKey, PassPlan> plans_ TF_GUARDED_BY(plan_mu_);
};

template <typename T, bool kGpu>
class Conv2DOp : public ConvOpBase {
 public:
  using ConvOpBase::ConvOpBase;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& filter = ctx->input(1);
    std::array<int64_t, 4> in_shape, f_shape;
    OP_REQUIRES_OK(ctx, ShapeOf(input, "input", &in_shape));
    OP_REQUIRES_OK(ctx, ShapeOf(filter, "filter", &f_shape));
    ConvGeometry g;
    OP_REQUIRES_OK(ctx, ToStatus(MakeGeometry(attrs_, in_shape, f_shape, &g)));
    Tensor* output = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ToShape(g.output_shape()), &output));
    Run<T, kGpu>(ctx, g, ConvPass::kForward, input, filter, output);
  }
};

template <typename T, bool kGpu>
class Conv2DBackpropInputOp : public ConvOpBase {
 public:
  using ConvOpBase::ConvOpBase;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& sizes = ctx->input(0);
    const Tensor& filter = ctx->input(1);
    const Tensor& dy = ctx->input(2);
    std::array<int64_t, 4> in_shape, f_shape;
    OP_REQUIRES_OK(ctx, SizesOf(sizes, "input_sizes", &in_shape));
    OP_REQUIRES_OK(ctx, ShapeOf(filter, "filter", &f_shape));
    ConvGeometry g;
    OP_REQUIRES_OK(ctx, ToStatus(MakeGeometry(attrs_, in_shape, f_shape, &g)));
    OP_REQUIRES_OK(ctx, CheckOutBackprop(dy, g));
    Tensor* dx = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ToShape(in_shape), &dx));
    Run<T, kGpu>(ctx, g, ConvPass::kBackpropInput, filter, dy, dx);
  }
};

template <typename T, bool kGpu>
class Conv2DBackpropFilterOp : public ConvOpBase {
 public:
  using ConvOpBase::ConvOpBase;
  void Compute(OpKernelContext* ctx) override {
    const Tensor& input = ctx->input(0);
    const Tensor& sizes = ctx->input(1);
    const Tensor& dy = ctx->input(2);
    std::array<int64_t, 4> in_shape, f_shape;
    OP_REQUIRES_OK(ctx, ShapeOf(input, "input", &in_shape));
    OP_REQUIRES_OK(ctx, SizesOf(sizes, "filter_sizes", &f_shape));
    ConvGeometry g;
    OP_REQUIRES_OK(ctx, ToStatus(MakeGeometry(attrs_, in_shape, f_shape, &g)));
    OP_REQUIRES_OK(ctx, CheckOutBackprop(dy, g));
    Tensor* dw = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, ToShape(f_shape), &dw));
    Run<T, kGpu>(ctx, g, ConvPass::kBackpropFilter, input, dy, dw);
  }
};

#define LARGECONV_REGISTER(DEVICE, T, GPU)                                               \
  REGISTER_KERNEL_BUILDER(                                                                \
      Name("LargeConv>Conv2D").Device(DEVICE).TypeConstraint<T>("T"), Conv2DOp<T, GPU>);  \
  REGISTER_KERNEL_BUILDER(Name("LargeConv>Conv2DBackpropInput")                          \
                              .Device(DEVICE)                                             \
                              .TypeConstraint<T>("T")                                     \
                              .HostMemory("input_sizes"),                                 \
                          Conv2DBackpropInputOp<T, GPU>);                                 \
  REGISTER_KERNEL_BUILDER(Name("LargeConv>Conv2DBackpropFilter")                         \
                              .Device(DEVICE)                                             \
                              .TypeConstraint<T>("T")                                     \
                              .HostMemory("filter_sizes"),                                \
                          Conv2DBackpropFilterOp<T, GPU>);
#define LARGECONV_REGISTER_CPU(T) LARGECONV_REGISTER(tensorflow::DEVICE_CPU, T, false)

LARGECONV_REGISTER_CPU(float)
LARGECONV_REGISTER_CPU(double)
LARGECONV_REGISTER_CPU(Eigen::half)
LARGECONV_REGISTER_CPU(Eigen::bfloat16)
#ifdef LARGECONV_WITH_CUDA
#define LARGECONV_REGISTER_GPU(T) LARGECONV_REGISTER(tensorflow::DEVICE_GPU, T, true)
LARGECONV_REGISTER_GPU(float)
LARGECONV_REGISTER_GPU(double)
LARGECONV_REGISTER_GPU(Eigen::half)
LARGECONV_REGISTER_GPU(Eigen::bfloat16)
#undef LARGECONV_REGISTER_GPU
#endif
#undef LARGECONV_REGISTER_CPU
#undef LARGECONV_REGISTER

}  // namespace
}  // namespace largeconv
