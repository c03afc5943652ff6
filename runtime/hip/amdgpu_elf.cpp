// amdgpu_elf.cpp: see amdgpu_elf.hpp.
#include "amdgpu_elf.hpp"

#include <cstring>

namespace smla::hip {
namespace {

template <typename T>
bool read_at(const std::vector<uint8_t>& b, uint64_t off, T* out) {
  if (off > b.size() || b.size() - off < sizeof(T)) return false;
  std::memcpy(out, b.data() + off, sizeof(T));  // the host is little-endian, as the object
  return true;
}

std::string c_string(const std::vector<uint8_t>& b, uint64_t off, uint64_t end) {
  std::string s;
  while (off < end && off < b.size() && b[off] != 0) s.push_back(static_cast<char>(b[off++]));
  return s;
}

struct Shdr {
  uint32_t name, type;
  uint64_t flags, addr, offset, size;
  uint32_t link, info;
  uint64_t addralign, entsize;
};
static_assert(sizeof(Shdr) == 64, "ELF64 section header");

}  // namespace

ElfInfo read_elf(const std::vector<uint8_t>& b) {
  ElfInfo info;
  auto fail = [&](const std::string& why) {
    info.valid = false;
    info.error = why;
    return info;
  };
  if (b.size() < 64 || std::memcmp(b.data(), "\x7f" "ELF", 4) != 0) return fail("no ELF magic");
  if (b[4] != 2 || b[5] != 1) return fail("not a 64-bit little-endian ELF");
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0, shstrndx = 0;
  read_at(b, 18, &info.machine);
  read_at(b, 48, &info.flags);
  read_at(b, 40, &shoff);
  read_at(b, 58, &shentsize);
  read_at(b, 60, &shnum);
  read_at(b, 62, &shstrndx);
  if (info.machine != kEmAmdgpu) return fail("e_machine is " + std::to_string(info.machine) + ", not EM_AMDGPU");
  if (shentsize != sizeof(Shdr) || shstrndx >= shnum) return fail("bad section header table");
  std::vector<Shdr> sh(shnum);
  for (uint16_t i = 0; i < shnum; ++i)
    if (!read_at(b, shoff + uint64_t(i) * sizeof(Shdr), &sh[i])) return fail("truncated section headers");
  const Shdr& names = sh[shstrndx];
  for (const Shdr& s : sh) {
    std::string name = c_string(b, names.offset + s.name, names.offset + names.size);
    info.sections.push_back(name);
    if (name == ".comment") {
      for (uint64_t p = s.offset; p < s.offset + s.size && p < b.size();) {
        std::string str = c_string(b, p, s.offset + s.size);
        if (!str.empty()) info.comments.push_back(str);
        p += str.size() + 1;
      }
    }
    if (s.type == 2 /* SHT_SYMTAB */ && s.link < shnum && s.entsize == 24) {
      const Shdr& strtab = sh[s.link];
      for (uint64_t p = s.offset; p + 24 <= s.offset + s.size; p += 24) {
        uint32_t st_name = 0;
        if (!read_at(b, p, &st_name)) return fail("truncated .symtab");
        std::string sym = c_string(b, strtab.offset + st_name, strtab.offset + strtab.size);
        if (!sym.empty()) info.symbols.push_back(sym);
      }
    }
  }
  info.valid = true;
  return info;
}

}  // namespace smla::hip
