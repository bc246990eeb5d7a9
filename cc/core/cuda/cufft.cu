// cuFFT through dlopen: the few entry points the FFT path uses, declared here from cuFFT's
// documented C API (cufftHandle and cufftResult are ints, the transform types are fixed
// enumerators), and a per-device cache of plans.
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "cc/core/cuda/cuda_status.h"
#include "cc/core/cuda/cufft.h"

namespace largeconv {
namespace cuda {
namespace {

using Handle = int;  // cufftHandle
using Result = int;  // cufftResult; 0 is CUFFT_SUCCESS
// cufftType enumerators.
constexpr int kR2C = 0x2a, kC2R = 0x2c, kD2Z = 0x6a, kZ2D = 0x6c;

struct Api {
  Result (*create)(Handle*);
  Result (*set_auto_allocation)(Handle, int);
  Result (*make_plan_many64)(Handle, int, long long*, long long*, long long, long long, long long*,
                             long long, long long, int, long long, size_t*);
  Result (*set_work_area)(Handle, void*);
  Result (*set_stream)(Handle, cudaStream_t);
  Result (*exec_r2c)(Handle, float*, void*);
  Result (*exec_c2r)(Handle, void*, float*);
  Result (*exec_d2z)(Handle, double*, void*);
  Result (*exec_z2d)(Handle, void*, double*);
  Result (*destroy)(Handle);
  Result (*get_version)(int*);
};

struct Library {
  Api api{};
  std::string error = "not loaded";
  std::string path;
  int version = 0;
};

// Directory of the shared object this code is linked into (the package directory).
std::string OwnDirectory() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&OwnDirectory), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  const std::string file = info.dli_fname;
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? "." : file.substr(0, slash);
}

std::vector<std::string> Candidates() {
  if (const char* path = std::getenv("LARGECONV_CUFFT")) return {path};
  const char* names[] = {"libcufft.so.12", "libcufft.so.11", "libcufft.so.13", "libcufft.so.10",
                         "libcufft.so"};
  std::vector<std::string> dirs;
  const std::string own = OwnDirectory();
  if (!own.empty()) {
    dirs.push_back(own + "/../nvidia/cufft/lib");
    dirs.push_back(own + "/../nvidia/cu13/lib");
  }
  if (const char* home = std::getenv("CUDA_HOME")) dirs.push_back(std::string(home) + "/lib64");
  dirs.push_back("/usr/local/cuda/lib64");
  std::vector<std::string> out(std::begin(names), std::end(names));
  for (const std::string& d : dirs) {
    for (const char* n : names) out.push_back(d + "/" + n);
  }
  return out;
}

template <typename F>
bool Bind(void* lib, const char* name, F* fn, std::string* error) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  if (*fn == nullptr) *error = std::string("cuFFT has no ") + name;
  return *fn != nullptr;
}

Library Load() {
  Library l;
  std::string tried;
  for (const std::string& c : Candidates()) {
    void* lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      if (tried.size() < 2000) tried += "\n  " + std::string(dlerror());
      continue;
    }
    Api& a = l.api;
    std::string error;
    if (Bind(lib, "cufftCreate", &a.create, &error) &&
        Bind(lib, "cufftSetAutoAllocation", &a.set_auto_allocation, &error) &&
        Bind(lib, "cufftMakePlanMany64", &a.make_plan_many64, &error) &&
        Bind(lib, "cufftSetWorkArea", &a.set_work_area, &error) &&
        Bind(lib, "cufftSetStream", &a.set_stream, &error) &&
        Bind(lib, "cufftExecR2C", &a.exec_r2c, &error) &&
        Bind(lib, "cufftExecC2R", &a.exec_c2r, &error) &&
        Bind(lib, "cufftExecD2Z", &a.exec_d2z, &error) &&
        Bind(lib, "cufftExecZ2D", &a.exec_z2d, &error) &&
        Bind(lib, "cufftDestroy", &a.destroy, &error) &&
        Bind(lib, "cufftGetVersion", &a.get_version, &error)) {
      l.path = c;
      l.error.clear();
      if (a.get_version(&l.version) != 0) l.version = 0;
      return l;
    }
    tried += "\n  " + c + ": " + error;
    dlclose(lib);
  }
  l.error = "cuFFT (libcufft.so) was not found; set LARGECONV_CUFFT to its path. Tried:" + tried;
  return l;
}

