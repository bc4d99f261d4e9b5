// Table-driven tests of the two ways users configure allocscope (issue 7,
// bad input): the ALLOCSCOPE_* environment (core/config.h), every variable
// with good and bad values plus random values, and the CLI's arguments,
// every subcommand with bad or missing arguments.
#include <doctest/doctest.h>

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "config_table.h"
#include "support.h"
#include "trace_bound.h"

using namespace allocscope;
using namespace allocscope::test;

namespace {

using Env = std::map<std::string, std::string>;

Config parse(const Env& env) {
    return parse_config([&env](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
    });
}

struct EnvCase {
    std::string variable;
    std::vector<std::string> good;
    std::vector<std::string> bad;
    std::string accepted;  // what the warning lists as accepted
};

const std::vector<EnvCase>& env_cases() {
    static const std::vector<EnvCase> cases = {
        {"ALLOCSCOPE_DISABLE",
         {"1", "0", "true", "false", "yes", "no", ""},
         {"2", "on", "TRUE", " 1", "1\n"},
         "1, 0, true, false, yes, no"},
        {"ALLOCSCOPE_DRIVER_HOOKS",
         {"1", "0", "true", "no", ""},
         {"off", "enable", "-1"},
         "1, 0, true, false, yes, no"},
        {"ALLOCSCOPE_WALK_CYCLES", {"1", "false"}, {"on"}, "1, 0, true, false, yes, no"},
        {"ALLOCSCOPE_SIGTERM", {"0", "1", "no"}, {"off", "2"}, "1, 0, true, false, yes, no"},
        {"ALLOCSCOPE_OUT", {"/tmp/x", "relative/dir", "a b"}, {""}, "directory path"},
        {"ALLOCSCOPE_MAX_TRACE_SIZE",
         {"0", "1M", "2G", "65536", "512KiB"},
         {"1.5G", "M", "-1", "10X", "1M ", "99999999999999999999"},
         "a size such as 512M or 2G"},
        {"ALLOCSCOPE_STACK_DEPTH",
         {"0", "1", "128"},
         {"129", "-1", "x", "", "1e3", "0x10", "99999999999999999999"},
         "from 0 (stacks off) to 128"},
        {"ALLOCSCOPE_LOG",
         {"quiet", "info", "debug"},
         {"", "verbose", "Info", "debug "},
         "quiet, info, debug"},
        {"ALLOCSCOPE_PLUGINS",
         {"none", "a", "a,b", "/p/x.so,peak-owner"},
         {"", ",", "a,,b", "none,a", "a,\tb"},
         "plugin"},
        {"ALLOCSCOPE_PLUGIN_OPTIONS",
         {"", "a.k=v", "a.k=,b-2.x=1"},
         {"novalue", "a.k", ".k=v", "A.k=v", "a.=v", "a.k=v,", "a.k=v\n"},
         "<plugin>.<key>=<value>"},
        {"RANK", {"0", "7", "2147483647"}, {"-1", "x", "1.5", "2147483648", ""}, "integer >= 0"},
        {"OMPI_COMM_WORLD_RANK", {"3"}, {"-3", "three"}, "integer >= 0"},
        {"SLURM_PROCID", {"0"}, {"a"}, "integer >= 0"},
        {"WORLD_SIZE", {"1", "64"}, {"0", "-2", "big"}, "integer >= 1"},
        {"OMPI_COMM_WORLD_SIZE", {"8"}, {"0"}, "integer >= 1"},
        {"SLURM_NTASKS", {"2"}, {"x2"}, "integer >= 1"},
    };
    return cases;
}

bool printable_line(const std::string& s) {
    for (char c : s) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) return false;
    }
    return true;
}

}  // namespace

TEST_CASE("every configuration variable: good values pass silently, bad ones warn once") {
    for (const EnvCase& c : env_cases()) {
        CAPTURE(c.variable);
        for (const std::string& v : c.good) {
            CAPTURE(v);
            CHECK(parse({{c.variable, v}}).warnings.empty());
        }
        for (const std::string& v : c.bad) {
            CAPTURE(v);
            const Config cfg = parse({{c.variable, v}});
            REQUIRE(cfg.warnings.size() == 1);
            const std::string& w = cfg.warnings[0];
            CAPTURE(w);
            CHECK(w.rfind("allocscope: ", 0) == 0);
            CHECK(contains(w, c.variable));
            CHECK(contains(w, c.accepted));
            CHECK(printable_line(w));  // a value with a newline cannot forge lines
        }
    }
}

