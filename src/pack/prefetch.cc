// Ordered read-ahead of pack samples (prefetch.h).
#include "pack/prefetch.h"

#include <fmt/format.h>

namespace cistern::pack {

Result<std::unique_ptr<Prefetcher>> Prefetcher::start(Client& client, const std::string& dir,
                                                      std::vector<uint64_t> order,
                                                      Options options) {
  if (options.threads == 0) options.threads = 1;
  std::unique_ptr<Prefetcher> p(new Prefetcher(std::move(order), options));
  for (uint32_t t = 0; t < options.threads; ++t) {
    ASSIGN_OR_RETURN(auto r, PackReader::open(client, dir, {.cache_bytes = options.cache_bytes}));
    for (uint64_t i : p->order_) {
      if (i >= r->size()) {
        return Status(ErrorCode::kInvalidArgument,
                      fmt::format("sample {} of a pack of {}", i, r->size()));
      }
      if (t > 0) break;  // checked once
    }
    p->readers_.push_back(std::move(r));
  }
  for (auto& r : p->readers_)
    p->threads_.emplace_back([pp = p.get(), rr = r.get()] { pp->run(rr); });
  return p;
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void Prefetcher::run(PackReader* reader) {
  for (;;) {
    size_t pos;
    {
      std::unique_lock lock(mu_);
      // Within the bound, or the one the consumer waits for.
      cv_.wait(lock, [&] {
        return stop_ || claimed_ >= order_.size() || held_ < options_.max_bytes ||
               claimed_ == taken_;
      });
      if (stop_ || claimed_ >= order_.size()) return;
      pos = claimed_++;
    }
    Result<Sample> s = [&]() -> Result<Sample> {
      Sample out;
      out.index = order_[pos];
      ASSIGN_OR_RETURN(Entry e, reader->entry(out.index));
      ASSIGN_OR_RETURN(out.name, reader->name(e));
      out.label = e.label;
      out.bytes.resize(e.length);
      RETURN_ON_ERROR(reader->read(e, out.bytes));
      return out;
    }();
    std::lock_guard lock(mu_);
    if (s.ok()) {
      held_ += s->bytes.size();
      peak_ = std::max(peak_, held_);
    }
    done_.emplace(pos, std::move(s));
    cv_.notify_all();
  }
}

Result<std::optional<Prefetcher::Sample>> Prefetcher::next() {
  std::unique_lock lock(mu_);
  if (taken_ >= order_.size()) return std::optional<Sample>();
  cv_.wait(lock, [&] { return done_.count(taken_) > 0; });
  auto it = done_.find(taken_);
  Result<Sample> s = std::move(it->second);
  done_.erase(it);
  ++taken_;
  if (s.ok()) held_ -= s->bytes.size();
  cv_.notify_all();
  if (!s.ok()) return s.status();
  return std::optional<Sample>(std::move(*s));
}

uint64_t Prefetcher::peakBytes() const {
  std::lock_guard lock(mu_);
  return peak_;
}

}  // namespace cistern::pack
