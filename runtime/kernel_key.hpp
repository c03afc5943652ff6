// kernel_key.hpp: what identifies one compiled translation unit in the disk cache. Shared by
// plan() and smla-warmup so an ahead-of-time compile is found by the runtime later.
#pragma once
#include <string>

#include "../cache/kernel_cache.hpp"
#include "backend.hpp"
#include "sources.hpp"

namespace smla {

/// The constants of a translation unit as a readable tag ("HEADS128"): what the source depends
/// on and nothing else, so problems that render the same source share one compile.
std::string defines_tag(const KernelSpec& spec);
/// The same constants without ambiguity ("A=1;B=12;"), for the in-process lookups: the tag joins a name and its value
/// with nothing between them, so {A1: 2} and {A: 12} would both read "A12" (the disk key hashes the rendered source,
/// which tells them apart).
std::string defines_id(const KernelSpec& spec);

/// Renders `spec` for `rtc`'s family and fills the cache key fields for `target`.
cache::KeyFields kernel_key_fields(const KernelSpec& spec, const KernelSources& sources, const RtcCompiler& rtc,
                                   const std::string& target, RenderedSource* rendered);

}  // namespace smla
