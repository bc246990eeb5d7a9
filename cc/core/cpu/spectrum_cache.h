// Filter spectra kept from one call to the next. Inference convolves image after image with
// the same filter, and on the FFT path every call would transform that filter again: for a
// batch of two 321x481 images and a 135x135x1x3 filter, the filter's three transforms are a
// third of the call. A set of spectra is kept once the same filter has been seen twice (so a
// training loop, whose filter changes every step, stores nothing), and a later call reuses
// it only when its filter's bytes equal the kept copy's, every one of them: a stale or
// colliding entry can never be read. The results are bitwise those of a call that
// transforms the filter, since the kept spectra are exactly what that call computes.
//
// Memory: at most LARGECONV_SPECTRUM_CACHE_MIB mebibytes (read on every call; default 64;
// 0 turns the cache off and frees what it holds), least recently used entries evicted
// first. An entry counts its spectra and its copy of the filter.
#ifndef TF_LARGECONV_CORE_CPU_SPECTRUM_CACHE_H_
#define TF_LARGECONV_CORE_CPU_SPECTRUM_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

namespace largeconv {

class SpectrumCache {
 public:
  // What a set of spectra is computed from: the words that fix their layout (transform
  // size, pass, block, element type, ...) and the filter's bytes.
  struct Source {
    std::vector<int64_t> key;
    const void* filter;
    size_t filter_bytes;
  };

  class Entry {
   public:
    // Copies the filter and allocates (uninitialised) room for the spectra; spectra() is
    // null if that failed.
    Entry(const Source& s, size_t spectra_bytes);
    const void* spectra() const { return spectra_.get(); }
    void* to_fill() { return spectra_.get(); }  // before Keep only
    size_t bytes() const { return spectra_bytes_ + filter_.size(); }
    bool Matches(const Source& s) const;

   private:
    struct Free {
      void operator()(void* p) const;
    };
    std::vector<int64_t> key_;
    std::vector<unsigned char> filter_;
    std::unique_ptr<void, Free> spectra_;  // 64-byte aligned
    size_t spectra_bytes_;
  };

  // The process's cache (one per library that links the core).
  static SpectrumCache& Global();

  // The budget in bytes from LARGECONV_SPECTRUM_CACHE_MIB (default 64 MiB; 0: off).
  static int64_t BudgetFromEnvironment();

  // The kept spectra for `s`, or null, after evicting down to `budget` (all of it at 0).
  // The entry stays valid while it is held, even if it is evicted meanwhile.
  std::shared_ptr<const Entry> Find(const Source& s, int64_t budget);

  // After a miss: an entry for the caller to fill with the spectra of `s`, if the same key
  // and filter were seen before (among the last few misses) and it fits the budget; null
  // otherwise (a first sight is remembered by its fingerprint only).
  std::shared_ptr<Entry> Begin(const Source& s, size_t spectra_bytes, int64_t budget);

  // Keeps an entry from Begin once it is filled.
  void Keep(std::shared_ptr<const Entry> e, int64_t budget);

  // What the cache holds now (tests and diagnostics).
  int64_t bytes_held();
  int64_t entries();

 private:
  void EvictTo(int64_t budget);  // with mu_ held

  std::mutex mu_;
  std::list<std::shared_ptr<const Entry>> lru_;  // most recently used first
  std::list<uint64_t> seen_;                     // fingerprints of recent misses, newest first
  int64_t held_ = 0;
};

}  // namespace largeconv

#endif  // TF_LARGECONV_CORE_CPU_SPECTRUM_CACHE_H_
