// ALLOCSCOPE_* configuration, parsed once into a plain struct.
//
// A bad value never stops the traced program: parse_config() records one
// warning line naming the variable and the accepted values, and that setting
// keeps its default.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace allocscope {

enum class LogLevel { quiet, info, debug };

// Plugin options, "<plugin>.<key>" -> value.
using PluginOptions = std::map<std::string, std::string>;

// ALLOCSCOPE_PROVENANCE_STEPS: the first `first` steps (0: every step),
// then `window` in every `every` (0: none after the first).
struct ProvenanceSteps {
    uint64_t first = 4;
    uint64_t every = 100;
    uint64_t window = 2;
    bool operator==(const ProvenanceSteps&) const = default;
};

// One field per variable of config_table.h (its MEMBER), with the table's
// default; tests/config_test.cpp checks that the two agree.
struct Config {
    static constexpr uint32_t kDefaultStackDepth = 24;
    static constexpr uint32_t kMaxStackDepth = 128;

    std::string out_dir = "./allocscope-out";   // ALLOCSCOPE_OUT
    uint32_t stack_depth = kDefaultStackDepth;  // ALLOCSCOPE_STACK_DEPTH, 0 = off
    std::vector<std::string> plugins;           // ALLOCSCOPE_PLUGINS (empty = default set)
    bool plugins_off = false;                   // ALLOCSCOPE_PLUGINS=none
    PluginOptions plugin_options;               // ALLOCSCOPE_PLUGIN_OPTIONS
    std::string plugin_dir;                     // ALLOCSCOPE_PLUGIN_DIR ("" = found by the host)
    LogLevel log = LogLevel::info;              // ALLOCSCOPE_LOG
    bool disabled = false;                      // ALLOCSCOPE_DISABLE
    bool driver_hooks = true;                   // ALLOCSCOPE_DRIVER_HOOKS
    bool walk_cycles = false;      // ALLOCSCOPE_WALK_CYCLES (with ALLOCSCOPE_LOG=debug)
    bool sigterm = true;           // ALLOCSCOPE_SIGTERM: finish the trace on SIGTERM
    int32_t rank = -1;             // RANK, else OMPI_COMM_WORLD_RANK, else SLURM_PROCID
    int32_t world_size = -1;       // WORLD_SIZE, else OMPI_COMM_WORLD_SIZE, else SLURM_NTASKS
    std::string host;              // ALLOCSCOPE_HOST, else the machine's name (host_name())
    uint64_t max_trace_bytes = 0;  // ALLOCSCOPE_MAX_TRACE_SIZE (core/trace_bound.h), 0 = no bound
    std::string cuda_driver_lib;   // ALLOCSCOPE_CUDA_DRIVER_LIB ("" = libcuda.so.1)

    // Read by the Python package and the PyTorch bridge (allocscope_config_get).
    bool python = false;               // ALLOCSCOPE_PYTHON
    bool python_modules = true;        // ALLOCSCOPE_PYTHON_MODULES
    bool python_backward = true;       // ALLOCSCOPE_PYTHON_BACKWARD
    bool bridge_hooks = true;          // ALLOCSCOPE_BRIDGE_HOOKS
    bool torch_blocks = true;          // ALLOCSCOPE_TORCH_BLOCKS
    std::string torch_bridge;          // ALLOCSCOPE_TORCH_BRIDGE ("" = found next to the library)
    bool provenance = true;            // ALLOCSCOPE_PROVENANCE
    ProvenanceSteps provenance_steps;  // ALLOCSCOPE_PROVENANCE_STEPS
    bool provenance_gate = true;       // ALLOCSCOPE_PROVENANCE_GATE
    bool python_stacks = true;         // ALLOCSCOPE_PYTHON_STACKS

    // Read by the allocscope command.
    std::string lib;     // ALLOCSCOPE_LIB ("" = the bundled one)
    std::string duckdb;  // ALLOCSCOPE_DUCKDB ("" = libduckdb.so on the search path)

    std::vector<std::string> warnings;  // one line each, "allocscope: ..." prefixed
};

using EnvLookup = std::function<const char*(const char*)>;

Config parse_config(const EnvLookup& getenv_fn);

// The text of `name`'s value in `config` (config_table.h): switches "1" or
// "0", numbers in decimal, lists comma-separated ("none" for plugins that
// are off), ALLOCSCOPE_PROVENANCE_STEPS as "all" or
// "first=F,every=E,window=W". nullopt when `name` is not in the table.
std::optional<std::string> config_value(const Config& config, std::string_view name);

// docs/ENVIRONMENT.md's table (`allocscope config --markdown`): allocscope's
// variables, then the harness's, with a column saying which.
std::string config_markdown();

// Parses ALLOCSCOPE_PROVENANCE_STEPS (`allocscope run --provenance-steps`):
// "all" (every step), or "first=N[,every=N[,window=N]]", each key once,
// first >= 1, window from 1 to every when every > 0 (the defaults fill what
// is not given). On failure returns false with `problem` saying why.
bool parse_provenance_steps(std::string_view text, ProvenanceSteps& steps, std::string& problem);

// A yes/no variable: 1/true/yes, 0/false/no or empty; nullopt otherwise.
std::optional<bool> parse_switch(std::string_view value) noexcept;

// Parses a plugin list (ALLOCSCOPE_PLUGINS, --plugins): comma-separated
// names or paths, no empty entries; "none" alone sets `off`. On failure
// returns false and sets `problem`.
bool parse_plugin_list(std::string_view text, std::vector<std::string>& entries, bool& off,
                       std::string& problem);

// Parses one "<plugin>.<key>=<value>" (plugin [a-z0-9-]+; key non-empty,
// without '=' or ','; value without ',', may be empty) into key
// "<plugin>.<key>" and value. On failure returns false and sets `error` to
// what is wrong with it.
bool parse_plugin_option(std::string_view entry, std::string& key, std::string& value,
                         std::string& error);

// Parses a comma-separated list of "<plugin>.<key>=<value>"
// (ALLOCSCOPE_PLUGIN_OPTIONS, a check's options); "" is no option. On
// failure returns false with `problem` naming the bad entry.
bool parse_plugin_options(std::string_view text, PluginOptions& options, std::string& problem);

// The machine's name (gethostname), at most kMaxHostBytes; "" where it
// cannot be had.
std::string host_name();

// The extension of every trace file name.
inline constexpr std::string_view kTraceExtension = ".trace";

// "rank<R>.trace" when the rank is known, else "pid<PID>.trace".
std::string trace_file_name(const Config& config, uint32_t pid);

// `name` without its kTraceExtension ("rank0" of "rank0.trace"); `name` as
// it is when it does not end in one or is nothing else.
std::string_view trace_stem(std::string_view name) noexcept;

}  // namespace allocscope
