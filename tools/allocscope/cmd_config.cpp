// allocscope config: the ALLOCSCOPE_* variables (core/config_table.h), as
// this environment sets them, or as the markdown table of
// docs/ENVIRONMENT.md.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "args.h"
#include "cli.h"
#include "config.h"
#include "config_table.h"

namespace allocscope::cli {

namespace {

constexpr const char* kConfigHelp =
    R"help(usage: allocscope config [--markdown]

Prints every ALLOCSCOPE_* variable allocscope reads, one line each,
NAME=VALUE, with the value this environment gives it as liballocscope.so
parses it (its default when unset, marked "(default)"), and on stderr one
line for each value that would be ignored; exits 2 when there is one.
docs/ENVIRONMENT.md says what each variable does and who reads it when.

options:
  --markdown   print docs/ENVIRONMENT.md's table of the variables instead
               (the same whatever the environment)

example:
  ALLOCSCOPE_STACK_DEPTH=200 allocscope config
)help";

}  // namespace

const Config& environment_config() {
    static const Config parsed = parse_config([](const char* name) { return std::getenv(name); });
    return parsed;
}

int config_command(const std::vector<std::string>& args) {
    bool markdown = false;
    Args parser("config", kConfigHelp);
    parser.flag({"--markdown"}, markdown);
    if (const auto status = parser.parse(args)) return *status;
    if (!parser.positionals().empty())
        return fail("config takes no PATH (" + parser.see_help() + ")");
    if (markdown) {
        std::fputs(config_markdown().c_str(), stdout);
        return 0;
    }
    const Config& c = environment_config();
    for (const ConfigVariable& v : kConfigVariables) {
        const std::string name(v.name);
        const char* set = std::getenv(name.c_str());
        std::printf("%s=%s%s\n", name.c_str(), config_value(c, v.name).value_or("").c_str(),
                    set ? "" : "  (default)");
    }
    for (const std::string& w : c.warnings)
        std::fprintf(stderr, "%s\n", w.c_str());
    return c.warnings.empty() ? 0 : kExitUsage;
}

}  // namespace allocscope::cli
