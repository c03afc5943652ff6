// check.hpp: the throw helpers every part of the runtime uses.
#pragma once
#include "smla/smla.hpp"

#define SMLA_THROW(status, msg) throw ::smla::Error((status), (msg), __FILE__, __LINE__)
#define SMLA_REQUIRE(cond, status, msg) \
  do {                                  \
    if (!(cond)) SMLA_THROW(status, msg); \
  } while (0)
