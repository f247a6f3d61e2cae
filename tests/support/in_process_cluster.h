// Test support: an in-process cluster (server::LocalCluster, one target,
// unsynced) in a fresh temporary directory, with a Client connected to it,
// for tests of the libraries built over libcistern (packs, checkpoints).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "cistern/client.h"
#include "server/local_cluster.h"

namespace cistern::testing {

class InProcessCluster {
 public:
  // `name` names the temporary directory; false (with a gtest failure) when
  // the cluster does not start or the client does not connect.
  bool start(const std::string& name) {
    dir_ = std::filesystem::temp_directory_path() /
           ("cistern-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    server::LocalClusterOptions o;
    o.data_dir = dir_.string();
    o.sync = false;
    auto c = server::LocalCluster::start(o);
    EXPECT_TRUE(c.ok()) << c.status().toString();
    if (!c.ok()) return false;
    cluster_ = std::move(*c);
    Client::Options co;
    co.cluster = cluster_->endpoint().toString();
    auto [client, err] = Client::connect(co);
    EXPECT_FALSE(err) << err.message;
    client_ = std::move(client);
    return client_ != nullptr;
  }
  ~InProcessCluster() {
    client_.reset();
    cluster_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  Client& client() { return *client_; }
  server::LocalCluster& cluster() { return *cluster_; }
  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  std::unique_ptr<server::LocalCluster> cluster_;
  std::unique_ptr<Client> client_;
};

}  // namespace cistern::testing
