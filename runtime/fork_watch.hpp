// fork_watch.hpp: whether this process was forked from the one that initialised a GPU runtime. Neither the CUDA
// driver nor the HIP runtime survives a fork; each backend arms its own watch (a Tag type) once its runtime is up,
// and asks it on its paths at the cost of one relaxed load (run() makes no system call for it).
#pragma once
#include <pthread.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>

namespace smla {

template <class Tag>
class ForkWatch {
 public:
  /// Called once, when the runtime was initialised in this process: its pid, and a fork handler that marks children.
  static void arm() {
    init_pid_.store(::getpid(), std::memory_order_relaxed);
    ::pthread_atfork(nullptr, nullptr, [] { forked_.store(true, std::memory_order_relaxed); });
  }
  /// This process is a child forked after arm() (in the process that armed it, or in one of its children).
  static bool forked() { return forked_.load(std::memory_order_relaxed); }
  /// The process that armed it (0: not armed).
  static pid_t init_pid() { return init_pid_.load(std::memory_order_relaxed); }

 private:
  static inline std::atomic<bool> forked_{false};
  static inline std::atomic<pid_t> init_pid_{0};
};

}  // namespace smla
