// cli_parse.hpp: how every tool parses its command line. CLI11_PARSE returns CLI11's own codes (101-109) on a usage
// error; the tools promise 2 for "could not run" and 1 for "ran, but something failed" (tool_main.hpp), so a usage
// error is 2 here, with CLI11's message; --help is 0. And how every tool ends: with its output written (flush_stdout).
#pragma once
#include <CLI/CLI.hpp>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

// A parse error is exit 2; --help's text is the tool's output, and one that could not be written is 2 as well.
#define SMLA_TOOL_PARSE(app, argc, argv)                                                   \
  do {                                                                                     \
    try {                                                                                  \
      (app).parse((argc), (argv));                                                         \
    } catch (const CLI::ParseError& smla_parse_error) {                                    \
      if ((app).exit(smla_parse_error) != 0) return 2;                                     \
      return ::smla::tools::flush_stdout(::smla::tools::program_name((argv)[0])) ? 0 : 2; \
    }                                                                                      \
  } while (0)

namespace smla::tools {

/// The transform every integer option of the tools takes: plain decimal digits (a '-' only for a signed type) whose
/// value fits the option's type, rewritten without leading zeros. CLI11 (2.1) converts with strtoull/strtoll in base
/// 0 and does not look at ERANGE: a --seed of -1 wrapped to 2^64 - 1, one of 99999999999999999999 saturated to the
/// same value (three spellings, one set of inputs, none of them the one asked for), and "010" was octal 8.
/// Usage: app.add_option("--seed", o.seed, ...)->transform(tools::decimal(o.seed)).
template <class T>
CLI::Validator decimal(const T&) {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        T v{};
        const char* end = s.data() + s.size();
        const std::from_chars_result r = std::from_chars(s.data(), end, v);
        if (s.empty() || r.ec != std::errc() || r.ptr != end)
          return "'" + s + "' is not a decimal integer from " + std::to_string(std::numeric_limits<T>::min()) +
                 " to " + std::to_string(std::numeric_limits<T>::max());
        s = std::to_string(v);
        return "";
      },
      "");
}
/// A list option (e.g. --dq-impl 2,3): each element as above.
template <class T>
CLI::Validator decimal(const std::vector<T>&) {
  return decimal(T{});
}

/// Flushes stdout; false, with "<tool>: cannot write the output: <why>" on stderr, when that fails or a write before
/// it did. The output is part of a tool's result: on a full disk the JSON or the listing was cut short or empty and
/// the tool still exited 0.
/// argv[0] without its directory, as the tools name themselves in messages.
inline const char* program_name(const char* argv0) {
  const char* slash = std::strrchr(argv0, '/');
  return slash ? slash + 1 : argv0;
}

inline bool flush_stdout(const char* tool) {
  errno = 0;
  if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return true;
  std::fprintf(stderr, "%s: cannot write the output: %s\n", tool, errno ? std::strerror(errno) : "a write failed");
  return false;
}

/// The check of a path option: an empty value is a usage error. It read as the option left out, so that
/// smla-warmup --out "$DIR" with DIR unset filled the user cache instead of the directory to ship.
inline CLI::Validator non_empty_path() {
  return CLI::Validator([](std::string& s) { return s.empty() ? std::string("an empty path") : std::string(); }, "");
}

/// CLI11 drops the empty items of a comma-separated list option: "--arch sm_90a," or "--dq-impl 2,,3" ran as
/// "sm_90a" and "2,3", a typo that named fewer items than meant, without a word. The first value of one of `names`
/// (as "--name VALUE" or "--name=VALUE") with a comma at an end or two together, as a usage error's message; else "".
inline std::string empty_list_item(int argc, char** argv, std::initializer_list<const char*> names) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;  // positionals from here
    for (const char* n : names) {
      const std::string name = n, eq = name + "=";
      std::vector<std::string> values;  // "--name A B,C": CLI11 takes every value up to the next option
      if (a == name)
        for (int j = i + 1; j < argc && argv[j][0] != '-'; ++j) values.push_back(argv[j]);
      else if (a.compare(0, eq.size(), eq) == 0)
        values.push_back(a.substr(eq.size()));
      for (const std::string& v : values)
        if (!v.empty() && (v.front() == ',' || v.back() == ',' || v.find(",,") != std::string::npos))
          return name + ": '" + v + "' has an empty item (a comma at an end, or two together)";
    }
  }
  return "";
}
/// empty_list_item() said as CLI11 says a usage error; false when there is one (the tool exits 2).
inline bool list_items_ok(int argc, char** argv, std::initializer_list<const char*> names) {
  const std::string bad = empty_list_item(argc, argv, names);
  if (!bad.empty()) std::fprintf(stderr, "%s\nRun with --help for more information.\n", bad.c_str());
  return bad.empty();
}

/// The same for a value that is not a path (--shape "$SHAPE" with SHAPE unset ran the default shape).
inline CLI::Validator non_empty_value() {
  return CLI::Validator([](std::string& s) { return s.empty() ? std::string("an empty value") : std::string(); }, "");
}

}  // namespace smla::tools
