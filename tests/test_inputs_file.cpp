// The benchmark's inputs file (tools/inputs_file.hpp): read back exactly as made, and never used when it is damaged,
// short, or another problem's.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "cache/entry_store.hpp"
#include "tests/cache/test_util.hpp"  // dead_pid
#include "tools/inputs_file.hpp"

namespace fs = std::filesystem;
using smla::ref::Inputs;
using smla::ref::TopkKind;
using smla::tools::InputsSource;
using smla::tools::inputs_via_file;

namespace {

constexpr int kT = 40, kH = 4, kNkv = 72, kTopk = 48;
constexpr uint64_t kSeed = 7;

void expect_same(const Inputs& a, const Inputs& b) {
  EXPECT_EQ(a.T, b.T);
  EXPECT_EQ(a.H, b.H);
  EXPECT_EQ(a.num_kv, b.num_kv);
  EXPECT_EQ(a.topk_n, b.topk_n);
  EXPECT_EQ(a.has_sink, b.has_sink);
  EXPECT_EQ(a.scale, b.scale);
  EXPECT_EQ(a.q, b.q);
  EXPECT_EQ(a.kv, b.kv);
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.dout, b.dout);
  EXPECT_EQ(a.lse, b.lse);
  EXPECT_EQ(a.topk, b.topk);
  EXPECT_EQ(a.sink, b.sink);
  EXPECT_EQ(a.lse_excl, b.lse_excl);
}

class InputsFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("smla-inputs-test-" + std::to_string(::getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fresh_ = smla::ref::make_inputs(kT, kH, kNkv, kTopk, true, kSeed, TopkKind::Benchmark);
  }
  void TearDown() override { fs::remove_all(dir_); }
  Inputs get(InputsSource* src, bool sink = true, uint64_t seed = kSeed) {
    return inputs_via_file(dir_, kT, kH, kNkv, kTopk, sink, seed, TopkKind::Benchmark, src);
  }
  std::string dir_;
  Inputs fresh_;
};

TEST_F(InputsFile, SecondProcessReadsBackExactlyWhatTheFirstMade) {
  InputsSource first, second;
  expect_same(get(&first), fresh_);
  EXPECT_FALSE(first.from_file);
  EXPECT_EQ(first.note, "");
  ASSERT_TRUE(fs::is_regular_file(first.path)) << first.path;
  expect_same(get(&second), fresh_);
  EXPECT_TRUE(second.from_file);
  EXPECT_EQ(second.path, first.path);
  // Nothing but the file is left in the directory (the temporary was renamed into place).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(InputsFile, WithoutADirectoryTheInputsAreMadeAndNothingIsWritten) {
  InputsSource src;
  expect_same(inputs_via_file("", kT, kH, kNkv, kTopk, true, kSeed, TopkKind::Benchmark, &src), fresh_);
  EXPECT_FALSE(src.from_file);
  EXPECT_EQ(src.path, "");
}

TEST_F(InputsFile, AFlippedByteIsCaughtAndTheFileReplaced) {
  InputsSource first, damaged, again;
  get(&first);
  const auto size = fs::file_size(first.path);
  {
    std::fstream f(first.path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(size / 2);
    const char c = static_cast<char>(f.get());
    f.seekp(size / 2);
    f.put(static_cast<char>(c ^ 0x10));
  }
  expect_same(get(&damaged), fresh_);
  EXPECT_FALSE(damaged.from_file);
  EXPECT_NE(damaged.note.find("damaged"), std::string::npos) << damaged.note;
  get(&again);
  EXPECT_TRUE(again.from_file) << again.note;
}

TEST_F(InputsFile, AShortFileIsNotUsed) {
  InputsSource first, cut;
  get(&first);
  fs::resize_file(first.path, fs::file_size(first.path) / 3);
  expect_same(get(&cut), fresh_);
  EXPECT_FALSE(cut.from_file);
  EXPECT_NE(cut.note.find("short"), std::string::npos) << cut.note;
}

TEST_F(InputsFile, AnotherProblemsFileUnderThisNameIsNotUsed) {
  InputsSource other, mine;
  get(&other, true, kSeed + 1);  // another seed's file ...
  const std::string mine_path = dir_ + "/" + smla::tools::inputs_file_name(kT, kH, kNkv, kTopk, true, kSeed,
                                                                           TopkKind::Benchmark);
  fs::copy_file(other.path, mine_path);  // ... where this seed's would be
  expect_same(get(&mine), fresh_);
  EXPECT_FALSE(mine.from_file);
  EXPECT_NE(mine.note.find("another problem"), std::string::npos) << mine.note;
}

// A writer killed part way left its temp file (1.6 GB at the seed shape) for good. The next writer of the same file
// removes those whose owner is gone (this host, a dead pid, over 10 minutes old; or any owner's after an hour), and
// keeps a live writer's.
TEST_F(InputsFile, ATempFileOfAKilledWriterIsRemovedByTheNextWriter) {
  const std::string path = dir_ + "/" + smla::tools::inputs_file_name(kT, kH, kNkv, kTopk, true, kSeed,
                                                                      TopkKind::Benchmark);
  fs::create_directories(dir_);
  const std::string host = smla::cache::detail::host_name();
  const std::string dead = path + ".tmp." + host + "." + std::to_string(smla::cache::test::dead_pid()) + ".1a2b";
  const std::string dead_recent = path + ".tmp." + host + "." + std::to_string(smla::cache::test::dead_pid()) + ".3c";
  const std::string live = path + ".tmp." + host + "." + std::to_string(::getppid()) + ".4d";
  const std::string old_style = path + ".tmp." + std::to_string(smla::cache::test::dead_pid());  // before owner tags
  for (const auto& f : {dead, dead_recent, live, old_style}) std::ofstream(f) << "part of an inputs file";
  const auto age = [](const std::string& f, int seconds) {
    struct timespec t[2];
    ::clock_gettime(CLOCK_REALTIME, &t[0]);
    t[0].tv_sec -= seconds;
    t[1] = t[0];
    ASSERT_EQ(::utimensat(AT_FDCWD, f.c_str(), t, 0), 0) << f;
  };
  age(dead, 700);
  age(live, 700);
  age(old_style, 4000);
  InputsSource src;
  expect_same(get(&src), fresh_);
  EXPECT_FALSE(fs::exists(dead)) << "a dead writer's temp file was kept";
  EXPECT_FALSE(fs::exists(old_style)) << "an hour-old temp file without an owner was kept";
  EXPECT_TRUE(fs::exists(dead_recent)) << "a dead pid's file under 10 minutes old may be another namespace's";
  EXPECT_TRUE(fs::exists(live)) << "a live writer's temp file was removed";
  InputsSource again;
  expect_same(get(&again), fresh_);
  EXPECT_TRUE(again.from_file);
}

TEST_F(InputsFile, AnUnwritableDirectoryStillGivesTheInputsAndSaysWhy) {
  fs::create_directories(fs::path(dir_).parent_path());
  { std::ofstream(dir_) << "a file where the directory should be"; }
  InputsSource src;
  expect_same(get(&src), fresh_);
  EXPECT_FALSE(src.from_file);
  EXPECT_NE(src.note.find("cannot create"), std::string::npos) << src.note;
  fs::remove(dir_);
}

}  // namespace
