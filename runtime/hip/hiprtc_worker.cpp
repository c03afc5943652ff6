// smla-hiprtc-worker: compiles one rendered source with hipRTC, in its own process.
//
//   smla-hiprtc-worker [--status <status-out>] [--parent <pid>] <request> <code-object-out> <log-out>
//
// The request is written by detail::write_request. Exit status: 0 compiled, 2 compile error
// (log written: hipRTC refused the source or the target), 3 bad usage or an unreadable request (another smla
// version's), 4 hipRTC unavailable, 5 its parent is gone, 6 hipRTC or this process failed outside the compile itself
// (creating the program, copying the code out, out of memory: log written), 7 compiled but its code object or log
// could not be written (a full or unwritable temporary directory); 6 and 7 say nothing of the source or the target. A hipRTC abort
// (unknown target, LLVM selection error) kills only this process; the parent reports the signal.
// The worker dies with its parent (PR_SET_PDEATHSIG: SIGKILL): an interrupted parent leaves no
// compile running. With --parent, it first checks that its parent is still that process (it may
// have died before the death signal was armed) and exits 5 otherwise.
// With --status, the exit status is also written to <status-out> ("<code>\n"), last, after every
// other output is closed: a parent that cannot collect the exit status (its SIGCHLD is ignored)
// judges the worker by that file, and a worker that died wrote none.
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include "hip_api.hpp"
#include "hiprtc_compiler.hpp"

namespace {

struct Args {
  const char* status = nullptr;
  long parent = 0;
  const char* request = nullptr;
  const char* code_object = nullptr;
  const char* log = nullptr;
};

bool parse(int argc, char** argv, Args* a) {
  int i = 1;
  for (; i + 1 < argc && std::strncmp(argv[i], "--", 2) == 0; i += 2) {
    if (std::strcmp(argv[i], "--status") == 0) {
      a->status = argv[i + 1];
    } else if (std::strcmp(argv[i], "--parent") == 0) {
      char* end = nullptr;
      a->parent = std::strtol(argv[i + 1], &end, 10);
      if (*end || a->parent <= 0) return false;
    } else {
      return false;
    }
  }
  if (argc - i != 3) return false;
  a->request = argv[i];
  a->code_object = argv[i + 1];
  a->log = argv[i + 2];
  return true;
}

int compile(const Args& a) {
  smla::RenderedSource src;
  std::string target;
  std::vector<std::string> options;
  if (!smla::hip::detail::read_request(a.request, &src, &target, &options)) {
    std::cerr << "smla-hiprtc-worker: cannot read request " << a.request << " (not a \""
              << smla::hip::detail::kRequestFormat << "\" request: a library of another smla version?)\n";
    return 3;
  }
  std::ofstream log(a.log, std::ios::binary);
  std::string why;
  if (!smla::hip::Api::get(&why)) {
    log << why;
    return 4;
  }
  try {
    // The parent probed (or is probing) the target: probing here again would recurse.
    smla::hip::HipRtcCompiler compiler(/*probe_targets=*/false);
    smla::CompileResult r = compiler.compile_with(src, target, options);
    log << r.log;
    std::ofstream co(a.code_object, std::ios::binary);
    co.write(reinterpret_cast<const char*>(r.binary.data()), static_cast<std::streamsize>(r.binary.size()));
    co.close();
    log.close();
    if (!co || !log) {
      std::cerr << "smla-hiprtc-worker: compiled, but cannot write " << (!co ? a.code_object : a.log)
                << " (is its directory full or unwritable?)\n";
      return 7;
    }
    return 0;
  } catch (const smla::Error& e) {
    log << e.message();
    log.close();
    // Only the compile's own verdict (and an empty code object) is the source's or the target's: a parent's probe
    // takes exit 2 for "this hipRTC cannot compile for the target" for the rest of its life.
    const bool verdict = e.call() == "hiprtcCompileProgram" || e.call() == "hiprtcGetCode";
    return e.status() == smla::Status::CompileError ? (verdict ? 2 : 6) : 3;
  } catch (const std::exception& e) {  // std::bad_alloc and the like: not a crash of hipRTC (SIGABRT is read as one)
    log << "smla-hiprtc-worker: " << e.what();
    log.close();
    return 6;
  }
}

// Written whole or not at all (rename), so a half-written status is never read.
void write_status(const char* path, int code) {
  const std::string tmp = std::string(path) + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary);
    f << code << '\n';
    f.close();
    if (!f) return;
  }
  std::rename(tmp.c_str(), path);
}

}  // namespace

int main(int argc, char** argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // before anything that could block
  Args a;
  if (!parse(argc, argv, &a)) {
    std::cerr << "usage: smla-hiprtc-worker [--status <status-out>] [--parent <pid>] <request> <code-object-out> "
                 "<log-out>\n";
    return 3;
  }
  if (a.parent && getppid() != static_cast<pid_t>(a.parent)) {
    std::cerr << "smla-hiprtc-worker: parent " << a.parent << " is gone\n";
    return 5;
  }
  const int code = compile(a);
  if (a.status) write_status(a.status, code);
  return code;
}
