#include "cc/core/cpu/spectrum_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cc/core/common/memory.h"
#include "cc/core/common/vocabulary.h"

namespace largeconv {
namespace {

constexpr int64_t kDefaultMiB = 64;
// Misses remembered for the second-sight rule: enough for the passes of a few layers.
constexpr size_t kSeenKept = 32;

// A 64-bit fingerprint of the key and the filter's bytes, four independent lanes so that
// hashing runs near memory speed. It only decides what to keep: a match is always
// confirmed byte for byte (Entry::Matches).
uint64_t Fingerprint(const SpectrumCache::Source& s) {
  constexpr uint64_t kMul = 0x9E3779B97F4A7C15ull;
  uint64_t lane[4] = {1, 2, 3, 4};
  auto mix = [](uint64_t h, uint64_t v) {
    h ^= v + kMul + (h << 6) + (h >> 2);
    return h * kMul;
  };
  for (size_t i = 0; i < s.key.size(); ++i) lane[i % 4] = mix(lane[i % 4], uint64_t(s.key[i]));
  const unsigned char* p = static_cast<const unsigned char*>(s.filter);
  size_t i = 0;
  for (; i + 32 <= s.filter_bytes; i += 32) {
    for (int j = 0; j < 4; ++j) {
      uint64_t v;
      std::memcpy(&v, p + i + 8 * j, 8);
      lane[j] = mix(lane[j], v);
    }
  }
  for (; i < s.filter_bytes; ++i) lane[i % 4] = mix(lane[i % 4], p[i]);
  return mix(mix(lane[0], lane[1]), mix(lane[2], mix(lane[3], s.filter_bytes)));
}

}  // namespace

void SpectrumCache::Entry::Free::operator()(void* p) const { std::free(p); }

SpectrumCache::Entry::Entry(const Source& s, size_t spectra_bytes)
    : key_(s.key),
      filter_(static_cast<const unsigned char*>(s.filter),
              static_cast<const unsigned char*>(s.filter) + s.filter_bytes),
      spectra_(std::aligned_alloc(64, size_t(AlignUp(int64_t(spectra_bytes), 64)))),
      spectra_bytes_(spectra_bytes) {}

bool SpectrumCache::Entry::Matches(const Source& s) const {
  return spectra_ != nullptr && key_ == s.key && filter_.size() == s.filter_bytes &&
         std::memcmp(filter_.data(), s.filter, s.filter_bytes) == 0;
}

SpectrumCache& SpectrumCache::Global() {
  static SpectrumCache* cache = new SpectrumCache();  // never destroyed: no exit-order issues
  return *cache;
}

int64_t SpectrumCache::BudgetFromEnvironment() {
  return largeconv::BudgetFromEnvironment("LARGECONV_SPECTRUM_CACHE_MIB", kDefaultMiB);
}

std::shared_ptr<const SpectrumCache::Entry> SpectrumCache::Find(const Source& s, int64_t budget) {
  std::lock_guard<std::mutex> lock(mu_);
  EvictTo(budget);
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if ((*it)->Matches(s)) {
      std::shared_ptr<const Entry> e = *it;
      lru_.erase(it);
      lru_.push_front(e);
      return e;
    }
  }
  return nullptr;
}

std::shared_ptr<SpectrumCache::Entry> SpectrumCache::Begin(const Source& s, size_t spectra_bytes,
                                                           int64_t budget) {
  if (budget <= 0 || int64_t(spectra_bytes + s.filter_bytes) > budget) return nullptr;
  const uint64_t fp = Fingerprint(s);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto seen = std::find(seen_.begin(), seen_.end(), fp);
    if (seen == seen_.end()) {  // first sight: remember it only
      seen_.push_front(fp);
      if (seen_.size() > kSeenKept) seen_.pop_back();
      return nullptr;
    }
    seen_.erase(seen);
  }
  auto e = std::make_shared<Entry>(s, spectra_bytes);
  return e->spectra() != nullptr ? e : nullptr;  // out of memory: keep nothing
}

void SpectrumCache::Keep(std::shared_ptr<const Entry> e, int64_t budget) {
  // Another thread may keep the same spectra meanwhile; the older copy then ages out unused.
  std::lock_guard<std::mutex> lock(mu_);
  held_ += int64_t(e->bytes());
  lru_.push_front(std::move(e));
  EvictTo(budget);
}

void SpectrumCache::EvictTo(int64_t budget) {
  while (held_ > std::max<int64_t>(budget, 0) && !lru_.empty()) {
    held_ -= int64_t(lru_.back()->bytes());
    lru_.pop_back();
  }
  if (budget <= 0) seen_.clear();
}

int64_t SpectrumCache::bytes_held() {
  std::lock_guard<std::mutex> lock(mu_);
  return held_;
}

int64_t SpectrumCache::entries() {
  std::lock_guard<std::mutex> lock(mu_);
  return int64_t(lru_.size());
}

}  // namespace largeconv
