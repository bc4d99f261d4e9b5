#include "config.h"

#include <unistd.h>

#include <charconv>
#include <string_view>

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

Config parse_config(const EnvLookup& env) {
    Config c;
    auto flag = [&](const char* name, bool& out) {
        const char* v = env(name);
        if (!v) return;
        if (std::optional<bool> b = parse_switch(v)) {
            out = *b;
        } else {
            c.warnings.push_back(std::string("allocscope: ignoring ") + name + "='" + shown(v) +
                                 "': accepted values are 1, 0, true, false, yes, no");
        }
    };
    flag("ALLOCSCOPE_DISABLE", c.disabled);
    flag("ALLOCSCOPE_DRIVER_HOOKS", c.driver_hooks);
    flag("ALLOCSCOPE_WALK_CYCLES", c.walk_cycles);
    flag("ALLOCSCOPE_SIGTERM", c.sigterm);
    if (const char* v = env("ALLOCSCOPE_OUT")) {
        if (*v) {
            c.out_dir = v;
        } else {
            c.warnings.push_back(
                "allocscope: ignoring empty ALLOCSCOPE_OUT: expected a directory path; using "
                "./allocscope-out");
        }
    }
    if (const char* v = env("ALLOCSCOPE_STACK_DEPTH")) {
        int64_t depth = 0;
        if (parse_int(v, depth) && depth >= 0 && depth <= Config::kMaxStackDepth) {
            c.stack_depth = static_cast<uint32_t>(depth);
        } else {
            c.warnings.push_back(std::string("allocscope: ignoring ALLOCSCOPE_STACK_DEPTH='") +
                                 shown(v) + "': expected an integer from 0 (stacks off) to " +
                                 std::to_string(Config::kMaxStackDepth) + "; using " +
                                 std::to_string(Config::kDefaultStackDepth));
        }
    }
    if (const char* v = env("ALLOCSCOPE_LOG")) {
        std::string_view s(v);
        if (s == "quiet") {
            c.log = LogLevel::quiet;
        } else if (s == "info") {
            c.log = LogLevel::info;
        } else if (s == "debug") {
            c.log = LogLevel::debug;
        } else {
            c.warnings.push_back(std::string("allocscope: ignoring ALLOCSCOPE_LOG='") + shown(v) +
                                 "': accepted values are quiet, info, debug; using info");
        }
    }
    if (const char* v = env("ALLOCSCOPE_PLUGINS")) {
        std::vector<std::string> entries;
        bool off = false;
        std::string problem;
        if (parse_plugin_list(v, entries, off, problem)) {
            c.plugins = std::move(entries);
            c.plugins_off = off;
        } else {
            c.warnings.push_back(std::string("allocscope: ignoring ALLOCSCOPE_PLUGINS='") +
                                 shown(v) + "': " + problem + "; using the default plugins");
        }
    }
    if (const char* v = env("ALLOCSCOPE_PLUGIN_OPTIONS"); v && *v) {
        PluginOptions options;
        std::string problem;
        if (parse_plugin_options(v, options, problem)) {
            c.plugin_options = std::move(options);
        } else {
            c.warnings.push_back(std::string("allocscope: ignoring ALLOCSCOPE_PLUGIN_OPTIONS='") +
                                 shown(v) + "': " + problem +
                                 "; expected a comma-separated list of <plugin>.<key>=<value>; "
                                 "using no options");
        }
    }
    if (const char* v = env("ALLOCSCOPE_PLUGIN_DIR"); v && *v) c.plugin_dir = v;
    c.rank = first_int(env, {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}, 0, c.warnings);
    c.world_size =
        first_int(env, {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}, 1, c.warnings);
    if (const char* v = env("ALLOCSCOPE_MAX_TRACE_SIZE"); v && *v) {
        uint64_t bytes = 0;
        if (!parse_size(v, bytes)) {
            c.warnings.push_back(std::string("allocscope: ignoring ALLOCSCOPE_MAX_TRACE_SIZE='") +
                                 shown(v) +
                                 "': expected a size such as 512M or 2G (K, M, G, T: powers of "
                                 "1024), or 0 for no bound; the trace is not bounded");
        } else if (bytes > 0 && bytes < kMinTraceBound) {
            c.warnings.push_back(std::string("allocscope: ALLOCSCOPE_MAX_TRACE_SIZE='") + shown(v) +
                                 "' is below the smallest bound, 64K: using 64K");
            c.max_trace_bytes = kMinTraceBound;
        } else {
            c.max_trace_bytes = bytes;
        }
    }
    if (const char* v = env("ALLOCSCOPE_HOST"); v && *v) {
        c.host = std::string(v).substr(0, kMaxHostBytes);
    } else {
        c.host = host_name();
    }
    return c;
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