const Library& Lib() {
  static const Library* lib = new Library(Load());
  return *lib;
}

struct Key {
  int device;
  bool inverse;
  int real_bytes;
  int64_t fft_d, fft_h, fft_w, batch;
  bool operator<(const Key& o) const {
    return std::tie(device, inverse, real_bytes, fft_d, fft_h, fft_w, batch) <
           std::tie(o.device, o.inverse, o.real_bytes, o.fft_d, o.fft_h, o.fft_w, o.batch);
  }
};

struct Plan {
  Handle handle = 0;
  size_t work = 0;
  uint64_t last_use = 0;
  cudaEvent_t done = nullptr;  // recorded after the plan's latest transform
};

// Plans by (device, shape). Bounded: past kMaxPlans on a device, its least recently used
// plan is taken out of the cache and destroyed once its latest transform has finished. That
// wait happens outside the cache's lock and on that plan's event only, so it never holds up
// other devices or threads (which could deadlock against work queued elsewhere).
constexpr size_t kMaxPlans = 256;

struct Cache {
  std::mutex mu;
  std::map<Key, Plan> plans;
  uint64_t clock = 0;
};

Cache& Plans() {
  static Cache* cache = new Cache();
  return *cache;
}

// cuFFT's failures: out of memory (CUFFT_ALLOC_FAILED) or anything else, internal.
Status ResultStatus(const char* what, Result r, const std::string& detail = "") {
  constexpr Result kAllocFailed = 2;
  std::string message =
      std::string("cuFFT ") + what + " failed with cufftResult " + std::to_string(r) + detail;
  if (r == kAllocFailed) return ResourceExhausted(std::move(message));
  return Internal(std::move(message));
}

// Destroys plans taken out of the cache, after their queued work. Called without the lock.
// If the wait is refused (e.g. while a stream is being captured into a graph), the plan is
// left alive rather than destroyed under queued work.
void Retire(const std::vector<Plan>& retired) {
  for (const Plan& p : retired) {
    if (p.done != nullptr && cudaEventSynchronize(p.done) != cudaSuccess) continue;
    Lib().api.destroy(p.handle);
    if (p.done != nullptr) cudaEventDestroy(p.done);
  }
}

// Finds or creates the plan of s on the current device; a plan evicted to make room goes
// to *retired. Caller holds the cache lock.
Status GetPlan(Cache& cache, const TransformShape& s, Plan** out, std::vector<Plan>* retired) {
  const Api& api = Lib().api;
  int device = 0;
  const cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return CudaStatus("no CUDA device", e);
  const Key key{device, s.inverse, s.real_bytes, s.fft_d, s.fft_h, s.fft_w, s.batch};
  auto it = cache.plans.find(key);
  if (it == cache.plans.end()) {
    size_t on_device = 0;
    auto victim = cache.plans.end();
    for (auto p = cache.plans.begin(); p != cache.plans.end(); ++p) {
      if (p->first.device != device) continue;
      ++on_device;
      if (victim == cache.plans.end() || p->second.last_use < victim->second.last_use) {
        victim = p;
      }
    }
    if (on_device >= kMaxPlans) {
      retired->push_back(victim->second);
      cache.plans.erase(victim);
    }
    Plan p;
    Result r = api.create(&p.handle);
    if (r != 0) return ResultStatus("plan creation", r);
    long long n[3] = {s.fft_d, s.fft_h, s.fft_w};
    long long padded[3] = {s.fft_d, s.fft_h, 2 * (s.fft_w / 2 + 1)};
    long long bins[3] = {s.fft_d, s.fft_h, s.fft_w / 2 + 1};
    const long long padded_dist = padded[0] * padded[1] * padded[2],
                    bins_dist = bins[0] * bins[1] * bins[2];
    const bool dbl = s.real_bytes == 8;
    const int type = s.inverse ? (dbl ? kZ2D : kC2R) : (dbl ? kD2Z : kR2C);
    // Volumes (Conv3D, fft_d > 1) are rank-3 plans. A height of 1 (1-D geometries: conv1d)
    // is a batch of single rows: a rank-1 plan over the same layout, as cuFFT makes no 2-D
    // plan with a side of 1.
    const int rank = s.fft_d > 1 ? 3 : s.fft_h == 1 ? 1 : 2;
    long long *nn = n + 3 - rank, *pp = padded + 3 - rank, *bb = bins + 3 - rank;
    r = api.set_auto_allocation(p.handle, 0);
    if (r == 0) {
      r = s.inverse ? api.make_plan_many64(p.handle, rank, nn, bb, 1, bins_dist, pp, 1, padded_dist,
                                           type, s.batch, &p.work)
                    : api.make_plan_many64(p.handle, rank, nn, pp, 1, padded_dist, bb, 1, bins_dist,
                                           type, s.batch, &p.work);
    }
    if (r != 0) {
      api.destroy(p.handle);
      return ResultStatus("plan making", r,
                          " for a batch of " + std::to_string(s.batch) + " transforms of " +
                              (s.fft_d > 1 ? std::to_string(s.fft_d) + "x" : "") +
                              std::to_string(s.fft_h) + "x" + std::to_string(s.fft_w));
    }
    it = cache.plans.emplace(key, p).first;
  }
  it->second.last_use = ++cache.clock;
  *out = &it->second;
  return OkStatus();
}

