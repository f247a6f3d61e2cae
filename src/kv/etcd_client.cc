// etcd v3 over its JSON gateway (etcd_client.h).
#include "kv/etcd_client.h"

#include <curl/curl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <functional>

#include "common/base64.h"

namespace cistern::kv::etcd {
namespace {

using nlohmann::json;

const char* const kTargets[] = {"MOD", "CREATE", "VERSION", "VALUE"};
const char* const kResults[] = {"EQUAL", "GREATER", "LESS", "NOT_EQUAL"};

json rangeJson(const RangeRequest& r) {
  json j = {{"key", base64Encode(r.key)}};
  if (!r.range_end.empty()) j["range_end"] = base64Encode(r.range_end);
  if (r.revision > 0) j["revision"] = std::to_string(r.revision);
  if (r.limit > 0) j["limit"] = std::to_string(r.limit);
  if (r.descend) {
    j["sort_order"] = "DESCEND";
    j["sort_target"] = "KEY";
  }
  if (r.keys_only) j["keys_only"] = true;
  return j;
}

json txnJson(const TxnRequest& r);

json opJson(const Op& op) {
  switch (op.kind) {
    case Op::kPut: {
      json p = {{"key", base64Encode(op.key)}, {"value", base64Encode(op.value)}};
      if (op.lease != 0) p["lease"] = std::to_string(op.lease);
      return {{"request_put", p}};
    }
    case Op::kDeleteRange: {
      json d = {{"key", base64Encode(op.key)}};
      if (!op.range_end.empty()) d["range_end"] = base64Encode(op.range_end);
      return {{"request_delete_range", d}};
    }
    case Op::kRange:
      return {{"request_range", rangeJson(op.range)}};
    case Op::kTxn:
      return {{"request_txn", op.txn ? txnJson(*op.txn) : json::object()}};
  }
  return json::object();
}

json txnJson(const TxnRequest& r) {
  json compare = json::array();
  for (const Compare& c : r.compare) {
    json j = {{"key", base64Encode(c.key)},
              {"target", kTargets[c.target]},
              {"result", kResults[c.result]}};
    if (!c.range_end.empty()) j["range_end"] = base64Encode(c.range_end);
    switch (c.target) {
      case Compare::kMod:
        j["mod_revision"] = std::to_string(c.number);
        break;
      case Compare::kCreate:
        j["create_revision"] = std::to_string(c.number);
        break;
      case Compare::kVersion:
        j["version"] = std::to_string(c.number);
        break;
      case Compare::kValue:
        j["value"] = base64Encode(c.value);
        break;
    }
    compare.push_back(std::move(j));
  }
  json success = json::array(), failure = json::array();
  for (const Op& op : r.success) success.push_back(opJson(op));
  for (const Op& op : r.failure) failure.push_back(opJson(op));
  return {{"compare", compare}, {"success", success}, {"failure", failure}};
}

// int64 fields come as JSON strings (proto3's JSON mapping); absent is 0.
Result<int64_t> int64Of(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return int64_t{0};
  if (it->is_number_integer()) return it->get<int64_t>();
  if (!it->is_string())
    return Status(ErrorCode::kBadMessage, fmt::format("etcd answer: {} is not a number", name));
  const std::string& s = it->get_ref<const std::string&>();
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (...) {
    used = 0;
  }
  if (used == 0 || used != s.size())
    return Status(ErrorCode::kBadMessage, fmt::format("etcd answer: {} is not a number", name));
  return v;
}

Result<std::string> bytesOf(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end()) return std::string();
  if (!it->is_string())
    return Status(ErrorCode::kBadMessage, fmt::format("etcd answer: {} is not base64", name));
  auto bytes = base64Decode(it->get_ref<const std::string&>());
  if (!bytes)
    return Status(ErrorCode::kBadMessage, fmt::format("etcd answer: {} is not base64", name));
  return std::move(*bytes);
}

Result<int64_t> revisionOf(const json& j) {
  auto h = j.find("header");
  if (h == j.end() || !h->is_object()) return int64_t{0};
  return int64Of(*h, "revision");
}

Result<RangeResponse> rangeOf(const json& j) {
  if (!j.is_object()) return Status(ErrorCode::kBadMessage, "etcd answer: a range is no object");
  RangeResponse r;
  ASSIGN_OR_RETURN(r.revision, revisionOf(j));
  if (auto kvs = j.find("kvs"); kvs != j.end()) {
    if (!kvs->is_array()) return Status(ErrorCode::kBadMessage, "etcd answer: kvs is no array");
    for (const json& e : *kvs) {
      if (!e.is_object()) return Status(ErrorCode::kBadMessage, "etcd answer: a kv is no object");
      KeyValue kv;
      ASSIGN_OR_RETURN(kv.key, bytesOf(e, "key"));
      ASSIGN_OR_RETURN(kv.value, bytesOf(e, "value"));
      ASSIGN_OR_RETURN(kv.create_revision, int64Of(e, "create_revision"));
      ASSIGN_OR_RETURN(kv.mod_revision, int64Of(e, "mod_revision"));
      r.kvs.push_back(std::move(kv));
    }
  }
  if (auto more = j.find("more"); more != j.end()) r.more = more->is_boolean() && more->get<bool>();
  return r;
}

Result<TxnResponse> txnOf(const json& j, int depth) {
  if (!j.is_object()) return Status(ErrorCode::kBadMessage, "etcd answer: a txn is no object");
  if (depth > 8) return Status(ErrorCode::kBadMessage, "etcd answer: txns nested too deep");
  TxnResponse t;
  ASSIGN_OR_RETURN(t.revision, revisionOf(j));
  if (auto s = j.find("succeeded"); s != j.end()) t.succeeded = s->is_boolean() && s->get<bool>();
  if (auto rs = j.find("responses"); rs != j.end()) {
    if (!rs->is_array())
      return Status(ErrorCode::kBadMessage, "etcd answer: responses is no array");
    for (const json& r : *rs) {
      if (!r.is_object())
        return Status(ErrorCode::kBadMessage, "etcd answer: a response is no object");
      OpResponse op;
      if (auto range = r.find("response_range"); range != r.end()) {
        ASSIGN_OR_RETURN(op.range, rangeOf(*range));
      } else if (auto txn = r.find("response_txn"); txn != r.end()) {
        ASSIGN_OR_RETURN(auto nested, txnOf(*txn, depth + 1));
        op.txn = std::make_shared<TxnResponse>(std::move(nested));
      }
      t.responses.push_back(std::move(op));
    }
  }
  return t;
}

Result<json> parseJson(std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return Status(ErrorCode::kBadMessage, "etcd answer is not a JSON object");
  RETURN_ON_ERROR(errorOf(body));
  return j;
}

bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

}  // namespace

