// Internal to libcistern's .cc files: the meta, mgmt and storage methods
// the client calls, and constants of the namespace it walks.
#pragma once

#include <string>

#include "net/method.h"

namespace cistern::client {

inline constexpr uint64_t kRootIno = 1;

inline net::Method metaMethod(const char* name) {
  return net::Method::of(std::string("cistern.meta.MetaService.") + name);
}

inline const net::Method& kLookup() {
  static const auto m = metaMethod("Lookup");
  return m;
}
inline const net::Method& kGetattr() {
  static const auto m = metaMethod("Getattr");
  return m;
}
inline const net::Method& kMkdir() {
  static const auto m = metaMethod("Mkdir");
  return m;
}
inline const net::Method& kCreate() {
  static const auto m = metaMethod("Create");
  return m;
}
inline const net::Method& kUnlink() {
  static const auto m = metaMethod("Unlink");
  return m;
}
inline const net::Method& kRmdir() {
  static const auto m = metaMethod("Rmdir");
  return m;
}
inline const net::Method& kRename() {
  static const auto m = metaMethod("Rename");
  return m;
}
inline const net::Method& kSetattr() {
  static const auto m = metaMethod("Setattr");
  return m;
}
inline const net::Method& kReaddir() {
  static const auto m = metaMethod("Readdir");
  return m;
}
inline const net::Method& kTenantCreate() {
  static const auto m = metaMethod("TenantCreate");
  return m;
}
inline const net::Method& kTenantList() {
  static const auto m = metaMethod("TenantList");
  return m;
}
inline const net::Method& kTenantRemove() {
  static const auto m = metaMethod("TenantRemove");
  return m;
}
inline const net::Method& kRevokeToken() {
  static const auto m = metaMethod("RevokeToken");
  return m;
}
inline const net::Method& kWhoAmI() {
  static const auto m = metaMethod("WhoAmI");
  return m;
}
inline const net::Method& kReserve() {
  static const auto m = metaMethod("Reserve");
  return m;
}
inline const net::Method& kQuotaSet() {
  static const auto m = metaMethod("QuotaSet");
  return m;
}
inline const net::Method& kQuotaGet() {
  static const auto m = metaMethod("QuotaGet");
  return m;
}
inline const net::Method& kQuotaList() {
  static const auto m = metaMethod("QuotaList");
  return m;
}
inline const net::Method& kCapability() {
  static const auto m = metaMethod("Capability");
  return m;
}
inline const net::Method& kOpen() {
  static const auto m = metaMethod("Open");
  return m;
}
inline const net::Method& kClose() {
  static const auto m = metaMethod("Close");
  return m;
}
inline const net::Method& kUninline() {
  static const auto m = metaMethod("Uninline");
  return m;
}
inline const net::Method& kRenew() {
  static const auto m = metaMethod("Renew");
  return m;
}
inline const net::Method& kMetaSync() {
  static const auto m = metaMethod("Sync");
  return m;
}
inline const net::Method& kStatfs() {
  static const auto m = metaMethod("Statfs");
  return m;
}
inline const net::Method& kGetRouting() {
  static const auto m = net::Method::of("cistern.mgmt.MgmtService.GetRouting");
  return m;
}
inline const net::Method& kShmDetach() {
  static const auto m = net::Method::of("cistern.storage.StorageService.ShmDetach");
  return m;
}
inline const net::Method& kSpace() {
  static const auto m = net::Method::of("cistern.storage.StorageService.Space");
  return m;
}

inline const net::Method& kMknod() {
  static const auto m = metaMethod("Mknod");
  return m;
}
inline const net::Method& kSymlink() {
  static const auto m = metaMethod("Symlink");
  return m;
}

inline const net::Method& kLink() {
  static const auto m = metaMethod("Link");
  return m;
}
inline const net::Method& kAccess() {
  static const auto m = metaMethod("Access");
  return m;
}
inline const net::Method& kSetXattr() {
  static const auto m = metaMethod("SetXattr");
  return m;
}
inline const net::Method& kGetXattr() {
  static const auto m = metaMethod("GetXattr");
  return m;
}
inline const net::Method& kListXattr() {
  static const auto m = metaMethod("ListXattr");
  return m;
}
inline const net::Method& kRemoveXattr() {
  static const auto m = metaMethod("RemoveXattr");
  return m;
}

inline const net::Method& kWrite() {
  static const auto m = net::Method::of("cistern.storage.StorageService.Write");
  return m;
}
inline const net::Method& kBatchRead() {
  static const auto m = net::Method::of("cistern.storage.StorageService.BatchRead");
  return m;
}
inline const net::Method& kShmAttach() {
  static const auto m = net::Method::of("cistern.storage.StorageService.ShmAttach");
  return m;
}
inline const net::Method& kLocate() {
  static const auto m = net::Method::of("cistern.storage.StorageService.Locate");
  return m;
}
inline const net::Method& kSync() {
  static const auto m = net::Method::of("cistern.storage.StorageService.Sync");
  return m;
}
inline const net::Method& kTruncate() {
  static const auto m = net::Method::of("cistern.storage.StorageService.Truncate");
  return m;
}
inline const net::Method& kRemove() {
  static const auto m = net::Method::of("cistern.storage.StorageService.Remove");
  return m;
}

}  // namespace cistern::client
