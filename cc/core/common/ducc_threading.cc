// Serial definitions of the three DUCC scheduler hooks the FFT headers call. TF's wheel
// ships DUCC's headers but does not export these symbols; the project runs each transform
// on one thread and parallelises over tiles and channels with its own ParallelFor.
#include <functional>

#include "cc/core/common/ducc.h"

namespace ducc0 {
namespace detail_threading {
namespace {

// Hands out [0, nwork) in consecutive chunks to the single (calling) thread.
class SerialScheduler final : public Scheduler {
 public:
  SerialScheduler(size_t nwork, size_t chunksize)
      : nwork_(nwork), chunk_(chunksize == 0 ? (nwork == 0 ? 1 : nwork) : chunksize) {}
  size_t num_threads() const override { return 1; }
  size_t thread_num() const override { return 0; }
  Range getNext() override {
    if (next_ >= nwork_) return Range();
    const size_t lo = next_;
    next_ = lo + chunk_ < nwork_ ? lo + chunk_ : nwork_;
    return Range(lo, next_);
  }

 private:
  size_t nwork_, chunk_, next_ = 0;
};

}  // namespace

size_t adjust_nthreads(size_t /*nthreads*/) { return 1; }

void execStatic(size_t nwork, size_t /*nthreads*/, size_t chunksize,
                std::function<void(Scheduler&)> func) {
  SerialScheduler sched(nwork, chunksize);
  func(sched);
}

void execParallel(size_t /*nthreads*/, std::function<void(Scheduler&)> func) {
  SerialScheduler sched(0, 0);
  func(sched);
}

}  // namespace detail_threading
}  // namespace ducc0
