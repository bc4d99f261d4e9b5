// Findings files (core/findings.h, analyze/findings_reader.h): escaping, the strict reader,
// merging, and the plugin settings of core/config.h.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "config.h"
#include "findings.h"
#include "findings_reader.h"

namespace fs = std::filesystem;
using namespace allocscope;

namespace {

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

Finding make(const std::string& plugin, Severity sev, int32_t rank, const std::string& layer) {
    Finding f;
    f.plugin = plugin;
    f.severity = sev;
    f.rank = rank;
    f.layer = layer;
    f.phase = "forward";
    f.bytes = 51200;
    f.count = 3;
    f.summary = plugin + " on " + layer;
    f.evidence.push_back({512, layer, "forward", 2, 17, 0, 4, ""});
    f.evidence.push_back({1024, layer, "forward/quantize", 2, 18, 40, 0, ""});
    return f;
}

FindingsFile one_rank(int32_t rank, const std::string& trace, std::vector<Finding> findings) {
    FindingsFile f;
    f.findings = std::move(findings);
    f.ranks.push_back({rank,
                       trace,
                       {"a", "b"},
                       {{"c", "init returned an error"}},
                       "off: the bridge is not built"});
    return f;
}

std::string parse_error(const std::string& text) {
    try {
        parse_findings(text, "f.json");
    } catch (const FindingsError& e) {
        return e.what();
    }
    return "(parsed)";
}

Config parse(const std::map<std::string, std::string>& env) {
    return parse_config([&env](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
    });
}

}  // namespace

TEST_CASE("strings from the trace are escaped so they cannot break JSON or an HTML page") {
    const std::string nasty = std::string("a\"b\\c\x01\x1f\n\r\t") +
                              "</script><script>alert(1)</script>&" + "\x7f" + "\xe2\x80\xa8" +
                              "\xff" + "ok\xc3\xa9";
    const std::string q = json_quote(nasty);
    CHECK(q ==
          "\"a\\\"b\\\\c\\u0001\\u001f\\n\\r\\t\\u003c/script\\u003e\\u003cscript\\u003ealert(1)"
          "\\u003c/script\\u003e\\u0026\\u007f\\u2028\\ufffdok\xc3\xa9\"");
    // Nothing raw that an HTML parser or a JSON reader would act on.
    CHECK(q.find('<') == std::string::npos);
    CHECK(q.find('\n') == std::string::npos);

    FindingsFile f;
    Finding x = make("peak-owner", Severity::error, 0, nasty);
    x.summary = nasty;
    f.findings.push_back(x);
    f.ranks.push_back({0, nasty, {"peak-owner"}, {{nasty, nasty}}, nasty});
    const std::string json = to_json(f);
    CHECK(json.find('<') == std::string::npos);
    CHECK(json.find('\x01') == std::string::npos);
    // Round trip: what was valid UTF-8 comes back unchanged; the stray 0xff
    // byte became U+FFFD.
    FindingsFile back = parse_findings(json, "mem");
    std::string expected = nasty;
    expected.replace(expected.find('\xff'), 1, "\xef\xbf\xbd");
    REQUIRE(back.findings.size() == 1);
    CHECK(back.findings[0].layer == expected);
    CHECK(back.findings[0].summary == expected);
    CHECK(back.findings[0].evidence[0].layer == expected);
    CHECK(back.ranks[0].trace == expected);
    CHECK(back.ranks[0].disabled[0].reason == expected);
}

TEST_CASE("a findings file round-trips with every field and large numbers") {
    FindingsFile f = one_rank(3, "rank3.trace",
                              {make("weight-copy-accumulation", Severity::warning, 3, "layers.3"),
                               make("peak-owner", Severity::info, 3, "")});
    f.findings[0].bytes = UINT64_MAX;
    f.findings[0].evidence[0].alloc_seq = UINT64_MAX - 1;
    f.findings[0].evidence[0].stack_id = UINT32_MAX;
    f.findings[1].evidence.clear();
    f.findings[0].basis = "proven";
    f.findings[0].evidence[1].note = "derived from layers.3.fc1.weight: abs -> amax -> _to_copy";
    f.ranks.push_back({-1, "pid7.trace", {}, {}, ""});
    Finding unranked = make("peak-owner", Severity::info, -1, "");
    unranked.pid = 7;  // a process without a rank is named by its pid
    f.findings.push_back(unranked);
    const std::string json = to_json(f);
    CHECK(contains(json, "\"rank\": -1, \"pid\": 7,"));
    CHECK(parse_findings(json, "mem") == f);
    CHECK(contains(json, "\"basis\": \"proven\""));
    CHECK(contains(json, "\"note\": \"derived from layers.3.fc1.weight"));
    // Written only when set: a finding without them reads back without them.
    CHECK(!contains(to_json(one_rank(0, "r.trace", {make("p", Severity::info, 0, "l")})),
                    "\"basis\""));
    CHECK(contains(json, "\"severity\": \"warning\""));
    CHECK(contains(json, "\"version\": 1"));
    CHECK(contains(json, "\"bytes\": 18446744073709551615"));
    CHECK(contains(json, "\"rank\": -1"));
    CHECK(parse_findings(to_json(FindingsFile{}), "mem") == FindingsFile{});

    const fs::path dir = fs::temp_directory_path() / ("findings-test-" + std::to_string(getpid()));
    fs::create_directories(dir);
    write_findings_file((dir / "f.json").string(), f);
    CHECK(read_findings_file((dir / "f.json").string()) == f);
    CHECK((fs::status(dir / "f.json").permissions() & fs::perms::all) ==
          (fs::perms::owner_read | fs::perms::owner_write));
    // Nothing but the file is left behind.
    CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);
    CHECK_THROWS_WITH_AS(write_findings_file((dir / "no" / "such" / "f.json").string(), f),
                         doctest::Contains("cannot write"), FindingsError);
    fs::remove_all(dir);
}

