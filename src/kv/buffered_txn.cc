#include "kv/buffered_txn.h"

#include <algorithm>

namespace cistern::kv {

void normalizeRanges(std::vector<KeyRange>* ranges) {
  auto& r = *ranges;
  std::sort(r.begin(), r.end(),
            [](const KeyRange& a, const KeyRange& b) { return a.begin < b.begin; });
  size_t out = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    if (r[i].begin >= r[i].end) continue;
    if (out > 0 && r[i].begin <= r[out - 1].end) {
      if (r[i].end > r[out - 1].end) r[out - 1].end = std::move(r[i].end);
    } else {
      if (out != i) r[out] = std::move(r[i]);
      ++out;
    }
  }
  r.resize(out);
}

bool rangesIntersect(const std::vector<KeyRange>& a, const std::vector<KeyRange>& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i].begin < b[j].end && b[j].begin < a[i].end) return true;
    if (a[i].end <= b[j].end)
      ++i;
    else
      ++j;
  }
  return false;
}

Status BufferedTxn::materializeAdds(std::string_view begin, std::string_view end) {
  auto lo = adds_.lower_bound(begin), hi = adds_.lower_bound(end);
  for (auto it = lo; it != hi; ++it) {
    reads_.push_back({it->first, keyAfter(it->first)});
    ASSIGN_OR_RETURN(auto stored, snap_->get(it->first));
    int64_t base = stored ? decodeCounter(*stored) : 0;
    writes_.insert_or_assign(it->first,
                             std::optional<std::string>(encodeCounter(base + it->second)));
  }
  adds_.erase(lo, hi);
  return Status::OK();
}

Result<RangeResult> BufferedTxn::getRange(std::string_view begin, std::string_view end,
                                          const RangeOptions& opts) {
  if (finished_) return Status(ErrorCode::kTxnFinished, "getRange after commit");
  RangeResult out;
  if (begin >= end) return out;
  RETURN_ON_ERROR(materializeAdds(begin, end));
  uint32_t limit = opts.limit == 0 ? kRangeLimitMax : std::min(opts.limit, kRangeLimitMax);
  auto it = snap_->iterate(begin, end);
  auto lo = writes_.lower_bound(begin);
  auto hi = writes_.lower_bound(end);
  bool stopped = false;

  if (!opts.reverse) {
    it->seek(begin);
    auto lit = lo;
    while (true) {
      bool store_ok = it->valid();
      bool local_ok = lit != hi;
      if (!store_ok && !local_ok) break;
      if (out.kvs.size() >= limit) {
        stopped = true;
        break;
      }
      int cmp = !store_ok ? 1 : !local_ok ? -1 : it->key().compare(lit->first);
      if (cmp < 0) {
        if (!coveredByClear(it->key()))
          out.kvs.push_back({std::string(it->key()), std::string(it->value())});
        it->next();
      } else {
        if (cmp == 0) it->next();  // the local write shadows the stored row
        if (lit->second) out.kvs.push_back({lit->first, *lit->second});
        ++lit;
      }
    }
  } else {
    it->seekLast();
    auto lit = hi;
    while (true) {
      bool store_ok = it->valid();
      bool local_ok = lit != lo;
      if (!store_ok && !local_ok) break;
      if (out.kvs.size() >= limit) {
        stopped = true;
        break;
      }
      auto prev = local_ok ? std::prev(lit) : lit;
      int cmp = !store_ok ? -1 : !local_ok ? 1 : it->key().compare(prev->first);
      if (cmp > 0) {
        if (!coveredByClear(it->key()))
          out.kvs.push_back({std::string(it->key()), std::string(it->value())});
        it->prev();
      } else {
        if (cmp == 0) it->prev();
        if (prev->second) out.kvs.push_back({prev->first, *prev->second});
        lit = prev;
      }
    }
  }
  RETURN_ON_ERROR(it->status());
  out.more = stopped;
  if (!opts.snapshot && !read_only_) {
    if (!stopped) {
      reads_.push_back({std::string(begin), std::string(end)});
    } else if (!opts.reverse) {
      reads_.push_back({std::string(begin), keyAfter(out.kvs.back().key)});
    } else {
      reads_.push_back({out.kvs.back().key, std::string(end)});
    }
  }
  return out;
}

}  // namespace cistern::kv
