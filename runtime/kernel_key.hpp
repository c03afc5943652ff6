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

/// Renders `spec` for `rtc`'s family and fills the cache key fields for `target`.
cache::KeyFields kernel_key_fields(const KernelSpec& spec, const KernelSources& sources, const RtcCompiler& rtc,
                                   const std::string& target, RenderedSource* rendered);

}  // namespace smla
