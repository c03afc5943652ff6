// read_text_file.hpp: a whole file as a string, for the tests that read what a tool or a compile wrote.
#pragma once
#include <fstream>
#include <sstream>
#include <string>

namespace smla::test {

/// The file's bytes ("" when it cannot be opened).
inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace smla::test
