#include "config.h"

#include <unistd.h>

#include <charconv>
#include <string_view>

#include "config_table.h"
#include "trace_bound.h"
#include "trace_format.h"

namespace allocscope {

namespace {

bool parse_int(std::string_view text, int64_t& value) {
    if (text.empty()) return false;
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    return ec == std::errc() && ptr == text.data() + text.size();
}

bool valid_plugin_entry(std::string_view entry) {
    if (entry.empty()) return false;
    for (char c : entry) {
        if (static_cast<unsigned char>(c) < 0x20) return false;
    }
    return true;
}

// A value echoed in a warning: control characters become '?' so a value
// cannot break the one-line message or drive a terminal; long ones are cut.
std::string shown(std::string_view v) {
    std::string out(v.substr(0, 200));
    for (char& ch : out) {
        if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
    }
    if (v.size() > 200) out += "...";
    return out;
}

bool plugin_name_char(char c) noexcept {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
}

// Reads the first variable of `names` that is set; a malformed value is
// reported and the next source is tried.
int32_t first_int(const EnvLookup& env, std::initializer_list<const char*> names, int64_t min_value,
                  std::vector<std::string>& warnings) {
    for (const char* name : names) {
        const char* v = env(name);
        if (!v) continue;
        int64_t value = 0;
        if (parse_int(v, value) && value >= min_value && value <= INT32_MAX) {
            return static_cast<int32_t>(value);
        }
        warnings.push_back(std::string("allocscope: ignoring ") + name + "='" + shown(v) +
                           "': expected an integer >= " + std::to_string(min_value));
    }
    return -1;
}

}  // namespace

std::optional<bool> parse_switch(std::string_view s) noexcept {
    if (s == "1" || s == "true" || s == "yes") return true;
    if (s.empty() || s == "0" || s == "false" || s == "no") return false;
    return std::nullopt;
}

namespace {

// One reader per ConfigKind: reads variable `name` into `out`; a bad value
// leaves `out` at its default and adds a warning saying what is accepted.

std::string ignoring(const char* name, std::string_view value) {
    return std::string("allocscope: ignoring ") + name + "='" + shown(value) + "'";
}

void read_flag(const char* name, const char* v, bool& out, Config& c) {
    if (!*v) return;  // empty: unset, whatever the default
    if (std::optional<bool> b = parse_switch(v)) {
        out = *b;
    } else {
        c.warnings.push_back(ignoring(name, v) +
                             ": accepted values are 1, 0, true, false, yes, no; using " +
                             (out ? "1" : "0"));
    }
}

void read_stack_depth(const char* name, const char* v, uint32_t& out, Config& c) {
    int64_t depth = 0;
    if (parse_int(v, depth) && depth >= 0 && depth <= Config::kMaxStackDepth) {
        out = static_cast<uint32_t>(depth);
    } else {
        c.warnings.push_back(ignoring(name, v) + ": expected an integer from 0 (stacks off) to " +
                             std::to_string(Config::kMaxStackDepth) + "; using " +
                             std::to_string(out));
    }
}

void read_log_level(const char* name, const char* v, LogLevel& out, Config& c) {
    const std::string_view s(v);
    if (s == "quiet") {
        out = LogLevel::quiet;
    } else if (s == "info") {
        out = LogLevel::info;
    } else if (s == "debug") {
        out = LogLevel::debug;
    } else {
        c.warnings.push_back(ignoring(name, v) +
                             ": accepted values are quiet, info, debug; using info");
    }
}

void read_path(const char* name, const char* v, std::string& out, Config& c) {
    if (*v) {
        out = v;
    } else if (!out.empty()) {
        c.warnings.push_back(std::string("allocscope: ignoring empty ") + name +
                             ": expected a directory path; using " + out);
    }
}

void read_text(const char*, const char* v, std::string& out, Config&) {
    if (*v) out = v;
}

void read_plugin_list(const char* name, const char* v, std::vector<std::string>& out, Config& c) {
    std::vector<std::string> entries;
    bool off = false;
    std::string problem;
    if (parse_plugin_list(v, entries, off, problem)) {
        out = std::move(entries);
        c.plugins_off = off;
    } else {
        c.warnings.push_back(ignoring(name, v) + ": " + problem + "; using the default plugins");
    }
}

void read_plugin_options(const char* name, const char* v, PluginOptions& out, Config& c) {
    if (!*v) return;
    PluginOptions options;
    std::string problem;
    if (parse_plugin_options(v, options, problem)) {
        out = std::move(options);
    } else {
        c.warnings.push_back(ignoring(name, v) + ": " + problem +
                             "; expected a comma-separated list of <plugin>.<key>=<value>; "
                             "using no options");
    }
}

void read_size(const char* name, const char* v, uint64_t& out, Config& c) {
    if (!*v) return;
    uint64_t bytes = 0;
    if (!parse_size(v, bytes)) {
        c.warnings.push_back(ignoring(name, v) +
                             ": expected a size such as 512M or 2G (K, M, G, T: powers of "
                             "1024), or 0 for no bound; the trace is not bounded");
    } else if (bytes > 0 && bytes < kMinTraceBound) {
        c.warnings.push_back(std::string("allocscope: ") + name + "='" + shown(v) +
                             "' is below the smallest bound, 64K: using 64K");
        out = kMinTraceBound;
    } else {
        out = bytes;
    }
}

void read_steps(const char* name, const char* v, ProvenanceSteps& out, Config& c) {
    std::string problem;
    ProvenanceSteps steps;
    if (std::string_view(v).find_first_not_of(" \t") == std::string_view::npos) return;
    if (!parse_provenance_steps(v, steps, problem)) {
        c.warnings.push_back(ignoring(name, v) + ": " + problem +
                             "; accepted: all, or first=N[,every=N[,window=N]] (the default "
                             "first=4,every=100,window=2; every=0: none after the first; window "
                             "at most every); the default is used");
        return;
    }
    out = steps;
}

std::string value_text(const Config&, bool v) {
    return v ? "1" : "0";
}
std::string value_text(const Config&, uint32_t v) {
    return std::to_string(v);
}
std::string value_text(const Config&, uint64_t v) {
    return std::to_string(v);
}
std::string value_text(const Config&, const std::string& v) {
    return v;
}
std::string value_text(const Config&, LogLevel v) {
    return v == LogLevel::quiet ? "quiet" : v == LogLevel::debug ? "debug" : "info";
}
std::string value_text(const Config& c, const std::vector<std::string>& plugins) {
    if (c.plugins_off) return "none";
    std::string out;
    for (const std::string& p : plugins)
        out += (out.empty() ? "" : ",") + p;
    return out;
}
std::string value_text(const Config&, const PluginOptions& options) {
    std::string out;
    for (const auto& [key, value] : options)
        out += (out.empty() ? "" : ",") + key + "=" + value;
    return out;
}
std::string value_text(const Config&, const ProvenanceSteps& s) {
    if (s.first == 0) return "all";
    return "first=" + std::to_string(s.first) + ",every=" + std::to_string(s.every) +
           ",window=" + std::to_string(s.window);
}

}  // namespace

Config parse_config(const EnvLookup& env) {
    Config c;
#define ALLOCSCOPE_CONFIG_READ(NAME, MEMBER, KIND, ...) \
    if (const char* v = env(#NAME)) read_##KIND(#NAME, v, c.MEMBER, c);
    ALLOCSCOPE_CONFIG_TABLE(ALLOCSCOPE_CONFIG_READ)
#undef ALLOCSCOPE_CONFIG_READ
    c.host = c.host.empty() ? host_name() : c.host.substr(0, kMaxHostBytes);
    c.rank = first_int(env, {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}, 0, c.warnings);
    c.world_size =
        first_int(env, {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}, 1, c.warnings);
    return c;
}

std::optional<std::string> config_value(const Config& c, std::string_view name) {
#define ALLOCSCOPE_CONFIG_VALUE(NAME, MEMBER, ...) \
    if (name == #NAME) return value_text(c, c.MEMBER);
    ALLOCSCOPE_CONFIG_TABLE(ALLOCSCOPE_CONFIG_VALUE)
#undef ALLOCSCOPE_CONFIG_VALUE
    return std::nullopt;
}

std::string config_markdown() {
    std::string out =
        "| variable | scope | default | read by | meaning |\n"
        "| --- | --- | --- | --- | --- |\n";
    auto row = [&out](const ConfigVariable& v) {
        const std::string shown_default = !v.shown_default.empty()
                                              ? std::string(v.shown_default)
                                              : "`" + std::string(v.default_value) + "`";
        const char* scope = v.scope == ConfigScope::harness ? "harness" : "allocscope";
        out += "| `" + std::string(v.name) + "` | " + scope + " | " + shown_default + " | " +
               std::string(v.read) + " | " + std::string(v.doc) + " |\n";
    };
    for (const ConfigVariable& v : kConfigVariables)
        row(v);
    for (const ConfigVariable& v : kHarnessConfigVariables)
        row(v);
    return out;
}

bool parse_provenance_steps(std::string_view text, ProvenanceSteps& steps, std::string& problem) {
    auto trim = [](std::string_view s) {
        while (!s.empty() && (s.front() == ' ' || s.front() == '\t'))
            s.remove_prefix(1);
        while (!s.empty() && (s.back() == ' ' || s.back() == '\t'))
            s.remove_suffix(1);
        return s;
    };
    std::string lower(trim(text));
    for (char& ch : lower)
        if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
    if (lower == "all") {
        steps = {0, 0, 0};
        return true;
    }
    uint64_t values[3] = {ProvenanceSteps{}.first, ProvenanceSteps{}.every,
                          ProvenanceSteps{}.window};
    bool seen[3] = {false, false, false};
    static constexpr std::string_view kKeys[] = {"first", "every", "window"};
    std::string_view rest = lower;
    for (;;) {
        const size_t comma = rest.find(',');
        const std::string_view part = trim(rest.substr(0, comma));
        const size_t eq = part.find('=');
        const std::string_view key = trim(part.substr(0, eq));
        size_t k = 0;
        while (k < 3 && kKeys[k] != key)
            ++k;
        if (eq == std::string_view::npos || k == 3 || seen[k]) {
            problem =
                "'" + shown(part) + "' is not a key=value of first, every or window, each once";
            return false;
        }
        seen[k] = true;
        const std::string_view value = trim(part.substr(eq + 1));
        int64_t n = 0;
        if (value.empty() || value.size() > 12 ||
            value.find_first_not_of("0123456789") != std::string_view::npos ||
            !parse_int(value, n)) {
            problem = std::string(key) + "='" + shown(value) + "' is not a whole number";
            return false;
        }
        values[k] = static_cast<uint64_t>(n);
        if (comma == std::string_view::npos) break;
        rest.remove_prefix(comma + 1);
    }
    if (values[0] < 1) {
        problem = "first must be at least 1 (all observes every step)";
        return false;
    }
    if (values[1] > 0 && (values[2] < 1 || values[2] > values[1])) {
        problem = "window must be from 1 to every (" + std::to_string(values[1]) + "), got " +
                  std::to_string(values[2]);
        return false;
    }
    steps = {values[0], values[1], values[1] > 0 ? values[2] : 0};
    return true;
}

std::string host_name() {
    char name[kMaxHostBytes + 1] = {};
    if (gethostname(name, sizeof name - 1) != 0) return {};
    return name;
}

bool parse_plugin_options(std::string_view text, PluginOptions& options, std::string& problem) {
    options.clear();
    if (text.empty()) return true;
    for (;;) {
        const size_t comma = text.find(',');
        std::string key, value;
        if (!parse_plugin_option(text.substr(0, comma), key, value, problem)) return false;
        options[key] = value;
        if (comma == std::string_view::npos) return true;
        text.remove_prefix(comma + 1);
    }
}

bool parse_plugin_list(std::string_view text, std::vector<std::string>& entries, bool& off,
                       std::string& problem) {
    std::vector<std::string> out;
    for (;;) {
        size_t comma = text.find(',');
        std::string_view entry = text.substr(0, comma);
        if (!valid_plugin_entry(entry)) {
            problem = "expected a comma-separated list of plugin names or paths (no empty entries)";
            return false;
        }
        out.emplace_back(entry);
        if (comma == std::string_view::npos) break;
        text.remove_prefix(comma + 1);
    }
    bool none = false;
    for (const std::string& e : out)
        none = none || e == "none";
    if (none && out.size() > 1) {
        problem = "'none' turns plugins off and cannot be combined with other entries";
        return false;
    }
    off = none;
    entries.clear();
    if (!none) entries = std::move(out);
    return true;
}

bool parse_plugin_option(std::string_view entry, std::string& key, std::string& value,
                         std::string& error) {
    const size_t eq = entry.find('=');
    const size_t dot = entry.substr(0, eq).find('.');
    if (eq == std::string_view::npos || dot == std::string_view::npos) {
        error = "'" + shown(entry) + "' is not <plugin>.<key>=<value>";
        return false;
    }
    const std::string_view name = entry.substr(0, dot);
    const std::string_view k = entry.substr(dot + 1, eq - dot - 1);
    const std::string_view val = entry.substr(eq + 1);
    bool name_ok = !name.empty();
    for (char c : name)
        name_ok = name_ok && plugin_name_char(c);
    if (!name_ok) {
        error = "'" + shown(entry) + "': plugin names are made of a-z, 0-9 and '-'";
        return false;
    }
    if (k.empty()) {
        error = "'" + shown(entry) + "' has an empty key";
        return false;
    }
    for (std::string_view part : {k, val}) {
        for (char c : part) {
            if (c == ',' || static_cast<unsigned char>(c) < 0x20) {
                error = "'" + shown(entry) +
                        "': keys and values cannot hold ',' or "
                        "control characters";
                return false;
            }
        }
    }
    key = std::string(name) + "." + std::string(k);
    value = std::string(val);
    return true;
}

std::string trace_file_name(const Config& config, uint32_t pid) {
    const std::string_view ext = kTraceExtension;
    if (config.rank >= 0) return "rank" + std::to_string(config.rank) + std::string(ext);
    return "pid" + std::to_string(pid) + std::string(ext);
}

std::string_view trace_stem(std::string_view name) noexcept {
    if (name.size() > kTraceExtension.size() && name.ends_with(kTraceExtension))
        name.remove_suffix(kTraceExtension.size());
    return name;
}

}  // namespace allocscope
