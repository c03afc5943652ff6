// runtime.cpp: smla::Runtime: backends, the in-process kernel cache over the disk cache, and
// plan() (validate, choose, compile or load, lay out, order).

#include <map>
#include <mutex>
#include <optional>

#include "../cache/kernel_cache.hpp"
#include "check.hpp"
#include "cpu_backend.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/kernels_cuda.hpp"
#include "hip/hip_backend.hpp"
#include "hip/kernels_hip.hpp"
#include "hip/rocprim_sort.hpp"
#include "env.hpp"
#include "kernel_key.hpp"
#include "tuning_db.hpp"
#include "log.hpp"
#include "plan_impl.hpp"
#include "planner.hpp"
#include "smla/smla.hpp"
#include "sources.hpp"

namespace smla {

// Private to libsmla.so, though nested in an exported class.
struct __attribute__((visibility("hidden"))) Runtime::Impl {
  RuntimeOptions opts;
  KernelSources sources;
  TuningDb tuning;  // tuned tile choices, looked up by plan() when no explicit config is given
  CpuBackend cpu;
  cuda::CudaBackend cuda;
  hip::HipBackend hip;
  std::unique_ptr<cache::DiskCache> disk;
  std::mutex mu;
  std::map<std::string, std::shared_ptr<LoadedKernel>> loaded;  // in-process: key -> module
  // One mutex a key of `loaded`, held from its lookup to its insertion: two plan() calls of one kernel at once load it
  // once. (The second loaded its own module too and dropped it at once, the drop, on CUDA, a cuCtxSynchronize inside
  // plan(). A load itself waits for the context's queued work, perf notes v37: one load, not two.)
  std::map<std::string, std::shared_ptr<std::mutex>> loading;
  Counters counters;

  explicit Impl(RuntimeOptions o)
      : opts(std::move(o)),
        sources(!opts.kernel_src_dir.empty() ? opts.kernel_src_dir : runtime_env().kernel_src_dir),
        tuning(default_tuning_db_path(), tuning_runtime_version(sources)),
        disk(std::make_unique<cache::DiskCache>(cache::settings_from_env())) {}

  Backend* backend(BackendKind k) {
    switch (k) {
      case BackendKind::Cpu: return &cpu;
      case BackendKind::Cuda: return &cuda;
      case BackendKind::Hip: return &hip;
      default: return nullptr;
    }
  }

  KernelsOf kernels_of(BackendKind k) {
    if (k == BackendKind::Cuda) return cuda_phase_kernels;
    if (k == BackendKind::Hip) return hip_phase_kernels;
    return cpu_phase_kernels;
  }