std::string toJson(const RangeRequest& r) { return rangeJson(r).dump(); }
std::string toJson(const TxnRequest& r) { return txnJson(r).dump(); }

Status errorOf(std::string_view body) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::OK();
  auto e = j.find("error");
  if (e == j.end()) e = j.find("message");
  if (e == j.end() || !e->is_string()) return Status::OK();
  const std::string& m = e->get_ref<const std::string&>();
  const std::string what = "etcd: " + m;
  if (contains(m, "required revision has been compacted") ||
      contains(m, "required revision is a future revision"))
    return Status(ErrorCode::kTxnTooOld, what);
  if (contains(m, "too many operations in txn request"))
    return Status(ErrorCode::kTxnTooLarge, what + " (etcd's --max-txn-ops)");
  if (contains(m, "request is too large"))
    return Status(ErrorCode::kTxnTooLarge, what + " (etcd's --max-request-bytes)");
  if (contains(m, "requested lease not found")) return Status(ErrorCode::kNotFound, what);
  // Proposed, and then no answer: it may yet apply.
  if (contains(m, "request timed out") || contains(m, "leader changed") || contains(m, "timed out"))
    return Status(ErrorCode::kCommitUnknown, what);
  // Refused before it was proposed: another member may take it.
  if (contains(m, "no leader") || contains(m, "not capable") || contains(m, "stopped") ||
      contains(m, "too many requests") || contains(m, "unhealthy"))
    return Status(ErrorCode::kConnectionFailed, what);
  return Status(ErrorCode::kIOError, what);
}

Result<RangeResponse> parseRange(std::string_view body) {
  ASSIGN_OR_RETURN(json j, parseJson(body));
  return rangeOf(j);
}

