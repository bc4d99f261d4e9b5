#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include "config.h"
#include "config_table.h"

using namespace allocscope;

namespace {

using Env = std::map<std::string, std::string>;

Config parse(const Env& env) {
    return parse_config([&env](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
    });
}

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

// The one warning a bad value must produce: a single line that names the
// variable, echoes the value and lists what is accepted.
void check_one_warning(const Config& c, const std::string& variable, const std::string& accepted) {
    REQUIRE(c.warnings.size() == 1);
    const std::string& w = c.warnings[0];
    CAPTURE(w);
    CHECK(w.rfind("allocscope: ", 0) == 0);
    CHECK(w.find('\n') == std::string::npos);
    CHECK(contains(w, variable));
    CHECK(contains(w, accepted));
}

void check_defaults_except_warnings(const Config& c) {
    const Config d;
    CHECK(c.out_dir == d.out_dir);
    CHECK(c.stack_depth == d.stack_depth);
    CHECK(c.plugins == d.plugins);
    CHECK(c.log == d.log);
    CHECK(c.disabled == d.disabled);
    CHECK(c.rank == d.rank);
    CHECK(c.world_size == d.world_size);
}

}  // namespace

TEST_CASE("an empty environment gives the defaults and no warnings") {
    Config c = parse({});
    CHECK(c.out_dir == "./allocscope-out");
    CHECK(c.stack_depth == 24);
    CHECK(c.plugins.empty());
    CHECK(c.log == LogLevel::info);
    CHECK_FALSE(c.disabled);
    CHECK(c.rank == -1);
    CHECK(c.world_size == -1);
    CHECK(c.warnings.empty());
}

TEST_CASE("variables unrelated to allocscope are ignored") {
    Config c = parse({{"HOME", "/root"}, {"ALLOCSCOPE_UNKNOWN", "1"}, {"PATH", "/bin"}});
    check_defaults_except_warnings(c);
    CHECK(c.warnings.empty());
}

TEST_CASE("ALLOCSCOPE_OUT sets the output directory") {
    Config c = parse({{"ALLOCSCOPE_OUT", "/scratch/run 17/traces"}});
    CHECK(c.out_dir == "/scratch/run 17/traces");
    CHECK(c.warnings.empty());
}

TEST_CASE("ALLOCSCOPE_STACK_DEPTH accepts 0 to 128") {
    for (auto [text, depth] : std::vector<std::pair<std::string, uint32_t>>{
             {"0", 0}, {"1", 1}, {"24", 24}, {"64", 64}, {"128", 128}}) {
        CAPTURE(text);
        Config c = parse({{"ALLOCSCOPE_STACK_DEPTH", text}});
        CHECK(c.stack_depth == depth);
        CHECK(c.warnings.empty());
    }
}

TEST_CASE("ALLOCSCOPE_LOG accepts quiet, info and debug") {
    CHECK(parse({{"ALLOCSCOPE_LOG", "quiet"}}).log == LogLevel::quiet);
    CHECK(parse({{"ALLOCSCOPE_LOG", "info"}}).log == LogLevel::info);
    CHECK(parse({{"ALLOCSCOPE_LOG", "debug"}}).log == LogLevel::debug);
    CHECK(parse({{"ALLOCSCOPE_LOG", "debug"}}).warnings.empty());
}

TEST_CASE("ALLOCSCOPE_DISABLE accepts 1, true, yes and 0, false, no, empty") {
    for (const char* on : {"1", "true", "yes"}) {
        CAPTURE(on);
        Config c = parse({{"ALLOCSCOPE_DISABLE", on}});
        CHECK(c.disabled);
        CHECK(c.warnings.empty());
    }
    for (const char* off : {"0", "false", "no", ""}) {
        CAPTURE(off);
        Config c = parse({{"ALLOCSCOPE_DISABLE", off}});
        CHECK_FALSE(c.disabled);
        CHECK(c.warnings.empty());
    }
}

TEST_CASE("ALLOCSCOPE_PLUGINS is a comma-separated list of names or paths") {
    Config c = parse({{"ALLOCSCOPE_PLUGINS", "peak,/opt/plugins/libfrag.so,leaks"}});
    CHECK_FALSE(c.plugins.empty());
    CHECK(c.plugins == std::vector<std::string>{"peak", "/opt/plugins/libfrag.so", "leaks"});
    CHECK(c.warnings.empty());

    Config one = parse({{"ALLOCSCOPE_PLUGINS", "peak"}});
    CHECK_FALSE(one.plugins.empty());
    CHECK(one.plugins == std::vector<std::string>{"peak"});
}

