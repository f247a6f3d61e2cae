// CRAQ, the replication of one chunk along its chain (docs/chain_protocol.md,
// "Writes and reads"): the state machine of one replica, pure — no I/O, no
// clock — so that it is tested under a fake network that drops, delays,
// reorders and duplicates messages (craq_test.cc). The storage service
// drives one per chunk being written (the chunk engine stores what it
// decides).
//
//   write: the client sends to the head. The head takes the chunk (one
//   update in flight per chunk; later ones queue), gives the update the next
//   version and keeps it pending; each replica keeps it pending and forwards
//   it to its successor; the tail commits it and acknowledges; each replica
//   commits when the acknowledgement passes back; the head's commit answers
//   the client. An update that reached the tail is committed; the client is
//   answered only after that.
//   read: a replica without a pending version answers with its committed
//   version; one with a pending version does not (the client asks the tail,
//   whose committed version is the chain's).
//   idempotence: an update carries the client's id; a replica that
//   committed it answers it again as done (a retried write is acknowledged
//   once, applied once).
//   chain changes: every message carries the chain version it was sent
//   under; a replica refuses others (kStaleChainVersion: the sender refreshes
//   its routing). When the chain changes, the head sends its pending update
//   again under the new version, and a replica that became the tail commits
//   what it holds pending and acknowledges it.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace cistern::storage::craq {

struct UpdateId {
  uint64_t client = 0;
  uint64_t seq = 0;
  auto operator<=>(const UpdateId&) const = default;
};

enum class Role { kHead, kMiddle, kTail, kOnly };

// An update travelling down the chain.
struct Write {
  UpdateId id;
  uint64_t chain_version = 0;
  uint64_t version = 0;  // 0 from the client: the head gives it one
  std::string data;      // the chunk's new contents (a model of the bytes)
};

// An acknowledgement travelling up the chain (or to the client from the head).
struct Ack {
  UpdateId id;
  uint64_t chain_version = 0;
  uint64_t version = 0;
};

// What a replica wants sent after a step.
struct Output {
  std::vector<Write> forward;                       // to the successor
  std::vector<Ack> ack_up;                          // to the predecessor
  std::vector<Ack> answer_client;                   // head/only: the client's write is done
  std::vector<std::pair<UpdateId, Status>> refuse;  // to whoever sent them
};

class Replica {
 public:
  // How many committed update ids are remembered for retries.
  static constexpr size_t kRememberedUpdates = 1024;

  // Position in the chain as of `chain_version`. When the version moves,
  // the head sends its pending update again and a new tail commits its
  // pending update (both in the returned output).
  Output setChain(uint64_t chain_version, Role role);

  // A write from the client (head, only) or the predecessor.
  Output onWrite(const Write& w);
  // An acknowledgement from the successor.
  Output onAck(const Ack& a);

  struct Read {
    bool clean = false;  // false: a version is pending; ask the tail
    uint64_t version = 0;
    std::string data;
  };
  Read read() const;

  uint64_t committedVersion() const { return committed_version_; }
  const std::string& committedData() const { return committed_; }
  bool hasPending() const { return pending_.has_value(); }

 private:
  // Starts the head's next queued update if the chunk is free.
  void startNextLocked(Output* out);
  void commit(const Write& w, Output* out);

  uint64_t chain_version_ = 0;
  Role role_ = Role::kOnly;
  uint64_t committed_version_ = 0;
  std::string committed_;
  std::optional<Write> pending_;
  std::deque<Write> queued_;           // head: waiting for the chunk
  std::map<UpdateId, uint64_t> done_;  // committed update -> its version
  std::deque<UpdateId> done_order_;    // oldest first, to forget
};

}  // namespace cistern::storage::craq
