// stub_symbol.hpp: a function of a stand-in library of tests/stub/ (a stub driver, a fake library) as this process
// loaded it, for the tests that read what the stand-in saw.
#pragma once
#include <dlfcn.h>

namespace smla::test {

// `name` of `library`; null when the library is not loaded in this process (`*loaded` false) or lacks it. The lookup's
// own reference is dropped at once: whoever opened the library keeps it loaded.
template <class F>
F stub_symbol(const char* library, const char* name, bool* loaded = nullptr) {
  void* h = ::dlopen(library, RTLD_NOW | RTLD_NOLOAD);
  if (loaded) *loaded = h != nullptr;
  if (!h) return nullptr;
  const F fn = reinterpret_cast<F>(::dlsym(h, name));
  ::dlclose(h);
  return fn;
}

}  // namespace smla::test
