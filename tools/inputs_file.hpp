// inputs_file.hpp: the reference's random inputs kept in a file between benchmark processes.
//
// make_inputs() at the DSv4 shapes is mostly its float64 forward (o and lse): ~20 s of a ~25 s smla-bench process on
// the H200's host at 4096,128,5120,1152, paid again by every process of an A/B run (src_ab.sh runs each variant and
// round in its own process, on the same inputs). With a directory, the first process writes the inputs there and
// the others read them back (~1.6 GB at the seed shape, a second or two).
//
// A file holds one (T, H, num_kv, topk, sink, seed, top-k kind): that tuple is its name and is repeated in its header;
// a checksum (xxHash64) of everything before it ends the file. A file that is short, for another problem, or whose
// checksum differs is not used: the inputs are made again and the file replaced. Writes go to a temporary name in the
// same directory and are renamed into place, so a reader never sees half a file and two writers do not mix.
#pragma once
#include <cstdint>
#include <string>

#include "tests/reference/reference.hpp"

namespace smla::tools {

struct InputsSource {
  bool from_file = false;  ///< read back from `path` (else made, and written there when a directory was given)
  std::string path;        ///< the file for this problem ("" without a directory)
  std::string note;        ///< why a file present was not used, or why writing it failed ("" when neither)
};

/// The name of the file for one problem inside a directory of inputs.
std::string inputs_file_name(int T, int H, int num_kv, int topk, bool sink, uint64_t seed, ref::TopkKind kind);

/// smla::ref::make_inputs(...), served from `dir` when it holds a good file for the problem; dir "" makes them.
ref::Inputs inputs_via_file(const std::string& dir, int T, int H, int num_kv, int topk, bool sink, uint64_t seed,
                            ref::TopkKind kind, InputsSource* source = nullptr);

}  // namespace smla::tools
