// sources.hpp: kernel sources (embedded at build time, or from a directory for development)
// and the rendering of one specialized translation unit per kernel.
#pragma once
#include <deque>
#include <string>

#include "backend.hpp"
#include "phases.hpp"

namespace smla {

class KernelSources {
 public:
  /// `dir` empty: the sources embedded in the library; else files read from `dir`.
  explicit KernelSources(std::string dir = {});
  /// Content of kernel_src/<name>; throws smla::Error naming the file when absent.
  const std::string& file(const std::string& name) const;
  bool has(const std::string& name) const;
  /// The translation unit for `spec` in `family` ("cuda": <stem>.cu, "hip": <stem>.hip):
  /// a header comment, the constants as #defines, then the source; with every quoted
  /// #include of kernel_src attached as a header.
  RenderedSource render(const KernelSpec& spec, const std::string& family) const;

 private:
  std::string dir_;
  mutable std::deque<std::pair<std::string, std::string>> loaded_;  // only when dir_ is set
};

/// `text` with its C and C++ comments each replaced by a space (a block comment's newlines kept, so directives keep
/// their line starts); string and character literals left as they are. What render() scans for includes.
std::string without_comments(const std::string& text);

/// The file a kernel of `family` is compiled from.
std::string source_file_name(const std::string& stem, const std::string& family);

}  // namespace smla
