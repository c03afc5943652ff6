// tool_main.hpp: what the command-line tools share: the one way a tool reports a failure ("<tool>: <message>" on
// stderr and exit code 2, "could not run"; 1 is left for "ran, but something failed", which a tool may also give an
// error thrown by its work once its options were sound), and the one-problem --shape of smla-bench and smla-seqpar.
#pragma once
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_parse.hpp"  // beside this file: flush_stdout
#include "runtime/check.hpp"
#include "runtime/warmup.hpp"
#include "smla/smla.hpp"

namespace smla::tools {

/// A tool's JSON output: a path or message that is not UTF-8 (a library path from the environment, a file name) is
/// written with U+FFFD in its place; the strict dump threw after the work was done, leaving no output and exit 2.
inline std::string json_text(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// The one problem of a tool's --shape (smla-bench, smla-seqpar): parse_shape_spec's syntax and its errors, one
/// problem (no ranges; R_CHUNK has its own option). Sets p's T, H, num_kv and topk; the rest of p stays.
inline void set_one_shape(Problem& p, const std::string& text) {
  const std::vector<Problem> ps = parse_shape_spec(text);
  if (ps.size() != 1 || ps[0].r_chunk != 0)
    SMLA_THROW(Status::InvalidArgument,
               "--shape '" + text + "': expected one problem T,H,NUM_KV,TOPK (no ranges; --r-chunk sets R_CHUNK)");
  p.T = ps[0].T, p.H = ps[0].H, p.num_kv = ps[0].num_kv, p.topk = ps[0].topk;
}

/// body()'s exit code, `thrown` when it throws (2, could not run, unless the caller says the options were sound and
/// the work failed: 1), and 2 when its output could not be written (flush_stdout). With `json` (the tool's --json),
/// what was thrown is also one JSON object on stdout, {"error": message, "status": name, "exit": code}: a script
/// reading the tool's JSON got nothing at all from a failure before the work (an unwritable --out, no GPU).
template <class Body>
int run_tool(const char* name, Body&& body, int thrown = 2, bool json = false) {
  int rc = thrown;
  std::string error, status;
  try {
    rc = body();
  } catch (const Error& e) {
    error = e.message(), status = status_name(e.status());
    std::fprintf(stderr, "%s: %s (%s)\n", name, error.c_str(), status.c_str());
  } catch (const std::bad_alloc&) {
    error = "out of host memory (std::bad_alloc)", status = "internal error";
    std::fprintf(stderr,
                 "%s: out of host memory (std::bad_alloc): what this run needs does not fit here (for a tool that makes "
                 "tensors, the problem's inputs, reference and outputs: a smaller T or num_kv)\n",
                 name);
  } catch (const std::exception& e) {
    error = e.what(), status = "internal error";
    std::fprintf(stderr, "%s: %s\n", name, e.what());
  }
  if (json && !status.empty())
    std::printf("%s\n", json_text({{"error", error}, {"status", status}, {"exit", rc}}).c_str());
  return flush_stdout(name) ? rc : 2;
}

}  // namespace smla::tools