  // The kernel of `spec`: loaded by this Runtime, else from the disk cache, else (`compile_missing`) compiled.
  // Without `compile_missing`, a kernel in neither is nullptr.
  std::shared_ptr<LoadedKernel> get_kernel(Backend& be, const KernelSpec& spec, const ShapeInfo& s,
                                           const std::string& target, int device, PlanInfo& info,
                                           bool compile_missing);
};

std::shared_ptr<LoadedKernel> Runtime::Impl::get_kernel(Backend& be, const KernelSpec& spec, const ShapeInfo& s,
                                                        const std::string& target, int device, PlanInfo& info,
                                                        bool compile_missing) {
  const RtcCompiler* rtc = be.compiler();
  if (!rtc || hip_is_library_kernel(spec)) {  // CPU phases, library calls (rocPRIM): nothing to compile
    return be.load(spec, {}, device);
  }
  // In-process: the loaded function, keyed by everything that selects it, checked before any
  // rendering or hashing so a repeated plan() costs a map lookup per kernel.
  // The compiler's identity too: HIP's follows the environment (HIPRTC_COMPILE_OPTIONS_APPEND), as the disk key does.
  const std::string mem_key = be.name() + "|" + target + "|" + std::to_string(device) + "|" + spec.stem + "|" +
                              defines_id(spec) + "|" + spec.entry + "|" + rtc->identity();
  auto loaded_here = [&]() -> std::shared_ptr<LoadedKernel> {
    std::lock_guard<std::mutex> lock(mu);
    auto it = loaded.find(mem_key);
    if (it == loaded.end()) return nullptr;
    ++counters.memory_hits;
    ++info.reused_in_process;
    return it->second;
  };
  if (auto k = loaded_here()) return k;
  std::shared_ptr<std::mutex> key_mu;
  {
    std::lock_guard<std::mutex> lock(mu);
    std::shared_ptr<std::mutex>& m = loading[mem_key];
    if (!m) m = std::make_shared<std::mutex>();
    key_mu = m;
  }
  std::lock_guard<std::mutex> key_lock(*key_mu);
  if (auto k = loaded_here()) return k;  // loaded by the plan() this one waited for
  // On disk: one entry per translation unit (all entries of a source share one binary).
  RenderedSource src;
  const cache::KeyFields f = kernel_key_fields(spec, sources, *rtc, target, &src);
  std::shared_ptr<LoadedKernel> k;
  auto compile = [&] {
    log().info("compiling {} [{}] for {}", spec.stem, f.shape_tag, target);
    CompileResult r = rtc->compile(src, target);
    log().info("compiled {} [{}] in {:.2f} s ({} bytes)", spec.stem, f.shape_tag, r.seconds, r.binary.size());
    return cache::CompileOutput{std::move(r.binary), std::move(r.log)};
  };
  auto accept = [&](const std::vector<uint8_t>& bin) {
    try {
      k = be.load(spec, bin, device);
      return true;
    } catch (const Error& e) {
      // Only a refused image is the entry's fault; out of memory or a limit would fail the same after a recompile,
      // and deleting a good shared entry makes every process recompile it.
      if (!be.is_binary_refusal(e)) throw;
      log().warn("the driver refused the cached binary of {}: {}", spec.entry, e.what());
      return false;
    }
  };
  cache::Fetched got;
  if (compile_missing) {
    got = disk->get_or_compile(f, compile, accept);
  } else if (std::optional<cache::Fetched> found = disk->lookup(f, accept)) {
    got = std::move(*found);
  } else {
    return nullptr;
  }
  if (!k) k = be.load(spec, got.binary, device);
  std::lock_guard<std::mutex> lock(mu);
  if (got.origin == cache::Origin::Compiled) {
    ++counters.compiled;
    ++info.compiled;
  } else if (got.origin == cache::Origin::Memory) {
    ++counters.memory_hits;
    ++info.reused_in_process;
  } else {
    ++counters.disk_hits;
    ++info.loaded_from_disk;
  }
  auto ins = loaded.emplace(mem_key, k);
  loading.erase(mem_key);  // a waiter holds its own reference; a later call finds the kernel in `loaded` first
  return ins.first->second;
}

// The "smla" logger (stderr, SMLA_LOG_LEVEL) is registered before Impl opens the disk cache, which logs through it
// if registered (its knob warnings and first open went to spdlog's default logger, past SMLA_LOG_LEVEL, before).
Runtime::Runtime(RuntimeOptions opts) : impl_((log(), std::make_shared<Impl>(std::move(opts)))) {
  for (const std::string& w : runtime_env().warnings) log().warn("{}", w);
}

Runtime::~Runtime() = default;

std::vector<BackendStatus> Runtime::backends() const {
  std::vector<BackendStatus> out;
  out.push_back({"cpu", true, true, "plain C++ phases, synchronous"});
  BackendStatus c{"cuda", false, false, ""};
  std::string why, cwhy;
  // Device 0's target, or why it has none (a GPU below sm_80): this query says why not, it does not throw it.
  auto target_of_0 = [](const Backend& be) {
    try {
      return ", target " + be.target(0);
    } catch (const Error& e) {
      return "; device 0: " + e.message();
    }
  };
  c.usable = impl_->cuda.usable(&why);
  c.can_compile = impl_->cuda.compiler()->available(&cwhy);
  if (c.usable) {
    c.detail = std::to_string(impl_->cuda.device_count()) + " device(s)" + target_of_0(impl_->cuda);
  } else {
    c.detail = why;
  }
  c.detail += c.can_compile ? "; NVRTC " + impl_->cuda.compiler()->identity() : "; cannot compile: " + cwhy;
  out.push_back(c);
  BackendStatus h{"hip", false, false, ""};
  h.usable = impl_->hip.usable(&why);
  h.can_compile = impl_->hip.compiler()->available(&cwhy);
  h.detail = h.usable ? std::to_string(impl_->hip.device_count()) + " device(s)" + target_of_0(impl_->hip) : why;
  h.detail += h.can_compile ? "; hipRTC " + impl_->hip.compiler()->identity() : "; cannot compile: " + cwhy;
  out.push_back(h);
  return out;
}

BackendKind Runtime::resolve(BackendKind b) const {
  if (b != BackendKind::Auto) return b;
  if (impl_->cuda.usable(nullptr)) return BackendKind::Cuda;
  if (cuda::forked_after_init()) {
    static std::once_flag told;
    std::call_once(told, [] { log().warn("backend auto: not CUDA: {}", cuda::driver().why); });
  }
  if (impl_->hip.usable(nullptr)) return BackendKind::Hip;
  if (hip::hip_forked_after_init()) {
    static std::once_flag told;
    std::call_once(told, [this] {
      std::string why;
      impl_->hip.usable(&why);
      log().warn("backend auto: not HIP: {}", why);
    });
  }
  return BackendKind::Cpu;
}

Runtime::Counters Runtime::counters() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->counters;
}

