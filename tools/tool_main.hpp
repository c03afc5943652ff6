// tool_main.hpp: the one way a command-line tool reports a failure: "<tool>: <message>" on
// stderr and exit code 2 (1 is left for "ran, but the check failed").
#pragma once
#include <cstdio>
#include <exception>

#include "smla/smla.hpp"

namespace smla::tools {

template <class Body>
int run_tool(const char* name, Body&& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s (%s)\n", name, e.message().c_str(), status_name(e.status()));
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 2;
  }
}

}  // namespace smla::tools