Result<TxnResponse> parseTxn(std::string_view body) {
  ASSIGN_OR_RETURN(json j, parseJson(body));
  return txnOf(j, 0);
}

Result<std::pair<int64_t, int64_t>> parseLease(std::string_view body) {
  ASSIGN_OR_RETURN(json j, parseJson(body));
  // A keep-alive answers {"result": {...}} (a stream of one message).
  const json& l = j.contains("result") && j["result"].is_object() ? j["result"] : j;
  ASSIGN_OR_RETURN(int64_t id, int64Of(l, "ID"));
  ASSIGN_OR_RETURN(int64_t ttl, int64Of(l, "TTL"));
  return std::make_pair(id, ttl);
}

namespace {

size_t appendBody(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

struct CurlHandleDeleter {
  void operator()(CURL* h) const { curl_easy_cleanup(h); }
};
using CurlHandle = std::unique_ptr<CURL, CurlHandleDeleter>;

struct HeaderListDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

}  // namespace

// One member's URL and a pool of libcurl handles, each keeping its
// connection alive.
struct Client::Endpoint {
  std::string name;  // host:port
  std::mutex mu;
  std::vector<CurlHandle> idle;

  CurlHandle take() {
    std::lock_guard lock(mu);
    if (idle.empty()) return CurlHandle(curl_easy_init());
    CurlHandle h = std::move(idle.back());
    idle.pop_back();
    return h;
  }
  void give(CurlHandle h, uint32_t max) {
    std::lock_guard lock(mu);
    if (idle.size() < max) idle.push_back(std::move(h));
  }
};

Client::Client(Options options) : options_(std::move(options)) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::create(const Options& options) {
  static const CURLcode init = curl_global_init(CURL_GLOBAL_DEFAULT);
  if (init != CURLE_OK)
    return Status(ErrorCode::kInternal, fmt::format("libcurl: {}", curl_easy_strerror(init)));
  if (options.endpoints.empty())
    return Status(ErrorCode::kInvalidArgument, "etcd: no endpoints given");
  std::unique_ptr<Client> c(new Client(options));
  for (const std::string& e : options.endpoints) {
    std::string_view v = e;
    if (v.starts_with("http://")) v.remove_prefix(7);
    while (v.ends_with('/')) v.remove_suffix(1);
    const size_t colon = v.rfind(':');
    int port = 0;
    if (colon != std::string_view::npos) {
      try {
        port = std::stoi(std::string(v.substr(colon + 1)));
      } catch (...) {
        port = 0;
      }
    }
    if (colon == std::string_view::npos || colon == 0 || port <= 0 || port > 65535)
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("etcd endpoint {:?}: not host:port (e.g. 127.0.0.1:2379)", e));
    auto ep = std::make_unique<Endpoint>();
    ep->name = std::string(v);
    c->endpoints_.push_back(std::move(ep));
  }
  return c;
}

