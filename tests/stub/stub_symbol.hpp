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

// One of a stand-in library's int counters (smla_stub_modules_loaded, ...): `not_loaded` when the library is not
// loaded in this process, -1 when it lacks the counter.
inline int stub_counter(const char* library, const char* name, int not_loaded = -1) {
  bool loaded = false;
  const auto fn = stub_symbol<int (*)()>(library, name, &loaded);
  return !loaded ? not_loaded : fn ? fn() : -1;
}

}  // namespace smla::test
