// The one list of cistern error codes, grouped by subsystem.
//
// Each entry is X(Name, value, errno, "description"). Values are stable: they
// travel in RPC frames and are persisted in idempotency records, so a code is
// never renumbered or reused. Add a code only where a caller reacts to it
// differently from every existing one (FoundationDB's rule); otherwise reuse
// the closest code and say what happened in the message.
//
// Ranges: 0 ok, 1-99 common, 100-199 net/rpc, 200-299 kv, 300-399 meta,
// 400-499 storage, 500-599 mgmtd, 600-699 client, 700-799 auth.
#pragma once

// clang-format off
#define CISTERN_ERROR_CODES(X)                                                        \
  X(kOk,                   0,   0,            "ok")                                 \
  /* common */                                                                        \
  X(kInternal,             1,   EIO,          "internal error")                     \
  X(kInvalidArgument,      2,   EINVAL,       "invalid argument")                   \
  X(kNotFound,             3,   ENOENT,       "not found")                          \
  X(kAlreadyExists,        4,   EEXIST,       "already exists")                     \
  X(kPermissionDenied,     5,   EACCES,       "permission denied")                  \
  X(kIOError,              6,   EIO,          "I/O error")                          \
  X(kNoSpace,              7,   ENOSPC,       "no space left")                      \
  X(kCorruption,           8,   EIO,          "data corruption")                    \
  X(kNotSupported,         9,   ENOTSUP,      "not supported")                      \
  X(kResourceExhausted,    10,  EAGAIN,       "resource exhausted")                 \
  X(kTimeout,              11,  ETIMEDOUT,    "timed out")                          \
  X(kCancelled,            12,  ECANCELED,    "cancelled")                          \
  X(kConfigInvalid,        13,  EINVAL,       "invalid configuration")              \
  X(kFaultInjected,        14,  EIO,          "injected fault")                     \
  X(kShuttingDown,         15,  ESHUTDOWN,    "shutting down")                      \
  /* net / rpc */                                                                     \
  X(kConnectionFailed,     100, ENOTCONN,     "connection failed")                  \
  X(kConnectionClosed,     101, ECONNRESET,   "connection closed")                  \
  X(kBadFrame,             102, EPROTO,       "malformed frame")                    \
  X(kUnknownMethod,        103, ENOSYS,       "unknown RPC method")                 \
  X(kDeadlineExceeded,     104, ETIMEDOUT,    "deadline exceeded")                  \
  X(kBadMessage,           105, EBADMSG,      "malformed message")                  \
  X(kPayloadTooLarge,      106, EMSGSIZE,     "payload too large")                  \
  /* kv */                                                                            \
  X(kTxnConflict,          200, EAGAIN,       "transaction conflict")               \
  X(kTxnTooOld,            201, EAGAIN,       "transaction too old")                \
  X(kTxnRetriesExhausted,  202, EBUSY,        "transaction retries exhausted")      \
  X(kTxnTooLarge,          203, E2BIG,        "transaction too large")              \
  X(kTxnReadOnly,          204, EROFS,        "write in a read-only transaction")   \
  X(kTxnFinished,          205, EINVAL,       "transaction already committed")      \
  X(kKeyTooLarge,          206, ENAMETOOLONG, "key too large")                      \
  X(kValueTooLarge,        207, E2BIG,        "value too large")                    \
  X(kKeyDecode,            208, EINVAL,       "malformed key")                      \
  X(kCommitUnknown,        209, EIO,          "commit outcome unknown")             \
  /* meta */                                                                          \
  X(kNotDirectory,         300, ENOTDIR,      "not a directory")                    \
  X(kIsDirectory,          301, EISDIR,       "is a directory")                     \
  X(kNotEmpty,             302, ENOTEMPTY,    "directory not empty")                \
  X(kNameTooLong,          303, ENAMETOOLONG, "file name too long")                 \
  X(kNotPermitted,         304, EPERM,        "operation not permitted")            \
  X(kTooManyLinks,         305, EMLINK,       "too many links")                     \
  X(kNoAttribute,          306, ENODATA,      "no such attribute")                  \
  X(kRangeError,           307, ERANGE,       "result does not fit")                \
  X(kInlineRefused,        308, EIO,          "inline file data: convert it first") \
  X(kInodeBusy,            309, EBUSY,        "inode busy: its data is being moved") \
  X(kFileTooLarge,         310, EFBIG,        "file too large")                     \
  X(kCrossTenant,          311, EXDEV,        "rename or link across tenants")      \
  X(kQuotaExceeded,        312, EDQUOT,       "quota exceeded")                     \
  X(kCrossQuota,           313, EXDEV,        "directory moved across quotas")      \
  /* storage (400-499) */                                                            \
  X(kStaleChainVersion,    400, ESTALE,       "stale chain version")                \
  X(kTargetBusy,           401, EAGAIN,       "storage target busy")                \
  X(kLeaseExpired,         402, ETIMEDOUT,    "the caller's lease ran out")          \
  X(kChunkNotCommitted,    403, EAGAIN,       "chunk has an uncommitted version")   \
  X(kChunkVersionMismatch, 404, ESTALE,       "replica holds another chunk version") \
  X(kNotServing,           405, EAGAIN,       "target not serving this chain")      \
  /* mgmtd (500-599) */                                                              \
  X(kNotPrimary,           500, EAGAIN,       "not the primary mgmtd")               \
  /* auth (700-799): each refusal its own code, counted apart */                      \
  X(kTokenMissing,         700, EACCES,       "no token")                           \
  X(kTokenInvalid,         701, EKEYREJECTED, "token malformed or forged")          \
  X(kTokenExpired,         702, EKEYEXPIRED,  "token expired")                      \
  X(kTokenRevoked,         703, EKEYREVOKED,  "token revoked")                      \
  X(kWrongTenant,          704, EACCES,       "outside the caller's tenant")        \
  X(kTokenReadOnly,        705, EROFS,        "the token does not allow writing")   \
  X(kTokenNotAdmin,        706, EPERM,        "the token is not an admin's")        \
  X(kCapabilityRefused,    707, EACCES,       "capability does not cover the call")
// clang-format on