TEST_CASE("a corrupt or foreign findings file gives one error with line and column") {
    CHECK(parse_error("") == "f.json: line 1, column 1: unexpected end of the file");
    CHECK(parse_error("{\"findings\": [], \"ranks\": []") ==
          "f.json: line 1, column 29: expected ',' or '}' in an object");
    CHECK(parse_error("{\"findings\": [],\n \"ranks\": [] } x") ==
          "f.json: line 2, column 16: unexpected text after the JSON document");
    CHECK(contains(parse_error("{\"findings\": {}, \"ranks\": []}"),
                   "\"findings\" must be an array, not an object"));
    CHECK(contains(parse_error("{\"ranks\": []}"), "the document lacks \"findings\""));
    CHECK(contains(parse_error("{\"findings\": [], \"ranks\": [], \"findings\": []}"),
                   "duplicate member \"findings\""));
    CHECK(contains(parse_error("{\"findings\": [], \"ranks\": [], \"extra\": 1}"),
                   "unknown member \"extra\""));
    CHECK(contains(parse_error("{\"version\": 2, \"findings\": [], \"ranks\": []}"),
                   "unsupported findings format version 2"));

    FindingsFile good = one_rank(0, "rank0.trace", {make("p", Severity::error, 0, "l")});
    const std::string json = to_json(good);
    auto with = [&json](const std::string& from, const std::string& to) {
        std::string s = json;
        const size_t at = s.find(from);
        REQUIRE(at != std::string::npos);
        s.replace(at, from.size(), to);
        return parse_error(s);
    };
    CHECK(contains(with("\"severity\": \"error\"", "\"severity\": \"fatal\""),
                   "finding 1: \"severity\" must be info, warning or error, not \"fatal\""));
    CHECK(contains(with("\"bytes\": 51200", "\"bytes\": -1"),
                   "finding 1: \"bytes\" must be an unsigned 64-bit integer"));
    CHECK(contains(with("\"bytes\": 51200", "\"bytes\": 1.5"), "\"bytes\" must be an unsigned"));
    CHECK(contains(with("\"bytes\": 51200", "\"bytes\": 18446744073709551616"),
                   "\"bytes\" must be an unsigned"));
    CHECK(contains(with("\"rank\": 0,", "\"rank\": -2,"), "\"rank\" must be an integer >= -1"));
    CHECK(contains(with("\"rank\": 0,", "\"rank\": 0, \"pid\": 7,"),
                   "\"pid\" must be a process id > 0, and only without a rank"));
    CHECK(contains(with("\"rank\": 0,", "\"rank\": -1, \"pid\": 0,"),
                   "\"pid\" must be a process id"));
    CHECK(contains(with("\"stack_id\": 4", "\"stack_id\": 4294967296"), "must fit in 32 bits"));
    CHECK(contains(with("\"summary\": \"p on l\"", "\"summary\": \"a\x01\""),
                   "control character inside a string"));
    CHECK(contains(with("\"summary\": \"p on l\"", "\"summary\": \"\\ud800\""),
                   "unpaired surrogate"));
    CHECK(contains(with("\"summary\": \"p on l\"", "\"summary\": \"\xc0\xaf\""), "invalid UTF-8"));
    CHECK(contains(with("\"summary\": \"p on l\"", "\"summary\": \"\\x\""), "invalid escape"));
    CHECK(contains(with("\"size\": 512, ", ""), "finding 1, evidence 1 lacks \"size\""));
    CHECK(contains(with("\"summary\": \"p on l\"", "\"summary\": \"p on l\", \"basis\": 3"),
                   "finding 1: \"basis\" must be a string"));
    // Escapes the writer never produces are still read.
    FindingsFile back = parse_findings(
        std::string(json).replace(json.find("\"p on l\""), 8, "\"\\ud83d\\ude00\\/\\u00e9\""),
        "mem");
    CHECK(back.findings[0].summary == "\xf0\x9f\x98\x80/\xc3\xa9");

    std::string deep(100, '[');
    CHECK(contains(parse_error(deep), "nested too deeply"));
    CHECK_THROWS_WITH_AS(read_findings_file("/nonexistent/findings.json"),
                         doctest::Contains("/nonexistent/findings.json: cannot open"),
                         FindingsError);
}