TEST_CASE("a bad ALLOCSCOPE_STACK_DEPTH warns once and keeps depth 24") {
    for (const char* bad : {"abc", "-1", "129", "24x", "", " 24", "+5", "99999999999999999999"}) {
        CAPTURE(bad);
        Config c = parse({{"ALLOCSCOPE_STACK_DEPTH", bad}});
        CHECK(c.stack_depth == Config::kDefaultStackDepth);
        check_one_warning(c, "ALLOCSCOPE_STACK_DEPTH", "from 0 (stacks off) to 128");
        CHECK(contains(c.warnings[0], std::string("'") + bad + "'"));
        check_defaults_except_warnings(c);
    }
}

TEST_CASE("a bad ALLOCSCOPE_LOG warns once and keeps info") {
    for (const char* bad : {"loud", "", "DEBUG", "quiet "}) {
        CAPTURE(bad);
        Config c = parse({{"ALLOCSCOPE_LOG", bad}});
        CHECK(c.log == LogLevel::info);
        check_one_warning(c, "ALLOCSCOPE_LOG", "quiet, info, debug");
        check_defaults_except_warnings(c);
    }
}

TEST_CASE("a bad ALLOCSCOPE_DISABLE warns once and leaves tracing on") {
    for (const char* bad : {"maybe", "2", "TRUE", "on"}) {
        CAPTURE(bad);
        Config c = parse({{"ALLOCSCOPE_DISABLE", bad}});
        CHECK_FALSE(c.disabled);
        check_one_warning(c, "ALLOCSCOPE_DISABLE", "1, 0, true, false, yes, no");
        check_defaults_except_warnings(c);
    }
}

TEST_CASE("an empty ALLOCSCOPE_OUT warns once and keeps the default directory") {
    Config c = parse({{"ALLOCSCOPE_OUT", ""}});
    CHECK(c.out_dir == "./allocscope-out");
    check_one_warning(c, "ALLOCSCOPE_OUT", "directory path");
    check_defaults_except_warnings(c);
}

TEST_CASE("ALLOCSCOPE_PLUGINS with an empty entry warns once and keeps the default plugins") {
    for (const char* bad : {",a", "a,,b", "a,", ","}) {
        CAPTURE(bad);
        Config c = parse({{"ALLOCSCOPE_PLUGINS", bad}});
        CHECK(c.plugins.empty());
        check_one_warning(c, "ALLOCSCOPE_PLUGINS", "comma-separated list");
        check_defaults_except_warnings(c);
    }
}

TEST_CASE("every bad variable gets its own warning and the good ones still apply") {
    Config c = parse({{"ALLOCSCOPE_STACK_DEPTH", "abc"},
                      {"ALLOCSCOPE_LOG", "loud"},
                      {"ALLOCSCOPE_DISABLE", "maybe"},
                      {"ALLOCSCOPE_OUT", "/tmp/x"},
                      {"ALLOCSCOPE_PLUGINS", "a,,b"},
                      {"RANK", "3"}});
    CHECK(c.warnings.size() == 4);
    CHECK(c.out_dir == "/tmp/x");
    CHECK(c.rank == 3);
    CHECK(c.stack_depth == 24);
    CHECK(c.log == LogLevel::info);
}

TEST_CASE("the rank comes from RANK, else OMPI_COMM_WORLD_RANK, else SLURM_PROCID") {
    CHECK(parse({{"SLURM_PROCID", "5"}}).rank == 5);
    CHECK(parse({{"OMPI_COMM_WORLD_RANK", "4"}, {"SLURM_PROCID", "5"}}).rank == 4);
    CHECK(parse({{"RANK", "3"}, {"OMPI_COMM_WORLD_RANK", "4"}, {"SLURM_PROCID", "5"}}).rank == 3);
    CHECK(parse({{"RANK", "0"}}).rank == 0);
    CHECK(parse({{"RANK", "2147483647"}}).rank == 2147483647);
}

TEST_CASE("the world size comes from WORLD_SIZE, else OMPI_COMM_WORLD_SIZE, else SLURM_NTASKS") {
    CHECK(parse({{"SLURM_NTASKS", "16"}}).world_size == 16);
    CHECK(parse({{"OMPI_COMM_WORLD_SIZE", "8"}, {"SLURM_NTASKS", "16"}}).world_size == 8);
    CHECK(parse({{"WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_SIZE", "8"}, {"SLURM_NTASKS", "16"}})
              .world_size == 4);
}

