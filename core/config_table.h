// Every ALLOCSCOPE_* environment variable, declared once: allocscope's own,
// and after them the harness's (ALLOCSCOPE_HARNESS_CONFIG_TABLE).
//
// parse_config() (config.cpp) parses the table's variables into Config; the
// CLI's checks of the same values take their limits from it; `allocscope
// config --markdown` prints it as docs/ENVIRONMENT.md (a test keeps that
// file equal to the output); liballocscope.so answers allocscope_config_get()
// (allocscope.h) from it, so the PyTorch bridge and the Python package ask
// for parsed values instead of reading the environment.
//
// X(NAME, MEMBER, KIND, DEFAULT, SHOWN_DEFAULT, READ, DOC)
//   NAME           the variable, without quotes
//   MEMBER         its Config field
//   KIND           how its value is parsed (ConfigKind)
//   DEFAULT        config_value()'s text of the field when the variable is
//                  unset ("" where unset means "none" or "found elsewhere")
//   SHOWN_DEFAULT  the default as the docs say it; "" shows `DEFAULT`
//   READ           who reads it and when (one of the kRead* texts)
//   DOC            what it does, markdown, one paragraph
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

namespace allocscope {

enum class ConfigKind {
    flag,            // 1/true/yes, 0/false/no (parse_switch)
    stack_depth,     // an integer from 0 to Config::kMaxStackDepth
    log_level,       // quiet, info, debug
    path,            // a non-empty path
    text,            // any text
    plugin_list,     // parse_plugin_list
    plugin_options,  // parse_plugin_options
    size,            // parse_size (trace_bound.h), 0 or at least kMinTraceBound
    steps,           // parse_provenance_steps
};

// Who reads a variable, and when. "Asks liballocscope.so": through
// allocscope_config_get(), the value liballocscope.so parsed once.
inline constexpr std::string_view kReadAtStart = "liballocscope.so, once, when first used";
inline constexpr std::string_view kReadByPython =
    "allocscope.torch at `enable()`, asking liballocscope.so";
inline constexpr std::string_view kReadByBridge =
    "the PyTorch bridge when it attaches, asking liballocscope.so";
inline constexpr std::string_view kReadByCli = "the `allocscope` command";
inline constexpr std::string_view kReadAtPythonStart = "`sitecustomize.py`, at Python's start";
inline constexpr std::string_view kReadBySimRuntime =
    "the harness's host-memory CUDA runtime (`harness/sim_cudart`), once, when first used";
inline constexpr std::string_view kReadByHarnessRanks =
    "each rank of the harness (`harness/collective`), at its start";

// clang-format off
#define ALLOCSCOPE_CONFIG_TABLE(X)                                                                 \
    X(ALLOCSCOPE_OUT, out_dir, path, "./allocscope-out", "", kReadAtStart,                          \
      "output directory (created with mode 0700; traces are 0600); `allocscope run --out` sets "    \
      "it")                                                                                         \
    X(ALLOCSCOPE_STACK_DEPTH, stack_depth, stack_depth, "24", "", kReadAtStart,                     \
      "frames captured per allocation, `0` turns stacks off (Python frames included), at most "     \
      "`128`; `allocscope run --stack-depth` sets it")                                              \
    X(ALLOCSCOPE_PLUGINS, plugins, plugin_list, "", "all built-ins", kReadAtStart,                  \
      "comma list of plugin names or paths; `none` turns plugins off (see Detection plugins in "    \
      "USAGE.md); `allocscope run --plugins` sets it")                                              \
    X(ALLOCSCOPE_PLUGIN_OPTIONS, plugin_options, plugin_options, "", "none", kReadAtStart,          \
      "comma list of `<plugin>.<key>=<value>`; `allocscope run --plugin-option` adds to it")        \
    X(ALLOCSCOPE_PLUGIN_DIR, plugin_dir, path, "", "next to the library", kReadAtStart,             \
      "where plugin names are looked up: `<libdir>/allocscope/plugins` installed, "                 \
      "`<build>/plugins` in a build tree; also read by `allocscope run`, `replay` and `check` "     \
      "when they load plugins themselves")                                                          \
    X(ALLOCSCOPE_LOG, log, log_level, "info", "", kReadAtStart,                                     \
      "`quiet` (warnings only), `info` (one line per trace written), `debug` (also what "           \
      "recording cost the program's threads, at exit: stack captures, how many replayed an "        \
      "earlier walk, and their average time; the PyTorch bridge's and Python hooks' calls and "     \
      "time; the CPU time of allocscope's writer thread against the time it recorded)")            \
    X(ALLOCSCOPE_DISABLE, disabled, flag, "0", "", kReadAtStart,                                    \
      "`1` forwards every call and records nothing")                                                \
    X(ALLOCSCOPE_SIGTERM, sigterm, flag, "1", "", kReadAtStart,                                     \
      "a program without a SIGTERM handler of its own finishes its trace and findings on "          \
      "SIGTERM, then dies by SIGTERM as before; `0` leaves SIGTERM alone (the trace is cut, and "   \
      "replayed by `allocscope run`/`check`)")                                                      \
    X(ALLOCSCOPE_DRIVER_HOOKS, driver_hooks, flag, "1", "", kReadAtStart,                           \
      "`0` leaves CUDA driver entry points (`cuMemAlloc_v2`, `cuMemCreate`/`cuMemMap`, ... from "   \
      "`cuGetProcAddress`, `cudaGetDriverEntryPoint*` or `dlsym`) unwrapped")                       \
    X(ALLOCSCOPE_WALK_CYCLES, walk_cycles, flag, "0", "", kReadAtStart,                             \
      "with `ALLOCSCOPE_LOG=debug`: `1` also times each frame of a stack walk (time-stamp "         \
      "counter) and reports the cycles per frame by where its unwind rule came from; slows the "    \
      "walks")                                                                                      \
    X(ALLOCSCOPE_MAX_TRACE_SIZE, max_trace_bytes, size, "0", "none", kReadAtStart,                  \
      "keep each trace within this size (`allocscope run --max-trace-size`; `512M`, `2G`: K, M, "   \
      "G, T are powers of 1024; at least `64K`; `0` for no bound): the first steps (a quarter of "  \
      "it) and the latest are kept, the steps between dropped, and the allocations live and "       \
      "scopes open where the kept steps resume written in their place (see Day-long runs in "       \
      "USAGE.md)")                                                                                  \
    X(ALLOCSCOPE_HOST, host, text, "", "the machine's name", kReadAtStart,                          \
      "the host name each trace records (after its header) and `allocscope run --per-host` names "  \
      "its directory by (`host-<name>`); set it where the machines' own names are not unique; "     \
      "also read by `allocscope run`")                                                              \
    X(ALLOCSCOPE_CUDA_DRIVER_LIB, cuda_driver_lib, path, "", "`libcuda.so.1`", kReadAtStart,        \
      "the CUDA driver library whose entry points the driver hooks forward to when no library "     \
      "after liballocscope.so defines them (a driver of another name, or a simulated one)")         \
    X(ALLOCSCOPE_PYTHON, python, flag, "0", "", kReadAtPythonStart,                                 \
      "`1` (set by `allocscope run` unless `--no-python`) makes `sitecustomize.py` set up "         \
      "`allocscope.torch` when the program imports torch; read from the environment, before "       \
      "anything is asked of liballocscope.so, so that a Python process without torch imports "      \
      "nothing of allocscope")                                                                      \
    X(ALLOCSCOPE_PYTHON_MODULES, python_modules, flag, "1", "", kReadByPython,                      \
      "`0` leaves out the module hooks of `allocscope.torch`: no layer tags (and no provenance, "   \
      "which needs them)")                                                                          \
    X(ALLOCSCOPE_PYTHON_BACKWARD, python_backward, flag, "1", "", kReadByPython,                    \
      "`0` leaves out the tensor hooks that tag backward phases")                                   \
    X(ALLOCSCOPE_BRIDGE_HOOKS, bridge_hooks, flag, "1", "", kReadByPython,                          \
      "`0` makes the tag calls through ctypes instead of the PyTorch bridge's builtins")            \
    X(ALLOCSCOPE_TORCH_BLOCKS, torch_blocks, flag, "1", "", kReadByPython,                          \
      "`0` leaves the PyTorch bridge unattached to the native caching allocator: no per-tensor "    \
      "blocks")                                                                                     \
    X(ALLOCSCOPE_TORCH_BRIDGE, torch_bridge, path, "", "next to the library", kReadByPython,        \
      "the PyTorch bridge library (`liballocscope_torch_bridge.so`) to load; `allocscope run` "     \
      "sets it to the one it finds next to liballocscope.so (`<libdir>/allocscope` installed, "     \
      "`<build>/tools/torch_bridge` in a build tree) unless it is set")                             \
    X(ALLOCSCOPE_PROVENANCE, provenance, flag, "1", "", kReadByPython,                              \
      "the PyTorch bridge's op observer declares weight-derived allocations (see PyTorch, "         \
      "unchanged, in USAGE.md); `0` (`allocscope run --no-provenance`) turns it off")               \
    X(ALLOCSCOPE_PROVENANCE_STEPS, provenance_steps, steps, "first=4,every=100,window=2", "",       \
      kReadByPython,                                                                                \
      "the steps the op observer runs in (`allocscope run --provenance-steps`): `all`, or the "     \
      "first `first` steps, then `window` steps in every `every` (`every=0`: none after the "       \
      "first), counted from the step the shim starts in")                                           \
    X(ALLOCSCOPE_PROVENANCE_GATE, provenance_gate, flag, "1", "", kReadByBridge,                    \
      "`0` keeps the op observer on for every op, not only inside the scopes of layers with "       \
      "parameters (to measure what the gate saves)")                                                \
    X(ALLOCSCOPE_PYTHON_STACKS, python_stacks, flag, "1", "", kReadByBridge,                        \
      "`0` leaves Python frames out of the stacks (`ALLOCSCOPE_STACK_DEPTH=0` does too)")           \
    X(ALLOCSCOPE_LIB, lib, path, "", "bundled", kReadByCli,                                         \
      "for `allocscope run`: the `liballocscope.so` to preload; the Python package also looks "     \
      "for the library already loaded under this path (it cannot ask the library before it has "    \
      "found it)")                                                                                  \
    X(ALLOCSCOPE_DUCKDB, duckdb, path, "", "`libduckdb.so` on the library search path",            \
      kReadByCli,                                                                                   \
      "for `allocscope export --format parquet`: DuckDB's C library (see Parquet: SQL over runs "   \
      "and ranks in USAGE.md)")

// The harness's own variables (scope "harness" in docs/ENVIRONMENT.md): test
// scaffolding of the workload allocscope is tested on, not settings of
// allocscope. Neither liballocscope.so nor the allocscope command reads them
// (parse_config(), config_value() and allocscope_config_get() know only the
// table above); the harness reads them itself, linking nothing of core/.
// They are declared here so that docs/ENVIRONMENT.md lists them beside the
// others; tests/python/config_test.py checks that this list and the
// variables the harness's sources name are the same.
//
// X(NAME, SHOWN_DEFAULT, READ, DOC), as in the table above
#define ALLOCSCOPE_HARNESS_CONFIG_TABLE(X)                                                         \
    X(ALLOCSCOPE_SIM_DEVICES, "`2`", kReadBySimRuntime,                                             \
      "how many devices the host-memory CUDA runtime has (at least 1), each with one context")     \
    X(ALLOCSCOPE_SIM_MEMORY_LIMIT, "1 TiB", kReadBySimRuntime,                                      \
      "bytes each host-memory allocator (the runtime's and the driver's, each its own) hands out "  \
      "at once; a request above it fails as out of memory")                                         \
    X(ALLOCSCOPE_SIM_REFUSE_FREE, "none", kReadBySimRuntime,                                        \
      "`N`: the N-th `cudaFree` of the process (from 1) frees nothing and fails with "              \
      "`cudaErrorLaunchFailure`, as the real runtime refuses frees after a kernel fault")           \
    X(ALLOCSCOPE_RENDEZVOUS, "`<MASTER_ADDR>-<MASTER_PORT>`", kReadByHarnessRanks,                 \
      "the id under which the ranks of one harness launch find their shared-memory collectives; "  \
      "the harness's launcher sets one unique per launch")
// clang-format on

// Where a variable belongs: allocscope's own (the first table), or the
// harness's test scaffolding (the second).
enum class ConfigScope { allocscope, harness };

struct ConfigVariable {
    std::string_view name;
    ConfigKind kind;
    std::string_view default_value;  // config_value()'s text when unset
    std::string_view shown_default;  // "" shows default_value
    std::string_view read;
    std::string_view doc;
    ConfigScope scope = ConfigScope::allocscope;
};

// allocscope's variables: the ones parse_config() parses.
inline constexpr std::array kConfigVariables = {
#define ALLOCSCOPE_CONFIG_ENTRY(NAME, MEMBER, KIND, DEFAULT, SHOWN, READ, DOC) \
    ConfigVariable{#NAME, ConfigKind::KIND, DEFAULT, SHOWN, READ, DOC, ConfigScope::allocscope},
    ALLOCSCOPE_CONFIG_TABLE(ALLOCSCOPE_CONFIG_ENTRY)
#undef ALLOCSCOPE_CONFIG_ENTRY
};

// The harness's variables, for the docs only (their kind is text: the
// harness parses them).
inline constexpr std::array kHarnessConfigVariables = {
#define ALLOCSCOPE_HARNESS_CONFIG_ENTRY(NAME, SHOWN, READ, DOC) \
    ConfigVariable{#NAME, ConfigKind::text, "", SHOWN, READ, DOC, ConfigScope::harness},
    ALLOCSCOPE_HARNESS_CONFIG_TABLE(ALLOCSCOPE_HARNESS_CONFIG_ENTRY)
#undef ALLOCSCOPE_HARNESS_CONFIG_ENTRY
};

// The entry of allocscope's variable `name`, or nullptr (for the harness's
// too: they are not allocscope's).
constexpr const ConfigVariable* find_config_variable(std::string_view name) noexcept {
    for (const ConfigVariable& v : kConfigVariables)
        if (v.name == name) return &v;
    return nullptr;
}

}  // namespace allocscope