// Enqueues the transform on `stream` and records the plan's event after it.
Status Execute(const Api& api, Plan& plan, const TransformShape& s, void* data, void* work,
               cudaStream_t stream) {
  Result r = api.set_stream(plan.handle, stream);
  if (r == 0 && plan.work > 0) r = api.set_work_area(plan.handle, work);
  if (r != 0) return ResultStatus("plan setup", r);
  if (s.real_bytes == 8) {
    r = s.inverse ? api.exec_z2d(plan.handle, data, static_cast<double*>(data))
                  : api.exec_d2z(plan.handle, static_cast<double*>(data), data);
  } else {
    r = s.inverse ? api.exec_c2r(plan.handle, data, static_cast<float*>(data))
                  : api.exec_r2c(plan.handle, static_cast<float*>(data), data);
  }
  if (r != 0) return ResultStatus("execution", r);
  if (plan.done == nullptr) {
    const cudaError_t e = cudaEventCreateWithFlags(&plan.done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      plan.done = nullptr;
      return CudaStatus("creating a CUDA event for a cuFFT plan", e);
    }
  }
  return CudaStatus("cudaEventRecord", cudaEventRecord(plan.done, stream));
}

}  // namespace

std::string CufftStatus() { return Lib().error; }
std::string CufftPath() { return Lib().path; }
int CufftVersion() { return Lib().version; }

int64_t CufftWorkBytes(const TransformShape& s, Status* error) {
  if (!Lib().error.empty()) {
    *error = Unimplemented(Lib().error);
    return -1;
  }
  Cache& cache = Plans();
  std::vector<Plan> retired;
  int64_t work = -1;
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    Plan* plan = nullptr;
    *error = GetPlan(cache, s, &plan, &retired);
    if (error->ok()) work = static_cast<int64_t>(plan->work);
  }
  Retire(retired);
  return work;
}

Status CufftExecute(const TransformShape& s, void* data, void* work, int64_t work_bytes,
                    CUstream_st* stream) {
  if (!Lib().error.empty()) return Unimplemented(Lib().error);
  const Api& api = Lib().api;
  Cache& cache = Plans();
  std::vector<Plan> retired;
  Status error;
  {
    // Held until the transform is enqueued: the plan's stream and work area are its own.
    std::lock_guard<std::mutex> lock(cache.mu);
    Plan* plan = nullptr;
    error = GetPlan(cache, s, &plan, &retired);
    if (error.ok() && static_cast<int64_t>(plan->work) > work_bytes) {
      error = Internal("cuFFT asks for a work area of " + std::to_string(plan->work) +
                       " bytes, more than the " + std::to_string(work_bytes) + " planned");
    }
    if (error.ok()) error = Execute(api, *plan, s, data, work, stream);
  }
  Retire(retired);
  return error;
}

}  // namespace cuda
}  // namespace largeconv
