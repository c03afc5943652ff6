// amdgpu_elf.hpp: a minimal reader of AMDGPU code objects (64-bit little-endian ELF).
//
// Used for the compiler identity (the clang version in .comment) and by tests to check that a
// code object is real. Reads only; never trusts offsets without a bounds check.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace smla::hip {

constexpr uint16_t kEmAmdgpu = 224;  // e_machine of AMDGPU code objects

struct ElfInfo {
  bool valid = false;
  std::string error;               // why it is not a valid AMDGPU ELF
  uint16_t machine = 0;
  uint32_t flags = 0;              // e_flags: EF_AMDGPU_MACH_* and feature bits
  std::vector<std::string> sections;
  std::vector<std::string> symbols;   // names in .symtab
  std::vector<std::string> comments;  // NUL-separated strings of .comment
};

/// Parses `bytes` as an ELF64 LE object; `valid` is false (with `error`) for anything else.
ElfInfo read_elf(const std::vector<uint8_t>& bytes);

}  // namespace smla::hip