TEST_CASE("a bad value keeps that setting's default and leaves the others alone") {
    const Config d;
    Env all_bad;
    for (const EnvCase& c : env_cases())
        all_bad[c.variable] = c.bad.front();
    all_bad["ALLOCSCOPE_PLUGIN_DIR"] = "/opt/plugins";
    const Config cfg = parse(all_bad);
    CHECK(cfg.disabled == d.disabled);
    CHECK(cfg.sigterm == d.sigterm);
    CHECK(cfg.out_dir == d.out_dir);
    CHECK(cfg.stack_depth == d.stack_depth);
    CHECK(cfg.log == d.log);
    CHECK(cfg.plugins == d.plugins);
    CHECK(cfg.plugins_off == d.plugins_off);
    CHECK(cfg.plugin_options.empty());
    CHECK(cfg.rank == -1);
    CHECK(cfg.world_size == -1);
    CHECK(cfg.plugin_dir == "/opt/plugins");
    CHECK(cfg.warnings.size() == env_cases().size());
}

TEST_CASE("random values never throw and give at most one one-line warning per variable") {
    std::mt19937_64 rng(7);
    static const char kAlphabet[] = "0123456789-+.,=/ abcxyzAZ_\t\n\x01\x7f\xff";
    const std::string alphabet(kAlphabet, sizeof kAlphabet - 1);
    size_t warned = 0, tried = 0;
    for (int round = 0; round < 3000; ++round) {
        Env env;
        for (const EnvCase& c : env_cases()) {
            if (rng() % 3 == 0) continue;
            std::string v;
            const size_t n = rng() % 12;
            for (size_t i = 0; i < n; ++i)
                v += alphabet[rng() % alphabet.size()];
            env[c.variable] = v;
        }
        Config cfg;
        REQUIRE_NOTHROW(cfg = parse(env));
        tried += env.size();
        warned += cfg.warnings.size();
        CHECK(cfg.warnings.size() <= env.size());
        for (const std::string& w : cfg.warnings) {
            CAPTURE(w);
            CHECK(w.rfind("allocscope: ", 0) == 0);
            CHECK(printable_line(w));
        }
        CHECK(cfg.stack_depth <= Config::kMaxStackDepth);
    }
    MESSAGE(tried << " random values, " << warned << " warnings");
}

namespace {

struct CliCase {
    std::string args;
    std::string says;  // in the one error line
};

}  // namespace

TEST_CASE("every subcommand refuses bad or missing arguments with exit 2 and one line") {
    TempDir t;
    const std::string missing = (t / "missing").string();
    const std::vector<CliCase> cases = {
        {"frobnicate", "unknown command 'frobnicate'"},
        {"--frobnicate", "unknown command"},
        // run
        {"run", "run needs a command"},
        {"run --out", "--out needs a value"},
        {"run --bogus -- true", "unknown option '--bogus' for run"},
        {"run --stack-depth 129 -- true", "--stack-depth expects an integer from 0 to 128"},
        {"run --stack-depth -1 -- true", "--stack-depth expects"},
        {"run --stack-depth 12x -- true", "--stack-depth expects"},
        {"run --plugins a,,b -- true", "--plugins 'a,,b'"},
        {"run --plugins none --check -- true", "--check needs plugins"},
        {"run --plugin-option nodot=1 -- true", "--plugin-option"},
        {"run --plugin-dir " + missing + " -- true", "is not a directory"},
        {"run --fail-on fatal -- true", "--fail-on expects info, warning or error"},
        // report
        {"report", "report needs a trace file or directory"},
        {"report " + missing, "no such file or directory"},
        {"report --format pdf x", "--format expects text, json or html"},
        {"report --top -1 x", "--top expects a non-negative integer"},
        {"report --rank", "--rank needs a value"},
        {"report --bogus x", "unknown option '--bogus' for report"},
        // diff
        {"diff", "diff needs BASE and CAND"},
        {"diff a", "diff needs BASE and CAND"},
        {"diff a b c", "diff needs BASE and CAND"},
        {"diff --forward-threshold 12XB a b", "expects bytes"},
        {"diff --format html a b", "--format expects text or json"},
        {"diff --bogus a b", "unknown option '--bogus' for diff"},
        // export
        {"export", "export needs a trace file or directory"},
        {"export x", "export needs --format"},
        {"export --format svg x", "--format expects perfetto, collapsed, memory-viz or parquet"},
        {"export --rank -2 --format perfetto x", "--rank expects a non-negative integer"},
        {"export -o", "-o needs a value"},
        {"export --bogus x", "unknown option '--bogus' for export"},
        // replay
        {"replay", "replay needs a trace file or directory"},
        {"replay --plugins none,a x", "--plugins 'none,a'"},
        {"replay --plugin-option A.b=1 x", "--plugin-option"},
        {"replay --plugin-dir " + missing + " x", "is not a directory"},
        {"replay -x", "unknown option '-x' for replay"},
        // check
        {"check", "check needs a PATH"},
        {"check a b", "check takes one PATH"},
        {"check --fail-on", "--fail-on needs a value"},
        {"check --fail-on fatal x", "--fail-on expects info, warning or error"},
        {"check " + missing, "no such file or directory"},
        {"check --bogus", "unknown option '--bogus' for check"},
    };
    for (const CliCase& c : cases) {
        CAPTURE(c.args);
        std::string out, err;
        const int status = sh(env("E2E_CLI") + " " + c.args, &out, &err);
        CAPTURE(err);
        CHECK(status == 2);
        CHECK(out.empty());
        std::istringstream lines(err);
        std::vector<std::string> said;
        for (std::string line; std::getline(lines, line);)
            said.push_back(line);
        REQUIRE(said.size() == 1);
        CHECK(said[0].rfind("allocscope: ", 0) == 0);
        CHECK(contains(said[0], c.says));
    }
}

