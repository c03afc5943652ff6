// smla-seqpar: sequence-parallel backward example. The batch's tokens are split over N ranks;
// each rank runs the backward on its tokens against the full kv, the fp32 dkv and d_sink
// partials are summed across ranks, and dkv is rounded to bf16 once (on the host here).
//
//   --backend cpu : ranks are threads of this process, summed by seqpar::HostReducer.
//   --backend cuda: one process per GPU (rank r uses device r), summed by NCCL; rank 0 makes the
//                   NCCL unique id and sends it to the others through pipes. The parent never
//                   touches CUDA (a process that initialised CUDA cannot fork usable children).
//
// --check compares the concatenated dq and the reduced dkv/d_sink with a one-rank run (at the
// contract's bar) and with the float64 reference, and checks that two runs give the same bits.
#include <CLI/CLI.hpp>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <system_error>
#include <thread>

#include "cli_parse.hpp"  // beside this file
#include "tools/tool_main.hpp"
#include "runtime/bf16.hpp"
#include "runtime/cuda/cuda_api.hpp"
#include "runtime/env.hpp"
#include "runtime/planner.hpp"
#include "runtime/seqpar.hpp"
#include "tools/case_runner.hpp"

namespace {

using namespace smla;
constexpr size_t D = 512;

struct Options {
  int ranks = 2;
  std::string backend = "cpu";
  std::string shape;
  int64_t r_chunk = 0;
  int64_t t_chunk = 0;
  bool no_sink = false, check = false, uniform = false;
  uint64_t seed = 1;
};

// What one rank brings back: its dq rows, the reduced sums, and facts for the report.
struct RankOut {
  int rank = 0;
  int64_t t0 = 0, t1 = 0;
  int compiled = 0, loaded = 0, rerun_same = 0;
  double ms = 0;
  std::vector<uint16_t> dq_rows;
  std::vector<float> dkv, d_sink;
  tools::Outputs one;  // rank 0 on CUDA: the one-rank run, for --check
};

using tools::same_bits;

RankOut run_rank(Runtime& rt, const Problem& whole, const ref::Inputs& in, int rank, int n, seqpar::Reducer& red) {
  RankOut out;
  const seqpar::TokenRange g = seqpar::split(whole.T, rank, n);
  out.rank = rank, out.t0 = g.t0, out.t1 = g.t1;
  auto plan = rt.plan(seqpar::rank_problem(whole, g));
  out.compiled = plan->info().compiled, out.loaded = plan->info().loaded_from_disk;
  Problem holder = whole;
  holder.dkv_fp32 = true;  // the rank's tensors: whole inputs, fp32 dkv; the view picks its rows
  tools::CaseRunner cr(holder, in);
  const Tensors t = seqpar::rank_view(whole, cr.tensors(), g);
  void* ws = cr.workspace(plan->workspace_bytes());
  tools::Outputs runs[2];
  for (int k = 0; k < 2; ++k) {
    cr.poison_outputs();
    const auto start = std::chrono::steady_clock::now();
    seqpar::backward(*plan, t, ws, cr.workspace_size(), cr.stream(), red);
    cr.sync();
    if (k == 1) out.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    runs[k] = cr.read_outputs();
  }
  out.rerun_same = runs[0].dq == runs[1].dq && same_bits(runs[0].dkv_f32, runs[1].dkv_f32) &&
                   same_bits(runs[0].d_sink, runs[1].d_sink);
  const size_t row = size_t(whole.H) * D;
  out.dq_rows.assign(runs[0].dq.begin() + g.t0 * row, runs[0].dq.begin() + g.t1 * row);
  out.dkv = std::move(runs[0].dkv_f32);
  out.d_sink = std::move(runs[0].d_sink);
  return out;
}

tools::Outputs one_rank(Runtime& rt, const Problem& whole, const ref::Inputs& in) {
  auto plan = rt.plan(whole);
  tools::CaseRunner cr(whole, in);
  void* ws = cr.workspace(plan->workspace_bytes());
  cr.poison_outputs();
  plan->run(cr.tensors(), ws, cr.workspace_size(), cr.stream());
  return cr.read_outputs();
}

// ---- CPU ranks: threads

std::vector<RankOut> cpu_ranks(const Problem& whole, const ref::Inputs& in, int n, tools::Outputs* one) {
  Runtime rt;
  auto group = std::make_shared<seqpar::HostGroup>(n);
  std::vector<RankOut> outs(static_cast<size_t>(n));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  // The rank that failed first: the others then fail only because abort() released them ("host group aborted"),
  // and the lowest rank with an error is usually one of those.
  std::atomic<int> first_failed{-1};
  auto fail = [&](int r, std::exception_ptr e) {
    errors[size_t(r)] = std::move(e);
    int none = -1;
    first_failed.compare_exchange_strong(none, r);  // before abort(): a released rank always comes second
    group->abort("rank " + std::to_string(r) + " failed");  // release the others
  };
  std::vector<std::thread> th;
  for (int r = 0; r < n; ++r) {
    try {
      th.emplace_back([&, r] {
        try {
          seqpar::HostReducer red(group, r);
          outs[size_t(r)] = run_rank(rt, whole, in, r, n, red);
        } catch (...) {
          fail(r, std::current_exception());
        }
      });
    } catch (...) {  // no thread for rank r (no memory for its stack): the ranks started are released and joined
      fail(r, std::current_exception());
      break;
    }
  }
  for (auto& x : th) x.join();
  if (const int r = first_failed.load(); r >= 0) {
    const std::string who = "rank " + std::to_string(r) + ": ";
    try {
      std::rethrow_exception(errors[size_t(r)]);
    } catch (const std::bad_alloc&) {
      throw;  // run_tool's out-of-memory message
    } catch (const std::system_error& e) {  // std::thread's: a rank's thread could not be started
      throw std::runtime_error(who + "could not start its thread (" + e.what() + "): fewer --ranks, or more memory");
    } catch (const Error& e) {
      throw Error(e.status(), who + e.message());
    } catch (const std::exception& e) {
      throw std::runtime_error(who + e.what());
    } catch (...) {
      throw std::runtime_error(who + "failed with an exception that is not a std::exception");
    }
  }
  if (one) *one = one_rank(rt, whole, in);  // only for --check
  return outs;
}

// ---- CUDA ranks: a process per GPU

void write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    const ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw std::runtime_error(std::string("pipe write failed: ") + std::strerror(errno));
    c += w, n -= size_t(w);
  }
}

bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n) {
    const ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r, n -= size_t(r);
  }
  return true;
}

struct Writer {
  std::string s;
  template <class T>
  void pod(const T& v) { s.append(reinterpret_cast<const char*>(&v), sizeof(T)); }
  template <class T>
  void vec(const std::vector<T>& v) {
    pod(uint64_t(v.size()));
    s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
};

struct Reader {
  const std::string& s;
  size_t at = 0;
  template <class T>
  void pod(T& v) {
    if (at + sizeof(T) > s.size()) throw std::runtime_error("a rank's result is truncated");
    std::memcpy(&v, s.data() + at, sizeof(T));
    at += sizeof(T);
  }
  template <class T>
  void vec(std::vector<T>& v) {
    uint64_t n = 0;
    pod(n);
    if (at + n * sizeof(T) > s.size()) throw std::runtime_error("a rank's result is truncated");
    v.resize(n);
    if (n) std::memcpy(v.data(), s.data() + at, n * sizeof(T));
    at += n * sizeof(T);
  }
};

std::string pack(const RankOut& o) {
  Writer w;
  w.pod(o.rank), w.pod(o.t0), w.pod(o.t1), w.pod(o.compiled), w.pod(o.loaded), w.pod(o.rerun_same), w.pod(o.ms);
  w.vec(o.dq_rows), w.vec(o.dkv), w.vec(o.d_sink), w.vec(o.one.dq), w.vec(o.one.dkv), w.vec(o.one.d_sink);
  return w.s;
}

RankOut unpack(const std::string& s) {
  Reader r{s};
  RankOut o;
  r.pod(o.rank), r.pod(o.t0), r.pod(o.t1), r.pod(o.compiled), r.pod(o.loaded), r.pod(o.rerun_same), r.pod(o.ms);
  r.vec(o.dq_rows), r.vec(o.dkv), r.vec(o.d_sink), r.vec(o.one.dq), r.vec(o.one.dkv), r.vec(o.one.d_sink);
  return o;
}

// Runs fn in a child process and returns its pid; the child exits with fn's status.
template <class Fn>
pid_t spawn(Fn fn) {
  std::fflush(stdout), std::fflush(stderr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    // A rank outlives no parent: one killed alone (a timeout, kill <pid>) would leave its ranks spinning in NCCL on
    // their GPUs. The signal follows the forking thread, which is this tool's main thread. Best effort where prctl is
    // refused (a sandbox); a parent already gone before it took effect: exit at once.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
      std::fprintf(stderr, "smla-seqpar: a rank could not ask to die with its parent (prctl: %s)\n", std::strerror(errno));
    if (getppid() != parent) _exit(2);
    int rc = 2;
    try {
      rc = fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
    std::fflush(stdout), std::fflush(stderr);
    _exit(rc);
  }
  return pid;
}

// How many CUDA devices, asked in a child so this process stays free of CUDA.
int probe_devices(std::string* why) {
  int fd[2];
  if (pipe(fd)) throw std::runtime_error("pipe failed");
  const pid_t pid = spawn([&] {
    close(fd[0]);
    int n = 0;
    if (cuda::driver().ok) cuda::driver().DeviceGetCount(&n);
    std::string msg = cuda::driver().ok ? "" : cuda::driver().why;
    write_all(fd[1], &n, sizeof(n));
    write_all(fd[1], msg.data(), msg.size());
    return 0;
  });
  close(fd[1]);
  int n = 0;
  if (!read_all(fd[0], &n, sizeof(n))) n = 0;
  char buf[512];
  ssize_t k;
  while ((k = read(fd[0], buf, sizeof(buf))) > 0) why->append(buf, size_t(k));
  close(fd[0]);
  waitpid(pid, nullptr, 0);
  return n;
}

std::vector<RankOut> cuda_ranks(const Problem& whole, const ref::Inputs& in, int n, tools::Outputs* one) {
  std::string why;
  const int devices = probe_devices(&why);
  if (devices < n)
    throw std::runtime_error("--backend cuda with " + std::to_string(n) + " ranks needs " + std::to_string(n) +
                             " CUDA devices, found " + std::to_string(devices) + (why.empty() ? "" : " (" + why + ")"));
  nccl::disable_nvlink_multicast();  // the children inherit it
  std::vector<std::array<int, 2>> id_pipe(static_cast<size_t>(n)), out_pipe(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    if ((r > 0 && pipe(id_pipe[size_t(r)].data())) || pipe(out_pipe[size_t(r)].data())) throw std::runtime_error("pipe failed");
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pids.push_back(spawn([&, r] {
      // Keep only this rank's ends: EOF must reach a reader when its writer dies.
      for (int k = 0; k < n; ++k) {
        if (k > 0) {
          if (!(r == 0)) close(id_pipe[size_t(k)][1]);
          if (k != r) close(id_pipe[size_t(k)][0]);
        }
        close(out_pipe[size_t(k)][0]);
        if (k != r) close(out_pipe[size_t(k)][1]);
      }
      nccl::UniqueId id;
      if (r == 0) {
        id = nccl::unique_id(*nccl::library());
        for (int k = 1; k < n; ++k) write_all(id_pipe[size_t(k)][1], &id, sizeof(id)), close(id_pipe[size_t(k)][1]);
      } else if (!read_all(id_pipe[size_t(r)][0], &id, sizeof(id))) {
        throw std::runtime_error("rank " + std::to_string(r) + ": rank 0 sent no NCCL id (it failed; see above)");
      }
      Runtime rt;
      Problem p = whole;
      p.device = r;
      seqpar::NcclReducer red(id, r, n, r);  // (its context is current only inside its calls: CaseRunner takes p.device)
      RankOut o;
      try {
        o = run_rank(rt, p, in, r, n, red);
        if (r == 0 && one) o.one = one_rank(rt, p, in);  // only for --check
      } catch (const std::exception& e) {
        // Whatever failed (plan(), an allocation, a kernel fault at the sync): abort the communicator, or its
        // destruction in the unwinding could wait for a collective this rank queued and will never finish.
        red.abort(e.what());
        throw;
      }
      const std::string bytes = pack(o);
      write_all(out_pipe[size_t(r)][1], bytes.data(), bytes.size());
      return 0;
    }));
  }
  for (int r = 0; r < n; ++r) {
    if (r > 0) close(id_pipe[size_t(r)][0]), close(id_pipe[size_t(r)][1]);
    close(out_pipe[size_t(r)][1]);
  }
  // Read every rank at once (a rank blocks on a full pipe); when one fails, stop the others,
  // which would otherwise wait in NCCL forever.
  std::vector<std::string> data(static_cast<size_t>(n));
  std::vector<bool> live(static_cast<size_t>(n), true);
  std::string failed;
  for (int left = n; left > 0;) {
    std::vector<pollfd> pf;
    std::vector<int> who;
    for (int r = 0; r < n; ++r)
      if (live[size_t(r)]) pf.push_back({out_pipe[size_t(r)][0], POLLIN, 0}), who.push_back(r);
    if (poll(pf.data(), pf.size(), -1) < 0 && errno != EINTR) throw std::runtime_error("poll failed");
    for (size_t i = 0; i < pf.size(); ++i) {
      if (!pf[i].revents) continue;
      const int r = who[i];
      char buf[1 << 16];
      const ssize_t k = read(pf[i].fd, buf, sizeof(buf));
      if (k > 0) {
        data[size_t(r)].append(buf, size_t(k));
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      close(pf[i].fd), live[size_t(r)] = false, --left;
      int st = 0;
      waitpid(pids[size_t(r)], &st, 0);
      if (!(WIFEXITED(st) && WEXITSTATUS(st) == 0) && failed.empty()) {
        failed = "rank " + std::to_string(r) + " failed (exit status " + std::to_string(WIFEXITED(st) ? WEXITSTATUS(st) : -1) + ")";
        for (int q = 0; q < n; ++q)
          if (live[size_t(q)]) kill(pids[size_t(q)], SIGTERM);
      }
    }
  }
  if (!failed.empty()) throw std::runtime_error(failed);
  std::vector<RankOut> outs;
  for (int r = 0; r < n; ++r) outs.push_back(unpack(data[size_t(r)]));
  if (one) *one = outs[0].one;
  return outs;
}

// ---- report

std::vector<double> widen(const std::vector<uint16_t>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = bf16_to_float(v[i]);
  return d;
}

int run(const Options& o) {
  Problem whole;
  whole.backend = o.backend == "cuda" ? BackendKind::Cuda : BackendKind::Cpu;
  const bool gpu = whole.backend == BackendKind::Cuda;
  const std::string shape = o.shape.empty() ? (gpu ? "1024,64,1536,512" : "256,16,320,160") : o.shape;
  tools::set_one_shape(whole, shape);
  whole.has_sink = !o.no_sink;
  whole.r_chunk = o.r_chunk;
  whole.t_chunk = o.t_chunk;
  // Every rank's problem checked before the inputs are made (their float64 forward is most of a large shape's time,
  // and a bad field would otherwise surface as an allocation error naming none).
  // The chunk-pair limit too (plan()'s), for each rank and, under --check, for the one-rank run: the whole problem's
  // was refused after minutes of rank work, and its one-rank run was made even without --check.
  const size_t budget = runtime_env().interm_budget;
  validate_problem(whole);
  if (o.check) check_chunk_count(choose_shape(whole, budget));
  for (int r = 0; r < o.ranks; ++r) {
    const Problem rp = seqpar::rank_problem(whole, seqpar::split(whole.T, r, o.ranks));
    validate_problem(rp);
    check_chunk_count(choose_shape(rp, budget));
  }
  const ref::Inputs in = ref::make_inputs(int(whole.T), int(whole.H), int(whole.num_kv), int(whole.topk),
                                          whole.has_sink, o.seed,
                                          o.uniform ? ref::TopkKind::Uniform : ref::TopkKind::Benchmark);
  tools::Outputs one;
  tools::Outputs* want_one = o.check ? &one : nullptr;
  const std::vector<RankOut> outs =
      gpu ? cuda_ranks(whole, in, o.ranks, want_one) : cpu_ranks(whole, in, o.ranks, want_one);

  std::printf("smla-seqpar %s, %d ranks, T=%lld H=%lld num_kv=%lld topk=%lld%s\n", gpu ? "cuda (NCCL)" : "cpu (threads)",
              o.ranks, (long long)whole.T, (long long)whole.H, (long long)whole.num_kv, (long long)whole.topk,
              whole.has_sink ? " sink" : "");
  for (const RankOut& r : outs)
    std::printf("  rank %d: tokens [%lld, %lld), %d kernels compiled, %d from disk, backward+reduce %.3f ms\n", r.rank,
                (long long)r.t0, (long long)r.t1, r.compiled, r.loaded, r.ms);

  // Assemble: dq rows in rank order; the sums from rank 0, rounded to bf16 once.
  tools::Outputs split;
  for (const RankOut& r : outs) split.dq.insert(split.dq.end(), r.dq_rows.begin(), r.dq_rows.end());
  split.dkv.resize(outs[0].dkv.size());
  seqpar::round_to_bf16(outs[0].dkv.data(), split.dkv.data(), split.dkv.size());
  split.d_sink = outs[0].d_sink;
  if (!o.check) return 0;

  bool pass = true;
  auto report = [&](const std::string& name, const ref::Compare& c) {
    const bool ok = ref::meets_bar(c);
    pass = pass && ok;
    std::printf("check %-22s rel_err %.3e  cosine %.6f  finite %s  unwritten %zu  %s\n", name.c_str(), c.rel_err,
                c.cosine, c.finite ? "yes" : "NO", c.unwritten, ok ? "ok" : "FAIL");
  };
  auto fact = [&](const std::string& name, bool ok, bool required) {
    pass = pass && (ok || !required);
    std::printf("check %-22s %s\n", name.c_str(), ok ? "yes" : required ? "NO  FAIL" : "no (informational)");
  };
  const size_t nq = split.dq.size(), nkv = split.dkv.size();
  report("dq vs one rank", ref::compare(widen(one.dq), split.dq.data(), nq));
  report("dkv vs one rank", ref::compare(widen(one.dkv), split.dkv.data(), nkv));
  if (whole.has_sink)
    report("d_sink vs one rank", ref::compare(std::vector<double>(one.d_sink.begin(), one.d_sink.end()),
                                              split.d_sink.data(), split.d_sink.size()));
  const ref::Grads g = ref::backward(in);
  report("dq vs float64", ref::compare(g.dq, split.dq.data(), nq));
  report("dkv vs float64", ref::compare(g.dkv, split.dkv.data(), nkv));
  if (whole.has_sink) report("d_sink vs float64", ref::compare(g.d_sink, split.d_sink.data(), split.d_sink.size()));
  bool agree = true, rerun = true;
  for (const RankOut& r : outs) {
    agree = agree && same_bits(r.dkv, outs[0].dkv) && same_bits(r.d_sink, outs[0].d_sink);
    rerun = rerun && r.rerun_same;
  }
  fact("ranks hold same sums", agree, true);
  fact("two runs same bits", rerun, true);
  fact("dq bits = one rank", split.dq == one.dq, false);
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"smla-seqpar: sequence-parallel backward (tokens split over ranks, dkv summed across them)"};
  Options o;
  app.add_option("--ranks", o.ranks, "number of ranks (threads on the CPU, GPUs with cuda)")
      ->transform(smla::tools::decimal(o.ranks))
      ->check(CLI::Range(1, 64));
  app.add_option("--backend", o.backend, "cpu|cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--shape", o.shape, "T,H,NUM_KV,TOPK of the whole batch (default 256,16,320,160 on the CPU, "
                                     "1024,64,1536,512 with cuda)")
      ->check(smla::tools::non_empty_value());
  app.add_option("--r-chunk", o.r_chunk, "R_CHUNK: top-k slots a chunk (0: the planner's choice, all of them)")
      ->transform(smla::tools::decimal(o.r_chunk));
  app.add_option("--t-chunk", o.t_chunk, "tokens a chunk within each rank (0: the planner's choice)")
      ->transform(smla::tools::decimal(o.t_chunk));
  app.add_flag("--no-sink", o.no_sink, "run without attn_sink");
  app.add_flag("--uniform", o.uniform, "uniform random top-k instead of the benchmark top-k");
  app.add_flag("--check", o.check, "compare with one rank and the float64 reference; exit 1 when off the bar");
  app.add_option("--seed", o.seed, "random seed of the inputs")->transform(smla::tools::decimal(o.seed));
  SMLA_TOOL_PARSE(app, argc, argv);
  return smla::tools::run_tool("smla-seqpar", [&] { return run(o); });
}