std::shared_ptr<const Plan> Runtime::plan(const Problem& p) { return plan_with(p, nullptr); }

std::shared_ptr<const Plan> Runtime::plan(const Problem& p, const TileConfig& cfg) { return plan_with(p, &cfg); }

bool tuned_entry_fits(BackendKind kind, const Problem& p, const TileConfig& t, size_t interm_budget,
                      const std::string& target, std::string* why) {
  const ShapeInfo ts = shape_with_config(p, &t, interm_budget, target);
  if (int64_t(ts.t_chunks) * ts.n_chunks > kMaxChunkPairs) {  // a tuned r_chunk at a larger T
    if (why) *why = "its r_chunk makes more than " + std::to_string(kMaxChunkPairs) + " chunk pairs here";
    return false;
  }
  // Each backend's own kernels judge the entry (on HIP it went unchecked, and plan() then threw where the heuristic
  // would have planned).
  switch (kind) {
    case BackendKind::Cuda: return cuda_shape_supported(ts, why);
    case BackendKind::Hip: return hip_shape_supported(ts, why);
    default:
      if (why) why->clear();
      return true;
  }
}

std::shared_ptr<const Plan> Runtime::plan_with(const Problem& p_in, const TileConfig* cfg) {
  Problem p = p_in;
  if (cfg) validate_config(*cfg);
  validate_problem(p);  // the caller's problem first: a bad config's r_chunk is not Problem::r_chunk's fault
  if (cfg && cfg->r_chunk) {
    if (!r_chunk_ok(cfg->r_chunk, p.topk))
      SMLA_THROW(Status::InvalidArgument, "TileConfig::r_chunk = " + std::to_string(cfg->r_chunk) +
                                              ": expected 0 (the problem's r_chunk) or " + r_chunk_expected(p.topk));
    p.r_chunk = cfg->r_chunk;
    validate_problem(p);
  }
  const BackendKind kind = resolve(p.backend);
  Backend* be = impl_->backend(kind);
  if (!be)
    SMLA_THROW(Status::NoBackend, std::string("the ") + backend_name(kind) +
                                      " backend is not available in this build (backends: cpu, cuda, hip)");
  std::string why;
  if (!be->usable(&why))
    SMLA_THROW(Status::NoBackend, std::string("the ") + backend_name(kind) + " backend is not usable here: " + why);
  if (p.device >= be->device_count())
    SMLA_THROW(Status::InvalidArgument, "Problem::device = " + std::to_string(p.device) + ": the " + be->name() +
                                            " backend has " + std::to_string(be->device_count()) + " device(s)");

  const std::string target = be->target(p.device);
  const std::string device_class = be->device_class(p.device);

  // A tuned config from the database, when there is one for this target and problem class and
  // it still fits the kernels; otherwise the heuristics. An explicit config bypasses the database.
  TileConfig tuned;
  bool from_db = false;
  if (!cfg && be->compiler()) {
    const size_t budget = runtime_env().interm_budget;
    if (auto t = impl_->tuning.lookup(device_class, p)) {
      std::string no;
      const bool fits = tuned_entry_fits(kind, p, *t, budget, target, &no);
      if (fits) {
        tuned = *t;
        cfg = &tuned;
        from_db = true;
        if (tuned.r_chunk && !p.r_chunk) {
          p.r_chunk = tuned.r_chunk;
          validate_problem(p);  // a database entry is input too
        }
      } else {
        log().warn("tuned config no longer fits the kernels ({}); using the heuristic", no);
      }
    }
  }

  auto plan = std::make_shared<PlanImpl>();
  plan->problem_ = p;
  plan->owner_ = impl_;  // the backend (its contexts, modules) lives as long as the last plan, not the Runtime
  plan->backend_ = be;
  plan->shape_ = choose_shape(p, runtime_env().interm_budget);
  check_chunk_count(plan->shape_);
  apply_config(plan->shape_, cfg, target);
  if (kind == BackendKind::Cuda) {
    std::string not_ok;
    if (!cuda_shape_supported(plan->shape_, &not_ok)) SMLA_THROW(Status::Unsupported, not_ok);
    // The planner's fused dkv (H 64 on sm_90a) made explicit, so that the workspace leaves P and dS out
    // (ShapeInfo::fused_dkv); the kernels are the same either way.
    if (cuda_dkv_impl(plan->shape_) == 4) plan->shape_.dkv_impl = 4;
    // csr's onesweep sort keeps its bins, tile counters and look-back in the csr_hist region.
    plan->shape_.csr_sort_temp_bytes = static_cast<size_t>(cuda_csr_scratch_bytes(plan->shape_));
  }
  if (kind == BackendKind::Hip) {
    std::string not_ok;
    // The device's processor and the sort's code for it, before any kernel is rendered or compiled.
    if (!hip::hip_target_supported(target, &not_ok)) SMLA_THROW(Status::Unsupported, not_ok);
    if (!hip_shape_supported(plan->shape_, &not_ok)) SMLA_THROW(Status::Unsupported, not_ok);
    // rocPRIM's sort keeps its temporary storage in the csr_hist region.
    const hip::RocprimSort* sort = hip::RocprimSort::get(&not_ok);
    if (!sort) SMLA_THROW(Status::NoBackend, "the AMD csr sort (libsmla_rocprim.so) is not available: " + not_ok);
    if (!sort->supports(target, &not_ok)) SMLA_THROW(Status::Unsupported, not_ok);
    // Asked with the plan's device current, as the launch sorts (rocPRIM sizes by the current device's processor):
    // asked under another current device, the region could be smaller than what the sort is then told it owns.
    const auto* hb = dynamic_cast<const hip::HipBackend*>(be);
    SMLA_REQUIRE(hb, Status::Internal, "the HIP plan's backend is not the HIP backend");
    plan->shape_.csr_sort_temp_bytes =
        hb->sort_temp_bytes(*sort, p.device, int(plan->shape_.chunk_items()), hip::radix_bits_for(plan->shape_.num_kv));
  }
  plan->layout_ = layout_workspace(plan->shape_);
  plan->steps_ = order_steps(plan->shape_, impl_->kernels_of(kind));
  plan->info_.backend = be->name();
  plan->info_.target = target;
  plan->info_.device_class = device_class;
  plan->info_.r_chunk = plan->shape_.r_chunk;
  plan->info_.n_chunks = plan->shape_.n_chunks;
  plan->info_.t_chunk = plan->shape_.t_chunk;
  plan->info_.t_chunks = plan->shape_.t_chunks;
  plan->info_.config_source = from_db ? "tuned" : cfg ? "explicit" : "heuristic";
  // What is cached first (a hit refreshes the entry's recency), then the compiles: under SMLA_CACHE_MAX_BYTES a
  // compile's publish evicts the least recently used entries, which were this plan's own cached kernels not yet
  // loaded, and the plan compiled them again (and so did every later process).
  for (const Step& st : plan->steps_)
    plan->kernels_.push_back(impl_->get_kernel(*be, st.spec, plan->shape_, target, p.device, plan->info_, false));
  for (size_t i = 0; i < plan->steps_.size(); ++i) {
    const KernelSpec& spec = plan->steps_[i].spec;
    if (!plan->kernels_[i])
      plan->kernels_[i] = impl_->get_kernel(*be, spec, plan->shape_, target, p.device, plan->info_, true);
    plan->info_.kernels.push_back(spec.entry);
  }
  log().debug("planned {} launches on {} ({}), workspace {} bytes", plan->steps_.size(), be->name(),
                target, plan->layout_.total);
  return plan;
}

}  // namespace smla
