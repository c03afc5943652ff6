// cache_helper: one "rank" for the multi-process tests. Reads every knob from the environment
// (as the runtime does) and fetches `count` fake kernels.
//   cache_helper COUNT COMPILE_MS COMPILE_LOG [GO_FILE] [MARKER_FILE]
// Each compile appends "<kernel>\n" to COMPILE_LOG (O_APPEND: one write, so lines never mix) and
// touches MARKER_FILE first; with GO_FILE the helper appends one byte to GO_FILE.ready, then
// waits for GO_FILE, so that the test can release all ranks together once all are waiting.
// Prints "compiles=N disk=M publish_failures=P"; exits 3 if a binary is not the expected one.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "test_util.hpp"

using namespace smla::cache;

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: cache_helper COUNT COMPILE_MS COMPILE_LOG [GO_FILE] [MARKER]\n");
    return 2;
  }
  int count = std::atoi(argv[1]);
  int compile_ms = std::atoi(argv[2]);
  std::string log_file = argv[3];
  std::string go = argc > 4 ? argv[4] : "";
  std::string marker = argc > 5 ? argv[5] : "";
  if (!go.empty() && go != "-") {
    int fd = ::open((go + ".ready").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      (void)!::write(fd, "r", 1);
      ::close(fd);
    }
    test::wait_until([&] { return ::access(go.c_str(), F_OK) == 0; }, 30);
  }

  DiskCache cache(settings_from_env());
  for (int i = 0; i < count; ++i) {
    KeyFields f = test::fields("k" + std::to_string(i));
    auto compile = [&] {
      if (!marker.empty()) ::close(::open(marker.c_str(), O_WRONLY | O_CREAT, 0644));
      std::string line = f.kernel + "\n";
      int fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        (void)!::write(fd, line.data(), line.size());
        ::close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(compile_ms));
      return CompileOutput{test::payload(f), "fake"};
    };
    Fetched r = cache.get_or_compile(f, compile);
    if (r.binary != test::payload(f)) {
      std::fprintf(stderr, "wrong binary for %s\n", f.kernel.c_str());
      return 3;
    }
  }
  Stats s = cache.stats();
  std::printf("compiles=%lld disk=%lld publish_failures=%lld\n", (long long)s.compiles,
              (long long)s.disk_hits, (long long)s.publish_failures);
  return 0;
}