Result<std::string> Client::post(const char* path, const std::string& body, bool once) {
  static const std::unique_ptr<curl_slist, HeaderListDeleter> headers(
      curl_slist_append(nullptr, "Content-Type: application/json"));
  const size_t n = endpoints_.size();
  const size_t start = current_.load(std::memory_order_relaxed);
  Status last(ErrorCode::kConnectionFailed, "etcd: no endpoint reachable");
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (start + k) % n;
    Endpoint& ep = *endpoints_[i];
    CurlHandle h = ep.take();
    if (!h) return Status(ErrorCode::kResourceExhausted, "libcurl: no handle");
    const std::string url = fmt::format("http://{}{}", ep.name, path);
    std::string answer;
    curl_easy_setopt(h.get(), CURLOPT_URL, url.c_str());
    curl_easy_setopt(h.get(), CURLOPT_POST, 1L);
    curl_easy_setopt(h.get(), CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(h.get(), CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(h.get(), CURLOPT_HTTPHEADER, headers.get());
    curl_easy_setopt(h.get(), CURLOPT_WRITEFUNCTION, appendBody);
    curl_easy_setopt(h.get(), CURLOPT_WRITEDATA, &answer);
    curl_easy_setopt(h.get(), CURLOPT_TIMEOUT_MS, static_cast<long>(options_.timeout_ms));
    curl_easy_setopt(h.get(), CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(std::min<uint32_t>(options_.timeout_ms, 2000)));
    curl_easy_setopt(h.get(), CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h.get(), CURLOPT_TCP_NODELAY, 1L);
    const CURLcode rc = curl_easy_perform(h.get());
    if (rc != CURLE_OK) {
      const std::string why = fmt::format("etcd {}{}: {}", ep.name, path, curl_easy_strerror(rc));
      // Not connected: nothing was sent. Anything later: a transaction may
      // have reached etcd and applied.
      const bool unsent = rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST;
      if (!unsent && once)
        return Status(ErrorCode::kCommitUnknown,
                      why + " after the request was sent: it may or may not have committed");
      last = Status(ErrorCode::kConnectionFailed, why);
      continue;  // the handle goes: its connection is in doubt
    }
    long status = 0;
    curl_easy_getinfo(h.get(), CURLINFO_RESPONSE_CODE, &status);
    ep.give(std::move(h), options_.connections);
    current_.store(i, std::memory_order_relaxed);
    Status e = errorOf(answer);
    if (e.ok() && status != 200)
      e = Status(ErrorCode::kIOError, fmt::format("etcd {}{}: HTTP {}", ep.name, path, status));
    if (e.ok()) return answer;
    if (e.code() == ErrorCode::kConnectionFailed) {  // refused before it was proposed
      last = e;
      continue;
    }
    // "leader changed", "request timed out": a read or a lease call may go
    // to the next member (a transaction's outcome is the caller's to settle).
    if (e.code() == ErrorCode::kCommitUnknown && !once) {
      last = Status(ErrorCode::kConnectionFailed, e.message());
      continue;
    }
    return e;
  }
  return last;
}

Result<RangeResponse> Client::range(const RangeRequest& r) {
  ASSIGN_OR_RETURN(std::string body, post("/v3/kv/range", toJson(r), false));
  return parseRange(body);
}

Result<TxnResponse> Client::txn(const TxnRequest& r) {
  // Only one that may write is sent once (its outcome is then the caller's
  // to settle); one of reads only may go to the next member like a range.
  std::function<bool(const std::vector<Op>&)> writes = [&](const std::vector<Op>& ops) {
    for (const Op& op : ops)
      if (op.kind == Op::kPut || op.kind == Op::kDeleteRange ||
          (op.kind == Op::kTxn && op.txn && (writes(op.txn->success) || writes(op.txn->failure))))
        return true;
    return false;
  };
  const bool once = writes(r.success) || writes(r.failure);
  ASSIGN_OR_RETURN(std::string body, post("/v3/kv/txn", toJson(r), once));
  return parseTxn(body);
}

Result<int64_t> Client::leaseGrant(int64_t ttl_s) {
  json j = {{"TTL", std::to_string(ttl_s)}};
  ASSIGN_OR_RETURN(std::string body, post("/v3/lease/grant", j.dump(), false));
  ASSIGN_OR_RETURN(auto lease, parseLease(body));
  return lease.first;
}

Status Client::leaseKeepAlive(int64_t id) {
  json j = {{"ID", std::to_string(id)}};
  ASSIGN_OR_RETURN(std::string body, post("/v3/lease/keepalive", j.dump(), false));
  ASSIGN_OR_RETURN(auto lease, parseLease(body));
  if (lease.second <= 0)
    return Status(ErrorCode::kNotFound, fmt::format("etcd lease {:x} has expired", id));
  return Status::OK();
}

Status Client::leaseRevoke(int64_t id) {
  json j = {{"ID", std::to_string(id)}};
  return post("/v3/lease/revoke", j.dump(), false).status();
}

Result<std::pair<int64_t, int64_t>> Client::dbSize() {
  ASSIGN_OR_RETURN(std::string body, post("/v3/maintenance/status", "{}", false));
  ASSIGN_OR_RETURN(json j, parseJson(body));
  ASSIGN_OR_RETURN(int64_t size, int64Of(j, "dbSize"));
  ASSIGN_OR_RETURN(int64_t in_use, int64Of(j, "dbSizeInUse"));
  return std::make_pair(size, in_use);
}

Status Client::compact(int64_t revision) {
  json j = {{"revision", std::to_string(revision)}, {"physical", true}};
  return post("/v3/kv/compaction", j.dump(), false).status();
}

}  // namespace cistern::kv::etcd
