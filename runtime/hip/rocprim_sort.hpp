// rocprim_sort.hpp: the loader of libsmla_rocprim.so (rocPRIM's radix_sort_pairs, built ahead
// of time by hipcc). Opened with dlopen on first use by the HIP backend only.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace smla::hip {

class RocprimSort {
 public:
  /// The loaded library, or null with `why` (not built, not found, ABI mismatch). `path_hint`
  /// is tried first. Thread-safe; loaded once.
  static const RocprimSort* get(std::string* why = nullptr, const std::string& path_hint = "");

  /// Bytes of temporary storage for `n` pairs on bits [begin_bit, end_bit). Throws DriverError.
  size_t temp_bytes(int n, int begin_bit, int end_bit) const;
  /// Stable radix sort of int pairs on `stream` (a hipStream_t); throws DriverError.
  void sort_pairs(void* temp, size_t temp_bytes, const int* keys_in, int* keys_out, const int* values_in,
                  int* values_out, int n, int begin_bit, int end_bit, void* stream) const;
  const std::string& path() const { return path_; }
  /// The processors it has device code for ("gfx90a", ...): those hipcc accepted where it was built.
  const std::vector<std::string>& targets() const { return targets_; }
  /// Whether it has code for `target`'s processor; `why` names the ones it has and how to rebuild.
  bool supports(const std::string& target, std::string* why) const;

 private:
  std::string path_;
  std::vector<std::string> targets_;
  int (*temp_bytes_)(int, int, int, size_t*) = nullptr;
  int (*sort_)(void*, size_t, const int*, int*, const int*, int*, int, int, int, void*) = nullptr;
};

/// Whether a libsmla_rocprim.so at `path` built for `built` (processors) has code for `target`
/// (a full target id or a processor); `why` says which it has and how to rebuild it when not.
bool rocprim_supports(const std::vector<std::string>& built, const std::string& path, const std::string& target,
                      std::string* why);

/// Bits needed for keys 0..max_key (>= 1), the end_bit for the csr sort.
int radix_bits_for(int max_key);

}  // namespace smla::hip