TEST_CASE("a malformed RANK warns and the next rank source is used") {
    Config c = parse({{"RANK", "two"}, {"OMPI_COMM_WORLD_RANK", "4"}, {"SLURM_PROCID", "5"}});
    CHECK(c.rank == 4);
    check_one_warning(c, "RANK='two'", "integer >= 0");

    Config negative = parse({{"RANK", "-3"}, {"SLURM_PROCID", "5"}});
    CHECK(negative.rank == 5);
    check_one_warning(negative, "RANK='-3'", "integer >= 0");

    Config all_bad = parse({{"RANK", "x"}, {"OMPI_COMM_WORLD_RANK", "4294967296"}});
    CHECK(all_bad.rank == -1);
    CHECK(all_bad.warnings.size() == 2);
    CHECK(contains(all_bad.warnings[0], "RANK='x'"));
    CHECK(contains(all_bad.warnings[1], "OMPI_COMM_WORLD_RANK='4294967296'"));
}

TEST_CASE("a world size below 1 warns and falls through") {
    Config c = parse({{"WORLD_SIZE", "0"}, {"SLURM_NTASKS", "2"}});
    CHECK(c.world_size == 2);
    check_one_warning(c, "WORLD_SIZE='0'", "integer >= 1");
}

TEST_CASE("the trace file is named after the rank when known, else the pid") {
    Config c;
    CHECK(trace_file_name(c, 4321) == "pid4321.trace");
    c.rank = 0;
    CHECK(trace_file_name(c, 4321) == "rank0.trace");
    c.rank = 17;
    CHECK(trace_file_name(c, 4321) == "rank17.trace");
    CHECK(trace_file_name(parse({{"SLURM_PROCID", "9"}}), 1) == "rank9.trace");
    CHECK(trace_file_name(parse({{"RANK", "bad"}}), 77) == "pid77.trace");
}

// ------------------------------------------------------------ the table

TEST_CASE("every variable of the table has its documented default when unset") {
    const Config c = parse({});
    for (const ConfigVariable& v : kConfigVariables) {
        CAPTURE(v.name);
        const std::optional<std::string> value = config_value(c, v.name);
        REQUIRE(value.has_value());
        if (v.name == "ALLOCSCOPE_HOST") {
            CHECK(*value == host_name());  // computed: the machine's name
        } else {
            CHECK(*value == v.default_value);
        }
        CHECK_FALSE(v.doc.empty());
        CHECK_FALSE(v.read.empty());
    }
}

TEST_CASE("a name outside the table has no value") {
    CHECK_FALSE(config_value(parse({}), "ALLOCSCOPE_UNKNOWN").has_value());
    CHECK_FALSE(config_value(parse({}), "RANK").has_value());
    CHECK(find_config_variable("ALLOCSCOPE_UNKNOWN") == nullptr);
    CHECK(find_config_variable("ALLOCSCOPE_LOG") != nullptr);
}

TEST_CASE("every variable of the table reads its value from the environment") {
    // One set value per kind, and the text config_value gives back for it.
    const std::map<ConfigKind, std::pair<std::string, std::string>> set_value{
        {ConfigKind::flag, {"yes", "1"}},
        {ConfigKind::stack_depth, {"7", "7"}},
        {ConfigKind::log_level, {"debug", "debug"}},
        {ConfigKind::path, {"/some/path", "/some/path"}},
        {ConfigKind::text, {"node-3", "node-3"}},
        {ConfigKind::plugin_list, {"peak,leaks", "peak,leaks"}},
        {ConfigKind::plugin_options, {"peak.top=3", "peak.top=3"}},
        {ConfigKind::size, {"1M", "1048576"}},
        {ConfigKind::steps, {"first=2, every=10", "first=2,every=10,window=2"}},
    };
    for (const ConfigVariable& v : kConfigVariables) {
        CAPTURE(v.name);
        const auto& [text, parsed] = set_value.at(v.kind);
        const Config c = parse({{std::string(v.name), text}});
        CHECK(c.warnings.empty());
        CHECK(config_value(c, v.name) == parsed);
    }
}

