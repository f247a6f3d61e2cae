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
  std::vector<Entry> entries;
  std::vector<Result<Sample>> samples;
  std::vector<Entry> run;  // of one read: the samples whose entries were read
  std::vector<std::span<uint8_t>> outs;
  std::vector<size_t> at;  // their places in the batch
  std::vector<Status> statuses;
  for (;;) {
    size_t first, count;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || claimed_ >= order_.size() || held_ + reserved_ < options_.max_bytes ||
               claimed_ == taken_;
      });
      if (stop_ || claimed_ >= order_.size()) return;
      first = claimed_;
      count = std::min<size_t>(kBatch, order_.size() - first);
      claimed_ += count;
    }
    // The batch's entries and names (from the index pages this thread keeps).
    entries.assign(count, Entry{});
    samples.clear();
    for (size_t i = 0; i < count; ++i) {
      samples.push_back([&]() -> Result<Sample> {
        Sample out;
        out.index = order_[first + i];
        ASSIGN_OR_RETURN(entries[i], reader->entry(out.index));
        ASSIGN_OR_RETURN(out.name, reader->name(entries[i]));
        out.label = entries[i].label;
        out.bytes.resize(entries[i].length);
        return out;
      }());
      if (!samples.back().ok()) entries[i].length = 0;
    }
    // Read in runs that fit the bound (the consumer's next sample always
    // does): several samples per storage request, memory within the bound.
    for (size_t i = 0; i < count;) {
      size_t j = i;
      uint64_t bytes = 0;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] {
          return stop_ || held_ + reserved_ + entries[i].length <= options_.max_bytes ||
                 first + i == taken_;
        });
        if (stop_) return;
        do {
          bytes += entries[j].length;
          ++j;
        } while (j < count && held_ + reserved_ + bytes + entries[j].length <= options_.max_bytes);
        reserved_ += bytes;
      }
      run.clear();
      outs.clear();
      at.clear();
      for (size_t k = i; k < j; ++k) {
        if (!samples[k].ok()) continue;
        run.push_back(entries[k]);
        outs.push_back(samples[k]->bytes);
        at.push_back(k);
      }
      reader->readMany(run, outs, &statuses);
      for (size_t k = 0; k < at.size(); ++k) {
        if (!statuses[k].ok()) samples[at[k]] = statuses[k];
      }
      std::lock_guard lock(mu_);
      reserved_ -= bytes;
      for (size_t k = i; k < j; ++k) {
        if (samples[k].ok()) held_ += samples[k]->bytes.size();
        done_.emplace(first + k, std::move(samples[k]));
      }
      peak_ = std::max(peak_, held_ + reserved_);
      cv_.notify_all();
      i = j;
    }
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
