// One replica's CRAQ state machine (craq.h).
#include "storage/craq.h"

#include <fmt/format.h>

namespace cistern::storage::craq {
namespace {

bool leads(Role r) { return r == Role::kHead || r == Role::kOnly; }
bool ends(Role r) { return r == Role::kTail || r == Role::kOnly; }

}  // namespace

void Replica::commit(const Write& w, Output* out) {
  committed_version_ = w.version;
  committed_ = w.data;
  if (done_.emplace(w.id, w.version).second) {
    done_order_.push_back(w.id);
    if (done_order_.size() > kRememberedUpdates) {
      done_.erase(done_order_.front());
      done_order_.pop_front();
    }
  }
  const Ack ack{w.id, chain_version_, w.version};
  if (leads(role_))
    out->answer_client.push_back(ack);
  else
    out->ack_up.push_back(ack);
}

void Replica::startNextLocked(Output* out) {
  while (!pending_ && !queued_.empty()) {
    Write w = std::move(queued_.front());
    queued_.pop_front();
    if (auto it = done_.find(w.id); it != done_.end()) {
      out->answer_client.push_back({w.id, chain_version_, it->second});
      continue;
    }
    w.version = committed_version_ + 1;
    w.chain_version = chain_version_;
    if (ends(role_)) {
      commit(w, out);  // alone in its chain
      continue;
    }
    pending_ = w;
    out->forward.push_back(std::move(w));
  }
}

Output Replica::setChain(uint64_t chain_version, Role role) {
  Output out;
  const bool moved = chain_version != chain_version_;
  chain_version_ = chain_version;
  role_ = role;
  if (!moved || !pending_) {
    if (leads(role_)) startNextLocked(&out);
    return out;
  }
  pending_->chain_version = chain_version;
  if (ends(role_)) {
    // Everything before this replica has the update pending and nothing
    // after it is left: it is the tail's to commit.
    Write w = std::move(*pending_);
    pending_.reset();
    commit(w, &out);
    if (leads(role_)) startNextLocked(&out);
  } else if (role_ == Role::kHead) {
    out.forward.push_back(*pending_);  // the new successor may lack it
  }
  return out;
}

Output Replica::onWrite(const Write& w) {
  Output out;
  if (w.chain_version != chain_version_) {
    out.refuse.push_back(
        {w.id, Status(ErrorCode::kStaleChainVersion,
                      fmt::format("write under chain version {}; this replica is at {}",
                                  w.chain_version, chain_version_))});
    return out;
  }
  if (auto it = done_.find(w.id); it != done_.end()) {
    // Committed already: acknowledge again (the first answer may be lost).
    const Ack ack{w.id, chain_version_, it->second};
    if (w.version == 0)
      out.answer_client.push_back(ack);
    else
      out.ack_up.push_back(ack);
    return out;
  }
  if (w.version == 0) {  // from the client
    if (!leads(role_)) {
      out.refuse.push_back(
          {w.id, Status(ErrorCode::kStaleChainVersion, "writes go to the chain's head")});
      return out;
    }
    if (pending_ && pending_->id == w.id) {
      out.forward.push_back(*pending_);  // a retry: send it down again
      return out;
    }
    for (const Write& q : queued_)
      if (q.id == w.id) return out;
    queued_.push_back(w);
    startNextLocked(&out);
    return out;
  }
  // From the predecessor.
  if (w.version <= committed_version_) {
    out.ack_up.push_back({w.id, chain_version_, w.version});  // done here long ago
    return out;
  }
  if (pending_) {
    if (pending_->version > w.version) return out;  // an old copy
    if (pending_->id == w.id && pending_->version == w.version) {
      out.forward.push_back(*pending_);  // sent again: pass it on again
      return out;
    }
  }
  if (ends(role_)) {
    pending_.reset();
    commit(w, &out);
    return out;
  }
  pending_ = w;
  out.forward.push_back(w);
  return out;
}

Output Replica::onAck(const Ack& a) {
  Output out;
  if (pending_ && pending_->id == a.id && pending_->version == a.version) {
    Write w = std::move(*pending_);
    pending_.reset();
    commit(w, &out);
    if (leads(role_)) startNextLocked(&out);
    return out;
  }
  // A duplicate of an acknowledgement already passed on: pass it on again
  // (the predecessor may not have had it); the head answered its client.
  if (!leads(role_)) {
    if (auto it = done_.find(a.id); it != done_.end() && it->second == a.version)
      out.ack_up.push_back({a.id, chain_version_, a.version});
  }
  return out;
}

Replica::Read Replica::read() const {
  return {!pending_.has_value(), committed_version_, committed_};
}

}  // namespace cistern::storage::craq