TEST_CASE(
    "switches of every reader take 1/true/yes and 0/false/no, keep their default when empty, and "
    "warn on anything else") {
    for (const ConfigVariable& v : kConfigVariables) {
        if (v.kind != ConfigKind::flag) continue;
        CAPTURE(v.name);
        for (const char* on : {"1", "true", "yes"})
            CHECK(config_value(parse({{std::string(v.name), on}}), v.name) == "1");
        for (const char* off : {"0", "false", "no"})
            CHECK(config_value(parse({{std::string(v.name), off}}), v.name) == "0");
        CHECK(config_value(parse({{std::string(v.name), ""}}), v.name) == v.default_value);
        const Config bad = parse({{std::string(v.name), "on"}});
        check_one_warning(bad, std::string(v.name), "1, 0, true, false, yes, no");
        CHECK(config_value(bad, v.name) == v.default_value);
    }
}

TEST_CASE("ALLOCSCOPE_PROVENANCE_STEPS is all, or first, every and window") {
    CHECK(parse({{"ALLOCSCOPE_PROVENANCE_STEPS", "all"}}).provenance_steps ==
          ProvenanceSteps{0, 0, 0});
    CHECK(parse({{"ALLOCSCOPE_PROVENANCE_STEPS", "first=1,every=0"}}).provenance_steps ==
          ProvenanceSteps{1, 0, 0});
    CHECK(parse({{"ALLOCSCOPE_PROVENANCE_STEPS", "window=5,every=50"}}).provenance_steps ==
          ProvenanceSteps{4, 50, 5});
    CHECK(parse({{"ALLOCSCOPE_PROVENANCE_STEPS", ""}}).warnings.empty());
    for (const char* bad : {"first=0", "every=3,window=4", "first=x", "first=1,first=2", "some"}) {
        CAPTURE(bad);
        const Config c = parse({{"ALLOCSCOPE_PROVENANCE_STEPS", bad}});
        CHECK(c.provenance_steps == ProvenanceSteps{});
        check_one_warning(c, "ALLOCSCOPE_PROVENANCE_STEPS", "first=N[,every=N[,window=N]]");
    }
}

TEST_CASE("the markdown table has one row per variable, with its scope, default and reader") {
    const std::string md = config_markdown();
    size_t rows = 0;
    for (size_t at = 0; (at = md.find("\n| `ALLOCSCOPE_", at)) != std::string::npos; ++at)
        ++rows;
    CHECK(rows == kConfigVariables.size() + kHarnessConfigVariables.size());
    CHECK(contains(md, "| `ALLOCSCOPE_STACK_DEPTH` | allocscope | `24` | "));
    CHECK(contains(md, "| `ALLOCSCOPE_HOST` | allocscope | the machine's name | "));
    CHECK(contains(md, "| `ALLOCSCOPE_SIM_DEVICES` | harness | `2` | "));
    CHECK(contains(md, "`ALLOCSCOPE_TORCH_BRIDGE`"));
    CHECK(contains(md, "`ALLOCSCOPE_CUDA_DRIVER_LIB`"));
}

TEST_CASE("the harness's variables are documented with scope harness and are not allocscope's") {
    REQUIRE_FALSE(kHarnessConfigVariables.empty());
    const std::string md = config_markdown();
    for (const ConfigVariable& v : kHarnessConfigVariables) {
        CAPTURE(v.name);
        CHECK(v.scope == ConfigScope::harness);
        CHECK(contains(md, "| `" + std::string(v.name) + "` | harness | "));
        CHECK_FALSE(v.doc.empty());
        CHECK_FALSE(v.read.empty());
        // liballocscope.so neither answers for them nor warns about them.
        CHECK(find_config_variable(v.name) == nullptr);
        const Config c = parse({{std::string(v.name), "not a value of allocscope's"}});
        CHECK(c.warnings.empty());
        CHECK_FALSE(config_value(c, v.name).has_value());
    }
    for (const ConfigVariable& v : kConfigVariables) {
        CAPTURE(v.name);
        CHECK(v.scope == ConfigScope::allocscope);
    }
}

TEST_CASE("the stack depth's documented limit is the parser's") {
    const ConfigVariable* depth = find_config_variable("ALLOCSCOPE_STACK_DEPTH");
    REQUIRE(depth != nullptr);
    CHECK(contains(std::string(depth->doc),
                   "at most `" + std::to_string(Config::kMaxStackDepth) + "`"));
    CHECK(depth->default_value == std::to_string(Config::kDefaultStackDepth));
}
