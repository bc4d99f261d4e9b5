#include "config.h"

#include <charconv>
#include <string_view>

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
        warnings.push_back(std::string("allocscope: ignoring ") + name + "='" + v +
                           "': expected an integer >= " + std::to_string(min_value));
    }
    return -1;
}

}  // namespace

Config parse_config(const EnvLookup& env) {
    Config c;
    if (const char* v = env("ALLOCSCOPE_DISABLE")) {
        std::string_view s(v);
        if (s == "1" || s == "true" || s == "yes") {
            c.disabled = true;
        } else if (!(s.empty() || s == "0" || s == "false" || s == "no")) {
            c.warnings.push_back(std::string("allocscope: ignoring ALLOCSCOPE_DISABLE='") + v +
                                 "': accepted values are 1, 0, true, false, yes, no");
        }
    }
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
            c.warnings.push_back(std::string("allocscope: ignoring ALLOCSCOPE_STACK_DEPTH='") + v +
                                 "': expected an integer from 0 (stacks off) to " +
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
            c.warnings.push_back(std::string("allocscope: ignoring ALLOCSCOPE_LOG='") + v +
                                 "': accepted values are quiet, info, debug; using info");
        }
    }
    if (const char* v = env("ALLOCSCOPE_PLUGINS")) {
        std::string_view s(v);
        std::vector<std::string> entries;
        bool ok = true;
        while (ok) {
            size_t comma = s.find(',');
            std::string_view entry = s.substr(0, comma);
            if (!valid_plugin_entry(entry)) ok = false;
            entries.emplace_back(entry);
            if (comma == std::string_view::npos) break;
            s.remove_prefix(comma + 1);
        }
        if (ok) {
            c.plugins = std::move(entries);
        } else {
            c.warnings.push_back(std::string("allocscope: ignoring ALLOCSCOPE_PLUGINS='") + v +
                                 "': expected a comma-separated list of plugin names or paths "
                                 "(no empty entries); using the default plugins");
        }
    }
    c.rank = first_int(env, {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}, 0, c.warnings);
    c.world_size =
        first_int(env, {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"}, 1, c.warnings);
    return c;
}

std::string trace_file_name(const Config& config, uint32_t pid) {
    if (config.rank >= 0) return "rank" + std::to_string(config.rank) + ".trace";
    return "pid" + std::to_string(pid) + ".trace";
}

}  // namespace allocscope
