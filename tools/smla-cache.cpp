// smla-cache: inspect and maintain the kernel cache (the same directory and knobs as the runtime).
//   smla-cache [--dir DIR] list | verify | prune --max-bytes N | clear | export FILE | import FILE
// Exit code: 0 on success, 1 when something failed (bad entries, rejected imports, I/O errors), 2 when it could not
// run (a usage error, a --dir that is not a directory, a bundle that is not there or cannot be read, an export FILE
// that is there and not a regular file (a symbolic link's target is written), a prune, clear or
// import of the user cache under SMLA_CACHE_READONLY=1 without --dir).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <new>
#include <string>
#include <system_error>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "kernel_cache.hpp"
#include "cli_parse.hpp"  // beside this file

namespace sc = smla::cache;

namespace {

std::string human(int64_t b) {
  if (b >= (int64_t(1) << 30)) return fmt::format("{:.1f}G", double(b) / (1 << 30));
  if (b >= (1 << 20)) return fmt::format("{:.1f}M", double(b) / (1 << 20));
  if (b >= (1 << 10)) return fmt::format("{:.1f}K", double(b) / (1 << 10));
  return std::to_string(b);
}

std::string age(int64_t s) {
  if (s >= 86400) return std::to_string(s / 86400) + "d";
  if (s >= 3600) return std::to_string(s / 3600) + "h";
  if (s >= 60) return std::to_string(s / 60) + "m";
  return std::to_string(s) + "s";
}

int report(const char* what, const sc::BulkResult& r) {
  fmt::print("{}: {} entries\n", what, r.done);
  for (const auto& x : r.rejected) fmt::print(stderr, "rejected {}\n", x);
  if (!r.error.empty()) fmt::print(stderr, "error: {}\n", r.error);
  if (r.refused) return 2;  // the argument itself (export's FILE a device, a FIFO, a directory): a usage error
  return r.error.empty() && r.rejected.empty() ? 0 : 1;
}

int cache_main(int argc, char** argv) {
  CLI::App app{"smla-cache: list, verify, prune, clear, export and import the smla kernel cache"};
  sc::Settings s = sc::settings_from_env();
  app.add_option("--dir", s.dir, "cache directory (default: SMLA_CACHE_DIR, else XDG cache)")
      ->check(smla::tools::non_empty_path());
  app.require_subcommand(1);
  app.footer("Without --dir, prune, clear and import refuse a cache marked SMLA_CACHE_READONLY=1 (exit 2).");
  auto* list = app.add_subcommand("list", "tag, target, size and age of every entry");
  auto* verify = app.add_subcommand("verify", "check every entry, naming the damaged ones (BAD) and those it could not read (UNREADABLE); exit 1 if any is damaged, else 3 if any could not be read");
  auto* prune = app.add_subcommand("prune", "evict least recently used entries down to a size");
  std::string max_bytes;
  prune->add_option("--max-bytes", max_bytes, "bound, e.g. 2G, 512M or bytes")->required();
  auto* clear = app.add_subcommand("clear", "delete every entry");
  auto* exp = app.add_subcommand("export", "write every verified entry into one bundle file");
  auto* imp = app.add_subcommand("import", "add the entries of a bundle, verifying each");
  std::string file;
  exp->add_option("FILE", file, "bundle to write")->required()->check(smla::tools::non_empty_path());
  imp->add_option("FILE", file, "bundle to read")->required()->check(smla::tools::non_empty_path());
  SMLA_TOOL_PARSE(app, argc, argv);
  // A directory the caller named is not the /tmp fallback of a user without a home (whose privacy check refused a
  // group's directory named with --dir).
  if (app.count("--dir")) s.dir_in_shared_tmp = false;

  // A --dir that is not a directory, or an explicit one that is not there, is a mistake to say, not "0 entries" (the
  // default directory may well not exist yet: that is an empty cache).
  {
    std::error_code ec;
    const bool exists = std::filesystem::exists(s.dir, ec);
    if (exists && !std::filesystem::is_directory(s.dir, ec)) {
      fmt::print(stderr, "error: cache directory '{}' is not a directory\n", s.dir);
      return 2;
    }
    if (!exists && app.count("--dir") && !imp->parsed()) {
      fmt::print(stderr, "error: cache directory '{}' does not exist\n", s.dir);
      return 2;
    }
    if (imp->parsed() && !std::filesystem::is_regular_file(file, ec)) {
      fmt::print(stderr, "error: bundle '{}': {}\n", file,
                 std::filesystem::exists(file, ec) ? "not a regular file" : "no such file");
      return 2;
    }
    if (imp->parsed() && ::access(file.c_str(), R_OK) != 0) {  // a usage error as a missing one, not "not a bundle"
      fmt::print(stderr, "error: bundle '{}': {}\n", file, std::strerror(errno));
      return 2;
    }
  }
  // Maintenance acts on the user cache as it is: no system layer, no LRU side effects on open.
  s.disable = false;
  s.system_dir.clear();
  s.max_bytes = 0;
  // s.lock stays as SMLA_CACHE_LOCK says: maintenance never compiles, but prune and clear remove the lock files of the
  // keys they leave without an entry, and the cache knows where its locks live only with locks on (with them off, one
  // lock file per key ever compiled stayed behind).
  bool needs_write = prune->parsed() || clear->parsed() || imp->parsed();
  // As smla-warmup's --out: a directory named with --dir is written whatever SMLA_CACHE_READONLY says, but the user
  // cache a job environment marked read-only (a warmed cache its jobs share) is not pruned, cleared or imported into
  // by a command run in that environment.
  if (needs_write && s.readonly && !app.count("--dir")) {
    fmt::print(stderr,
               "error: SMLA_CACHE_READONLY is on: the cache {} is read-only in this environment and `{}` would write it; "
               "unset SMLA_CACHE_READONLY, or name the directory with --dir\n",
               s.dir, prune->parsed() ? "prune" : clear->parsed() ? "clear" : "import");
    return 2;
  }
  // Nothing to prune or clear where there is no cache (a mistyped --dir, or a default cache not made yet): said, and
  // nothing created there (opening the cache to write it made .locks/, .staging/ and entries/ in any directory).
  auto holds_cache = [&] {
    std::error_code ec;
    for (const char* sub : {"/entries", "/.staging", "/.locks"})
      if (std::filesystem::is_directory(s.dir + sub, ec)) return true;
    return false;
  };
  if ((prune->parsed() || clear->parsed()) && !holds_cache()) {
    fmt::print("{}: 0 entries ({} holds no smla cache: no entries/ directory)\n", prune->parsed() ? "evicted" : "removed",
               s.dir);
    return 0;
  }
  s.readonly = !needs_write;
  sc::DiskCache cache(s);

  if (list->parsed()) {
    auto v = cache.list();
    fmt::print("{:<44} {:<24} {:>8} {:>6}  {}\n", "TAG", "TARGET", "SIZE", "AGE", "ENTRY");
    int64_t total = 0;
    size_t unread = 0;
    // The compiler is part of every key: a job finds only the entries its own compiler made (`smla-bench --backends`
    // prints it there). Counted per compiler, so a cache carried to another machine is checked before a job compiles.
    std::map<std::string, size_t> by_compiler;
    for (const auto& e : v) {
      const bool read = e.problem.empty();
      unread += !read;
      if (read) ++by_compiler[e.compiler_id];
      fmt::print("{:<44} {:<24} {:>8} {:>6}  {}\n", read ? e.tag : "(manifest unreadable)", e.target, human(e.bytes),
                 age(e.age_s), e.name);
      total += e.bytes;
    }
    fmt::print("{} entries, {} in {}{}\n", v.size(), human(total), s.dir,
               unread ? fmt::format(" ({} whose manifest could not be read here: `verify` says why)", unread) : "");
    for (const auto& [id, n] : by_compiler) fmt::print("{} entries by compiler {}\n", n, id);
    return 0;
  }
  if (verify->parsed()) {
    // Damage (exit 1) is told apart from an entry this process could not read (exit 3): the latter is no verdict on
    // the entry (another user, or this one with descriptors to spare, may read it), and nothing removes it.
    int bad = 0, unreadable = 0;
    auto v = cache.verify();
    for (const auto& e : v) {
      if (e.ok) continue;
      ++(e.unreadable ? unreadable : bad);
      fmt::print("{} {}: {}\n", e.unreadable ? "UNREADABLE" : "BAD", e.name, e.problem);
    }
    fmt::print("{} entries, {} bad, {} unreadable\n", v.size(), bad, unreadable);
    return bad ? 1 : unreadable ? 3 : 0;
  }
  if (prune->parsed()) {
    int64_t n = 0;
    if (!sc::parse_byte_size(max_bytes, &n)) {
      fmt::print(stderr, "error: --max-bytes '{}' is not a size (e.g. 2G, 512M, 1000)\n", max_bytes);
      return 2;
    }
    return report("evicted", cache.prune(n));
  }
  if (clear->parsed()) return report("removed", cache.clear());
  if (exp->parsed()) return report("exported", cache.export_bundle(file));
  if (imp->parsed()) return report("imported", cache.import_bundle(file));
  return 0;
}

}  // namespace

// Output that could not be written is an I/O error like the others (exit 1): fmt::print throws std::system_error
// when a line does not fit (a full disk), which aborted the tool; a short listing was lost and the exit code was 0.
int main(int argc, char** argv) {
  try {
    const int rc = cache_main(argc, argv);
    // --help's text that could not be written was reported by SMLA_TOOL_PARSE (exit 2 there): here, as any output
    // of this tool, an I/O error, 1, said once.
    if (rc == 2 && std::ferror(stdout)) return 1;
    return smla::tools::flush_stdout("smla-cache") ? rc : 1;
  } catch (const std::system_error& e) {
    std::fprintf(stderr, "smla-cache: cannot write the output: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {  // (was std::terminate: abort, exit 134)
    std::fprintf(stderr, "smla-cache: out of host memory (std::bad_alloc)\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "smla-cache: %s\n", e.what());
    return 1;
  }
}
