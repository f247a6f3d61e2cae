// GroupCommit: batches keep queue order through both stages, each stage runs
// one batch at a time and overlaps the other, settled and failed entries
// finish with their status, in every way of running the stages.
#include "common/group_commit.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <thread>

namespace cistern {
namespace {

struct Item {
  uint64_t id = 0;
  uint64_t stage1_batch = 0;  // 1-based, in the order stage 1 ran them
  bool reached_stage2 = false;
  std::thread::id stage1_thread;
  GroupCommit::Entry entry;
};

class RecordingStages : public GroupCommit::Stages {
 public:
  size_t take_max = SIZE_MAX;
  std::chrono::microseconds pause{0};
  // Entries whose id this returns true for are settled in stage 1.
  std::function<bool(uint64_t)> refuse = [](uint64_t) { return false; };
  // Stage 1 fails for the batch of this number (0: never).
  uint64_t fail_batch = 0;

  std::atomic<int> in_stage1{0}, in_stage2{0};
  std::atomic<int> overlaps{0};
  std::atomic<bool> concurrent_same_stage{false};
  std::atomic<bool> out_of_order{false};
  uint64_t batches1 = 0;  // stage 1 runs one at a time: no lock needed
  uint64_t last_stage2_batch = 0;
  size_t largest_batch1 = 0;

  size_t take(const std::deque<GroupCommit::Entry*>& queued) override {
    return std::min(take_max, queued.size());
  }
  Status stage1(const std::vector<GroupCommit::Entry*>& batch) override {
    if (in_stage1.fetch_add(1) != 0) concurrent_same_stage = true;
    if (in_stage2.load() > 0) overlaps.fetch_add(1);
    const uint64_t n = ++batches1;
    largest_batch1 = std::max(largest_batch1, batch.size());
    for (auto* e : batch) {
      auto* item = static_cast<Item*>(e->item);
      item->stage1_batch = n;
      item->stage1_thread = std::this_thread::get_id();
      if (refuse(item->id)) {
        e->status = Status(ErrorCode::kTxnConflict, "refused");
        e->settled = true;
      }
    }
    std::this_thread::sleep_for(pause);
    in_stage1.fetch_sub(1);
    if (n == fail_batch) return Status(ErrorCode::kIOError, "stage 1 failed");
    return Status::OK();
  }
  Status stage2(const std::vector<GroupCommit::Entry*>& batch) override {
    if (in_stage2.fetch_add(1) != 0) concurrent_same_stage = true;
    if (in_stage1.load() > 0) overlaps.fetch_add(1);
    for (auto* e : batch) {
      auto* item = static_cast<Item*>(e->item);
      if (item->stage1_batch < last_stage2_batch || e->settled) out_of_order = true;
      last_stage2_batch = item->stage1_batch;
      item->reached_stage2 = true;
    }
    std::this_thread::sleep_for(pause);
    in_stage2.fetch_sub(1);
    return Status::OK();
  }
};

struct Mode {
  const char* name;
  GroupCommit::Options options;
};

class GroupCommitTest : public ::testing::TestWithParam<Mode> {};

// Commits `per_thread` items from each of `threads` threads; returns them.
std::vector<std::unique_ptr<Item>> commitFrom(GroupCommit& gc, int threads, int per_thread,
                                              std::vector<Status>* results) {
  std::vector<std::unique_ptr<Item>> items(static_cast<size_t>(threads * per_thread));
  results->assign(items.size(), Status::OK());
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        size_t k = static_cast<size_t>(t * per_thread + i);
        items[k] = std::make_unique<Item>();
        items[k]->id = k;
        items[k]->entry.item = items[k].get();
        (*results)[k] = gc.commit(items[k]->entry);
      }
    });
  }
  for (auto& t : ts) t.join();
  return items;
}

TEST_P(GroupCommitTest, BatchesKeepTheirOrderAndTheStagesOverlap) {
  RecordingStages stages;
  stages.pause = std::chrono::microseconds(200);
  GroupCommit gc(&stages, GetParam().options);
  std::vector<Status> results;
  auto items = commitFrom(gc, 8, 100, &results);
  for (size_t k = 0; k < items.size(); ++k) {
    EXPECT_TRUE(results[k].ok()) << results[k].toString();
    EXPECT_TRUE(items[k]->reached_stage2) << k;
  }
  EXPECT_FALSE(stages.concurrent_same_stage) << "a stage ran two batches at once";
  EXPECT_FALSE(stages.out_of_order) << "stage 2 saw batches out of stage 1's order";
  EXPECT_GT(stages.overlaps.load(), 0) << "stage 1 never overlapped stage 2";
  EXPECT_LT(stages.batches1, items.size()) << "no two commits ever shared a batch";
}

TEST_P(GroupCommitTest, SettledAndFailedEntriesFinishWithTheirStatus) {
  RecordingStages stages;
  stages.refuse = [](uint64_t id) { return id % 3 == 0; };
  stages.fail_batch = 5;
  stages.take_max = 2;
  GroupCommit gc(&stages, GetParam().options);
  std::vector<Status> results;
  auto items = commitFrom(gc, 4, 50, &results);
  size_t failed = 0;
  for (size_t k = 0; k < items.size(); ++k) {
    const Item& item = *items[k];
    if (item.id % 3 == 0) {
      EXPECT_EQ(results[k].code(), ErrorCode::kTxnConflict) << k;
      EXPECT_FALSE(item.reached_stage2) << k;
    } else if (item.stage1_batch == 5) {
      EXPECT_EQ(results[k].code(), ErrorCode::kIOError) << k;
      EXPECT_FALSE(item.reached_stage2) << k;
      ++failed;
    } else {
      EXPECT_TRUE(results[k].ok()) << k << ": " << results[k].toString();
      EXPECT_TRUE(item.reached_stage2) << k;
    }
  }
  EXPECT_LE(stages.largest_batch1, 2u) << "take() bounds a batch";
  EXPECT_FALSE(stages.out_of_order);
}

// A lone committer runs its batch on its own thread, with or without the
// stage-1 thread (no wake-ups).
TEST_P(GroupCommitTest, ALoneCommitterRunsItsOwnBatch) {
  RecordingStages stages;
  GroupCommit gc(&stages, GetParam().options);
  for (uint64_t i = 0; i < 100; ++i) {
    Item item;
    item.id = i;
    item.entry.item = &item;
    ASSERT_TRUE(gc.commit(item.entry).ok());
    EXPECT_EQ(item.stage1_thread, std::this_thread::get_id()) << i;
    EXPECT_TRUE(item.reached_stage2);
  }
  EXPECT_EQ(stages.batches1, 100u);
}

GroupCommit::Options withThread(GroupCommit::Stage2Runner runner) {
  GroupCommit::Options o;
  o.stage1_thread = true;
  o.stage2_runner = runner;
  return o;
}

INSTANTIATE_TEST_SUITE_P(
    Modes, GroupCommitTest,
    ::testing::Values(Mode{"committers", {}},
                      Mode{"thread_auto", withThread(GroupCommit::Stage2Runner::kAuto)},
                      Mode{"thread_runs_stage2",
                           withThread(GroupCommit::Stage2Runner::kStage1Thread)},
                      Mode{"thread_hands_off", withThread(GroupCommit::Stage2Runner::kHandoff)}),
    [](const ::testing::TestParamInfo<Mode>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace cistern
