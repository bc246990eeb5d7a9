// Workspaces kept between calls of the CPU kernels.
//
// A pass's workspace (tens of MiB for large filters with many channels) is above the size
// from which the C library maps every allocation afresh and unmaps it on release, so with
// TF's default CPU allocator alone each call takes new pages, which the kernel zeroes and
// faults in: 50-75 ms of system time in a 200-300 ms training step of the 31x31
// transpose. The pool keeps released workspaces (tensors from TF's allocator, so
// allocated and counted as any other) for the next call that fits, up to
// LARGECONV_WORKSPACE_POOL_MIB MiB of idle workspaces per process (read on every call; 0
// keeps none). A call whose op has keep_memory=false neither takes nor keeps one: its
// workspace is a temporary of TF's allocator, freed when the call returns. Every pass
// writes all of its workspace that it reads, so a reused one gives bitwise the same
// results.
#ifndef TF_LARGECONV_TF_WORKSPACE_POOL_H_
#define TF_LARGECONV_TF_WORKSPACE_POOL_H_

#include <cstdint>
#include <list>
#include <mutex>

#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace largeconv {

class WorkspacePool {
 public:
  static WorkspacePool& Global();
  // The budget for idle workspaces, in bytes, from the environment.
  static int64_t BudgetFromEnvironment();

  // Moves into *out the smallest idle workspace of at least `bytes` and at most twice
  // that (a much larger one would be held busy for a small call), if any.
  bool Take(int64_t bytes, tensorflow::Tensor* out);
  // Keeps *t (if given) for a later call, then drops the least recently kept beyond
  // `budget`.
  void Give(tensorflow::Tensor* t, int64_t budget);

  // Smaller workspaces are not kept: the C library reuses its own memory for them, and
  // many small ones would make a long list to search.
  static constexpr int64_t kMinBytes = 256 << 10;

  struct Stats {
    int64_t idle = 0, idle_bytes = 0, reuses = 0;
  };
  Stats stats();

 private:
  std::mutex mu_;
  std::list<tensorflow::Tensor> idle_;  // the most recently kept first
  int64_t idle_bytes_ = 0, reuses_ = 0;
};

// A call's workspace: taken from the pool or allocated, and given back to the pool when
// the call ends; or, for a call that keeps nothing, allocated and freed.
class PooledWorkspace {
 public:
  PooledWorkspace() = default;
  PooledWorkspace(const PooledWorkspace&) = delete;
  PooledWorkspace& operator=(const PooledWorkspace&) = delete;
  ~PooledWorkspace();
  // Sets *fresh to whether the workspace was newly allocated. `keep`: whether the call may
  // use the pool (its op's keep_memory attribute).
  absl::Status Acquire(tensorflow::OpKernelContext* ctx, int64_t bytes, bool keep, bool* fresh);
  void* data() { return held_ ? tensor_.data() : nullptr; }

 private:
  tensorflow::Tensor tensor_;
  bool held_ = false, kept_ = false, pooled_ = false;
  int64_t budget_ = 0;
};

}  // namespace largeconv

#endif  // TF_LARGECONV_TF_WORKSPACE_POOL_H_
