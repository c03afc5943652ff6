// threads.hpp: the one way the library starts threads of its own (the CPU backend's blocks, the warm-up's and the
// hipRTC worker pool's compiles).
#pragma once
#include <thread>
#include <vector>

namespace smla {

/// Calls fn(i) for every i in [0, n): each i below n - 1 on a thread of its own as long as threads start, the rest,
/// n - 1 included, on the calling thread, which then joins the others. A thread that cannot start (a container's
/// pids limit, RLIMIT_NPROC: std::system_error; no memory for its state: std::bad_alloc) only leaves its i to the
/// calling thread: same calls, fewer threads. fn must not throw (an exception escaping a thread ends the process):
/// catch inside it and report after.
template <class Fn>
void on_threads(int n, Fn fn) {
  std::vector<std::thread> th;
  th.reserve(n > 1 ? size_t(n - 1) : 0);  // (before any thread: a throw here leaves nothing to join)
  int started = 0;
  for (; started < n - 1; ++started) {
    try {
      th.emplace_back(fn, started);  // reserved: a failure leaves th as it was
    } catch (...) {
      break;
    }
  }
  for (int i = started; i < n; ++i) fn(i);
  for (auto& t : th) t.join();
}

}  // namespace smla
