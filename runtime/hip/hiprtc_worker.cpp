// smla-hiprtc-worker: compiles one rendered source with hipRTC, in its own process.
//
//   smla-hiprtc-worker <request> <code-object-out> <log-out>
//
// The request is written by detail::write_request. Exit status: 0 compiled, 2 compile error
// (log written), 3 bad usage or I/O, 4 hipRTC unavailable. A hipRTC abort (unknown target,
// LLVM selection error) kills only this process; the parent reports the signal.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "hip_api.hpp"
#include "hiprtc_compiler.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: smla-hiprtc-worker <request> <code-object-out> <log-out>\n";
    return 3;
  }
  smla::RenderedSource src;
  std::string target;
  if (!smla::hip::detail::read_request(argv[1], &src, &target)) {
    std::cerr << "smla-hiprtc-worker: cannot read request " << argv[1] << "\n";
    return 3;
  }
  std::ofstream log(argv[3], std::ios::binary);
  std::string why;
  if (!smla::hip::Api::get(&why)) {
    log << why;
    return 4;
  }
  try {
    // The parent probed (or is probing) the target: probing here again would recurse.
    smla::hip::HipRtcCompiler compiler(/*probe_targets=*/false);
    smla::CompileResult r = compiler.compile(src, target);
    log << r.log;
    std::ofstream co(argv[2], std::ios::binary);
    co.write(reinterpret_cast<const char*>(r.binary.data()), static_cast<std::streamsize>(r.binary.size()));
    co.close();
    return co ? 0 : 3;
  } catch (const smla::Error& e) {
    log << e.message();
    return e.status() == smla::Status::CompileError ? 2 : 3;
  }
}
