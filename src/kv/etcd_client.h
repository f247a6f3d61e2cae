// A client of etcd's v3 API (etcd 3.4, Debian's etcd-server), spoken as
// the JSON that etcd's own gRPC gateway serves on every client URL
// (POST /v3/kv/range, /v3/kv/txn, /v3/lease/...): keys and values travel
// base64-encoded, 64-bit numbers as strings. libcurl carries it (keep-alive
// connections, a small pool of handles per endpoint; the gateway's error
// answers end in HTTP trailers, which cpp-httplib 0.11 cannot read), so
// cistern needs no gRPC stack for its one etcd client (docs/kv.md, "etcd").
//
// Endpoints: the cluster's client URLs; a call goes to the one that
// answered last and moves on to the next when one cannot be reached. A
// read (and a transaction of reads only) is tried on every endpoint; a
// transaction that writes only moves on while no byte of it was sent, since etcd may have applied one whose answer was
// lost: that outcome is kCommitUnknown, never a guess.
//
// Thread-safe. The parse functions take any bytes (fuzz target
// tests/fuzz/etcd_response_fuzz.cc).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace cistern::kv::etcd {

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
};

struct RangeRequest {
  std::string key;
  std::string range_end;  // empty: `key` alone; "\0": every key >= key
  int64_t revision = 0;   // 0: the newest
  int64_t limit = 0;      // 0: no limit
  bool descend = false;   // by key, from the end
  bool keys_only = false;
};

struct RangeResponse {
  int64_t revision = 0;  // the store's revision the read saw
  std::vector<KeyValue> kvs;
  bool more = false;  // the limit cut it
};

struct Compare {
  enum Target { kMod, kCreate, kVersion, kValue };
  enum Result { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  std::string range_end;  // every key in [key, range_end) must satisfy it
  Target target = kMod;
  Result result = kEqual;
  int64_t number = 0;  // kMod, kCreate, kVersion
  std::string value;   // kValue
};

struct TxnRequest;
struct TxnResponse;

struct Op {
  enum Kind { kPut, kDeleteRange, kRange, kTxn };
  Kind kind = kPut;
  std::string key;
  std::string value;                // kPut
  std::string range_end;            // kDeleteRange (empty: `key` alone)
  int64_t lease = 0;                // kPut
  RangeRequest range;               // kRange
  std::shared_ptr<TxnRequest> txn;  // kTxn (a nested transaction)
};

struct TxnRequest {
  std::vector<Compare> compare;
  std::vector<Op> success;
  std::vector<Op> failure;
};

struct OpResponse {
  RangeResponse range;               // kRange
  std::shared_ptr<TxnResponse> txn;  // kTxn
};

struct TxnResponse {
  int64_t revision = 0;  // after the transaction
  bool succeeded = false;
  std::vector<OpResponse> responses;  // of the branch that ran
};

// JSON of requests, and the parsers of etcd's answers: a JSON error body
// ({"error": ..., "code": ...}) becomes the Status etcd's error means.
std::string toJson(const RangeRequest& r);
std::string toJson(const TxnRequest& r);
Result<RangeResponse> parseRange(std::string_view body);
Result<TxnResponse> parseTxn(std::string_view body);
// {"ID": ..., "TTL": ...} of a lease grant or keep-alive; TTL 0: expired.
Result<std::pair<int64_t, int64_t>> parseLease(std::string_view body);
// The Status of an error body, or OK when the body is no error.
Status errorOf(std::string_view body);

class Client {
 public:
  struct Options {
    std::vector<std::string> endpoints;  // host:port of client URLs
    uint32_t timeout_ms = 5000;          // per request
    uint32_t connections = 8;            // per endpoint, for concurrent calls
  };
  // Fails with kInvalidArgument for no or malformed endpoints; reaches none.
  static Result<std::unique_ptr<Client>> create(const Options& options);
  ~Client();

  Result<RangeResponse> range(const RangeRequest& r);
  Result<TxnResponse> txn(const TxnRequest& r);
  // A lease of `ttl_s` seconds; returns its id.
  Result<int64_t> leaseGrant(int64_t ttl_s);
  // Renews a lease; kNotFound once it has expired.
  Status leaseKeepAlive(int64_t id);
  Status leaseRevoke(int64_t id);
  // Forgets the history before `revision` (reads of older revisions then
  // fail with kTxnTooOld).
  Status compact(int64_t revision);
  // The answering member's database: (bytes on disk, bytes in use).
  Result<std::pair<int64_t, int64_t>> dbSize();
  const Options& options() const { return options_; }

 private:
  struct Endpoint;
  explicit Client(Options options);
  // POSTs `body` to `path`: the answer's body. `once`: not again on another
  // endpoint after a byte was sent (kCommitUnknown instead).
  Result<std::string> post(const char* path, const std::string& body, bool once);

  Options options_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::atomic<size_t> current_{0};
};

}  // namespace cistern::kv::etcd
