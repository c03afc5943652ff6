// cli_parse.hpp: how every tool parses its command line. CLI11_PARSE returns CLI11's own codes (101-109) on a usage
// error; the tools promise 2 for "could not run" and 1 for "ran, but something failed" (tool_main.hpp), so a usage
// error is 2 here, with CLI11's message; --help is 0.
#pragma once
#include <CLI/CLI.hpp>

#define SMLA_TOOL_PARSE(app, argc, argv)               \
  do {                                                 \
    try {                                              \
      (app).parse((argc), (argv));                     \
    } catch (const CLI::ParseError& smla_parse_error) { \
      return (app).exit(smla_parse_error) == 0 ? 0 : 2; \
    }                                                  \
  } while (0)
