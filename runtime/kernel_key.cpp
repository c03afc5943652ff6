// kernel_key.cpp: cache key fields of a kernel's translation unit.
#include "kernel_key.hpp"

namespace smla {

std::string defines_tag(const KernelSpec& spec) {
  std::string tag;
  for (const auto& d : spec.defines) tag += (tag.empty() ? "" : "-") + d.first + std::to_string(d.second);
  return tag.empty() ? "default" : tag;
}

std::string defines_id(const KernelSpec& spec) {
  std::string id;
  for (const auto& d : spec.defines) id += d.first + "=" + std::to_string(d.second) + ";";
  return id;
}

cache::KeyFields kernel_key_fields(const KernelSpec& spec, const KernelSources& sources, const RtcCompiler& rtc,
                                   const std::string& target, RenderedSource* rendered) {
  RenderedSource src = sources.render(spec, rtc.family());
  cache::KeyFields f;
  f.kernel = spec.stem;
  f.shape_tag = defines_tag(spec);
  f.source = src.text;
  f.headers = src.headers;
  f.options = rtc.options(target);
  f.target = target;
  f.compiler_id = rtc.identity();
  if (rendered) *rendered = std::move(src);
  return f;
}

}  // namespace smla
