#include "cc/tf/workspace_pool.h"

#include <utility>

#include "cc/core/common/memory.h"

namespace largeconv {

namespace {
constexpr int64_t kDefaultMiB = 128;  // two workspaces at the default workspace_limit
}  // namespace

WorkspacePool& WorkspacePool::Global() {
  // Never destroyed: its tensors must not be freed after TF's allocator at exit.
  static WorkspacePool* pool = new WorkspacePool;
  return *pool;
}

int64_t WorkspacePool::BudgetFromEnvironment() {
  return largeconv::BudgetFromEnvironment("LARGECONV_WORKSPACE_POOL_MIB", kDefaultMiB);
}

bool WorkspacePool::Take(int64_t bytes, tensorflow::Tensor* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto best = idle_.end();
  for (auto it = idle_.begin(); it != idle_.end(); ++it) {
    const int64_t size = static_cast<int64_t>(it->TotalBytes());
    if (size < bytes || size > 2 * bytes) continue;
    if (best == idle_.end() || size < static_cast<int64_t>(best->TotalBytes())) best = it;
  }
  if (best == idle_.end()) return false;
  idle_bytes_ -= static_cast<int64_t>(best->TotalBytes());
  *out = std::move(*best);
  idle_.erase(best);
  ++reuses_;
  return true;
}

void WorkspacePool::Give(tensorflow::Tensor* t, int64_t budget) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t size = t ? static_cast<int64_t>(t->TotalBytes()) : 0;
  if (t && size <= budget) {
    idle_bytes_ += size;
    idle_.push_front(std::move(*t));
  }
  while (idle_bytes_ > budget) {
    idle_bytes_ -= static_cast<int64_t>(idle_.back().TotalBytes());
    idle_.pop_back();
  }
}

WorkspacePool::Stats WorkspacePool::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return {static_cast<int64_t>(idle_.size()), idle_bytes_, reuses_};
}

PooledWorkspace::~PooledWorkspace() {
  // A small workspace is not kept, but its call still applies the budget (0 empties the
  // pool); a call that keeps nothing leaves the pool as it is.
  if (held_ && kept_) WorkspacePool::Global().Give(pooled_ ? &tensor_ : nullptr, budget_);
}

absl::Status PooledWorkspace::Acquire(tensorflow::OpKernelContext* ctx, int64_t bytes, bool keep,
                                      bool* fresh) {
  kept_ = keep;
  budget_ = keep ? WorkspacePool::BudgetFromEnvironment() : 0;
  pooled_ = budget_ > 0 && bytes >= WorkspacePool::kMinBytes;
  *fresh = !(pooled_ && WorkspacePool::Global().Take(bytes, &tensor_));
  if (*fresh) {
    TF_RETURN_IF_ERROR(
        ctx->allocate_temp(tensorflow::DT_INT8, tensorflow::TensorShape({bytes}), &tensor_));
  }
  held_ = true;
  return absl::OkStatus();
}

}  // namespace largeconv

// The pool's state for the package's tests (tf_largeconv/_loader.py reads it by ctypes):
// idle workspaces, their bytes, and the calls that reused one.
extern "C" __attribute__((visibility("default"))) void LargeConvWorkspacePoolStats(
    int64_t* idle, int64_t* idle_bytes, int64_t* reuses) {
  const largeconv::WorkspacePool::Stats s = largeconv::WorkspacePool::Global().stats();
  *idle = s.idle;
  *idle_bytes = s.idle_bytes;
  *reuses = s.reuses;
}