TEST_CASE("allocscope --help names every option that each subcommand's --help lists") {
    std::string usage;
    REQUIRE(sh(env("E2E_CLI") + " --help", &usage) == 0);
    const std::vector<std::string> commands = {"run",    "report", "diff",
                                               "export", "replay", "check"};
    // The usage's block of `cmd`: from its line to the next command's.
    auto block_of = [&](const std::string& cmd) {
        const size_t from = usage.find("\n  " + cmd + " ");
        REQUIRE(from != std::string::npos);
        size_t to = std::string::npos;
        for (const std::string& other : commands) {
            const size_t at = usage.find("\n  " + other + " ", from + 1);
            if (at != std::string::npos && at < to) to = at;
        }
        return usage.substr(from, to == std::string::npos ? std::string::npos : to - from);
    };
    for (const std::string& cmd : commands) {
        CAPTURE(cmd);
        std::string help;
        REQUIRE(sh(env("E2E_CLI") + " " + cmd + " --help", &help) == 0);
        const std::string block = block_of(cmd);
        std::istringstream lines(help);
        size_t options = 0;
        for (std::string line; std::getline(lines, line);) {
            // An option's own line: two spaces, then "-o" or "--name".
            if (line.rfind("  -", 0) != 0) continue;
            const std::string option = line.substr(2, line.find(' ', 2) - 2);
            CAPTURE(option);
            ++options;
            CHECK(contains(block, "[" + option) + contains(block, " " + option + " ") > 0);
        }
        CHECK(options >= (cmd == "check" ? 0u : 2u));
    }
}

TEST_CASE("run --help states the configuration table's defaults and the parser's limits") {
    std::string help;
    REQUIRE(sh(env("E2E_CLI") + " run --help", &help) == 0);
    CHECK(!contains(help, "{"));  // every placeholder expanded
    // The help's words, joined by single spaces whatever the wrapping.
    std::string text;
    std::istringstream words(help);
    for (std::string word; words >> word;)
        text += (text.empty() ? "" : " ") + word;
    auto table_default = [](std::string_view name) {
        const ConfigVariable* v = find_config_variable(name);
        REQUIRE(v != nullptr);
        return std::string(v->default_value);
    };
    CHECK(contains(text, "--out DIR output directory (default: $ALLOCSCOPE_OUT or " +
                             table_default("ALLOCSCOPE_OUT") + ")"));
    CHECK(contains(text, "--stack-depth N frames captured per allocation, from 0 (stacks off) to " +
                             std::to_string(Config::kMaxStackDepth) + " (default " +
                             table_default("ALLOCSCOPE_STACK_DEPTH") + ")"));
    ProvenanceSteps steps;
    std::string problem;
    REQUIRE(parse_provenance_steps(table_default("ALLOCSCOPE_PROVENANCE_STEPS"), steps, problem));
    REQUIRE(steps.first > 1);
    REQUIRE(steps.every > 0);
    REQUIRE(steps.window > 1);
    CHECK(contains(text, "The default, " + table_default("ALLOCSCOPE_PROVENANCE_STEPS") +
                             ", observes steps 0-" + std::to_string(steps.first - 1) + ", " +
                             std::to_string(steps.every) + "-" +
                             std::to_string(steps.every + steps.window - 1) + ", " +
                             std::to_string(2 * steps.every) + "-" +
                             std::to_string(2 * steps.every + steps.window - 1) + ", ...:"));
    REQUIRE(kMinTraceBound % 1024 == 0);  // said in K below a megabyte
    REQUIRE(kMinTraceBound < 1024 * 1024);
    CHECK(contains(text, "at least " + std::to_string(kMinTraceBound / 1024) + "K)"));
}

TEST_CASE("every subcommand's --help exits 0 with its usage; no command prints the usage, exit 2") {
    for (const std::string cmd : {"run", "report", "diff", "export", "replay", "check"}) {
        CAPTURE(cmd);
        std::string out;
        CHECK(sh(env("E2E_CLI") + " " + cmd + " --help", &out) == 0);
        CHECK(out.rfind("usage: allocscope " + cmd, 0) == 0);
    }
    std::string out, err;
    CHECK(sh(env("E2E_CLI"), &out, &err) == 2);
    CHECK(out.empty());
    CHECK(err.rfind("usage: allocscope", 0) == 0);
    CHECK(sh(env("E2E_CLI") + " --version", &out) == 0);
    CHECK(out.rfind("allocscope ", 0) == 0);
}
