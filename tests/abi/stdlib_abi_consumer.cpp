// stdlib_abi_consumer.cpp: a C++ caller of smla.hpp, built by the test Build.ACallerOfAnotherStringAbiFailsToLink with
// the standard library's string ABI libsmla.so was built with (it must link and run) and with the other one (it must
// fail to link, naming the ABI: the API passes std::string across the boundary, and a mismatch corrupted memory).
#include "smla/smla.hpp"

int main() {
  smla::Runtime rt;
  const auto all = rt.backends();
  for (const auto& b : all)  // strings made inside the library, read here
    if (b.name == "cpu") return b.usable ? 0 : 3;
  return 4;
}