TEST_CASE(
    "merging orders ranks numerically, rankless processes last, and keeps each file's order") {
    std::vector<FindingsFile> files = {
        one_rank(-1, "pid9.trace", {make("x", Severity::info, -1, "p")}),
        one_rank(10, "rank10.trace", {make("x", Severity::error, 10, "a")}),
        one_rank(2, "rank2.trace",
                 {make("y", Severity::warning, 2, "b"), make("x", Severity::info, 2, "c")}),
        one_rank(2, "rank2.pid5.trace", {make("x", Severity::info, 2, "d")}),
    };
    FindingsFile m = merge_findings(files);
    std::vector<std::string> order;
    for (const Finding& f : m.findings)
        order.push_back(std::to_string(f.rank) + f.layer);
    CHECK(order == std::vector<std::string>{"2d", "2b", "2c", "10a", "-1p"});
    REQUIRE(m.ranks.size() == 4);
    CHECK(m.ranks[0].trace == "rank2.pid5.trace");
    CHECK(m.ranks[3].trace == "pid9.trace");

    CHECK(count_at_least(m, Severity::info) == 5);
    CHECK(count_at_least(m, Severity::warning) == 2);
    CHECK(count_at_least(m, Severity::error) == 1);
}

TEST_CASE(
    "a summary line names severity, plugin, rank (or pid), where, bytes and never drives the "
    "terminal") {
    Finding f = make("weight-copy-accumulation", Severity::error, 1, "layers.\x1b[2J3");
    f.summary = "2 FP8 copies\nretained";
    CHECK(summary_line(f) ==
          "error   weight-copy-accumulation  rank 1  layers.?[2J3/forward  50.0 KiB  2 FP8 "
          "copies?retained");
    f.rank = -1;
    f.layer = "";
    f.phase = "";
    f.bytes = 100;
    CHECK(summary_line(f).rfind("error   weight-copy-accumulation  no rank  -  100 B  ", 0) == 0);
    f.pid = 4242;
    CHECK(summary_line(f).rfind("error   weight-copy-accumulation  pid 4242  -  100 B  ", 0) == 0);
    CHECK(human_bytes(1536) == "1.50 KiB");
    CHECK(human_bytes(uint64_t{3} << 30) == "3.00 GiB");
    CHECK(parse_severity("warning") == Severity::warning);
    CHECK_FALSE(parse_severity("Warning").has_value());
}

TEST_CASE("ALLOCSCOPE_PLUGINS=none, ALLOCSCOPE_PLUGIN_OPTIONS and ALLOCSCOPE_PLUGIN_DIR") {
    Config off = parse({{"ALLOCSCOPE_PLUGINS", "none"}});
    CHECK(off.plugins_off);
    CHECK(off.plugins.empty());
    CHECK(off.warnings.empty());

    Config mixed = parse({{"ALLOCSCOPE_PLUGINS", "none,peak-owner"}});
    CHECK_FALSE(mixed.plugins_off);
    CHECK(mixed.plugins.empty());
    REQUIRE(mixed.warnings.size() == 1);
    CHECK(contains(mixed.warnings[0], "ALLOCSCOPE_PLUGINS"));
    CHECK(contains(mixed.warnings[0], "cannot be combined"));

    Config opts = parse({{"ALLOCSCOPE_PLUGIN_OPTIONS",
                          "weight-copy-accumulation.forward_budget=50KiB,peak-owner.top=5,"
                          "peak-owner.top=7,x.path=a=b,x.empty="},
                         {"ALLOCSCOPE_PLUGIN_DIR", "/opt/plugins"}});
    CHECK(opts.warnings.empty());
    CHECK(opts.plugin_options == PluginOptions{{"weight-copy-accumulation.forward_budget", "50KiB"},
                                               {"peak-owner.top", "7"},
                                               {"x.path", "a=b"},
                                               {"x.empty", ""}});
    CHECK(opts.plugin_dir == "/opt/plugins");

    for (const char* bad : {"nodot=1", "Upper.k=1", "x.=1", "x.k", "x.k=1,,y.k=2", ".k=1"}) {
        CAPTURE(bad);
        Config c = parse({{"ALLOCSCOPE_PLUGIN_OPTIONS", bad}});
        CHECK(c.plugin_options.empty());
        REQUIRE(c.warnings.size() == 1);
        CHECK(c.warnings[0].rfind("allocscope: ignoring ALLOCSCOPE_PLUGIN_OPTIONS='", 0) == 0);
        CHECK(contains(c.warnings[0], "<plugin>.<key>=<value>"));
        CHECK(c.warnings[0].find('\n') == std::string::npos);
    }
}
