// allocscope run: runs a command with liballocscope.so preloaded.
// Longer than 600 lines: the help text, the options, the Python and
// multi-node set-up and the end of a run (replay, findings, reports) are
// one command's sequence, read top to bottom.
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "args.h"
#include "cli.h"
#include "config.h"
#include "config_table.h"
#include "imbalance.h"
#include "output_file.h"
#include "plugin_host.h"
#include "replay_engine.h"
#include "trace_bound.h"

#ifndef ALLOCSCOPE_INSTALL_LIBDIR
#define ALLOCSCOPE_INSTALL_LIBDIR "lib"
#endif
#ifndef ALLOCSCOPE_INSTALL_DATADIR
#define ALLOCSCOPE_INSTALL_DATADIR "share"
#endif
#ifndef ALLOCSCOPE_SOURCE_PYTHON_DIR
#define ALLOCSCOPE_SOURCE_PYTHON_DIR ""
#endif

namespace allocscope::cli {

namespace {

namespace fs = std::filesystem;

// The help. The defaults and limits that the configuration table
// (core/config_table.h) and the parser decide are written as {NAME}:
// {ALLOCSCOPE_X} is that variable's default, the others are expanded by
// run_help(); so the help cannot drift from what liballocscope.so does (the
// test input_tables compares them).
constexpr std::string_view kRunHelpTemplate =
    R"(usage: allocscope run [--out DIR] [--force] [--stack-depth N] [--plugins LIST]
                     [--plugin-dir DIR] [--plugin-option NAME.KEY=VALUE]...
                     [--check] [--fail-on info|warning|error] [--nvtx] [--no-provenance]
                     [--provenance-steps all|first=N[,every=N[,window=N]]]
                     [--max-trace-size SIZE] [--per-host] -- CMD [ARGS...]

Runs CMD with liballocscope.so preloaded (prepended to any LD_PRELOAD) and
ALLOCSCOPE_OUT set, so every process of the run that uses CUDA writes a trace
(rank<R>.trace, or pid<PID>.trace without a rank) into DIR. Detection plugins
run inside each process and write findings.<rank<R>|pid<PID>>.json; at the end
they are merged into DIR/findings.json, and DIR/report.txt (the concise text
report; allocscope report --full DIR for everything) and DIR/report.html are
written. The terminal gets the errors and warnings, one line for what
several ranks found alike, and one line "N errors, N warnings, N infos on R
ranks — report: DIR/report.txt"; out-of-memory moments come last. A
process that died before writing its final findings (killed, crashed: its
trace ends without a footer, or its findings file is missing) has its trace
replayed through the same plugins after CMD ends; one line names each such
trace. Exits with CMD's exit status (128+N when it was killed by signal N).

options:
  --out DIR          output directory (default: $ALLOCSCOPE_OUT or {ALLOCSCOPE_OUT})
  --force            delete traces and findings an earlier run left in DIR
                     instead of refusing
  --stack-depth N    frames captured per allocation, from 0 (stacks off) to
                     {MAX_STACK_DEPTH} (default {ALLOCSCOPE_STACK_DEPTH})
  --plugins LIST     comma list of plugin names or paths (default: every
                     built-in plugin; `none` turns plugins off)
  --plugin-dir DIR   where plugin names are looked up (ALLOCSCOPE_PLUGIN_DIR)
  --plugin-option NAME.KEY=VALUE
                     an option for plugin NAME (repeatable; added to
                     ALLOCSCOPE_PLUGIN_OPTIONS)
  --check            after CMD, exit 3 when a finding is at or above the
                     --fail-on severity, else 4 when not everything was
                     checked (a plugin did not load or was disabled by a
                     bad option or an error, an unknown plugin name, no
                     process wrote a trace or ran plugins; one line says
                     what); CMD's own failure status wins, and findings
                     that cannot be read or written exit 2
  --fail-on SEV      info, warning or error (default error); implies --check
  --nvtx             also make liballocscope.so CMD's NVTX injection library
                     (NVTX_INJECTION64_PATH), so NVTX ranges tag allocations:
                     "allocscope:<layer>/<phase>" (the layer ends at the first
                     '/'; an empty part keeps the enclosing one), FSDP2's
                     names such as FSDP::pre_forward (<fqn>) (layer <fqn>,
                     phase forward, backward or a sub-phase such as
                     forward/all_gather), marks "allocscope:step=<n>" (step)
                     and "allocscope:<text>" (note). Names from
                     torch.autograd.profiler.emit_nvtx() lose their ", seq = N"
                     suffixes; other names tag nothing. Refused when
                     NVTX_INJECTION64_PATH already names another tool (NVTX
                     loads one per process)
  --no-python        leave Python processes alone (see Python below)
  --no-provenance    PyTorch: do not follow the parameters through the ATen
                     ops (sets ALLOCSCOPE_PROVENANCE=0). By default, where
                     the PyTorch bridge loads, every allocation computed
                     from one parameter alone (a quantized copy, a
                     transpose, a scale) is declared, so that the weight
                     detectors report proven copies, not size matches;
                     without it they can only match sizes, never an error,
                     and the summary says which layers matched (docs/USAGE.md,
                     "PyTorch, unchanged"). --provenance sets
                     ALLOCSCOPE_PROVENANCE=1 (the default)
  --provenance-steps SPEC
                     the steps provenance observes (sets
                     ALLOCSCOPE_PROVENANCE_STEPS): all, or
                     first=N[,every=N[,window=N]], counted from the step
                     the shim starts in. The default,
                     {ALLOCSCOPE_PROVENANCE_STEPS}, observes
                     {PROVENANCE_STEPS_OBSERVED}: in
                     the others torch runs its ops without the observer
                     (docs/PERFORMANCE.md), the weight detectors match no
                     sizes, and the summary names the steps observed.
                     every=0: none after the first
  --max-trace-size SIZE
                     keep each trace within SIZE (512M, 2G: K, M, G, T are
                     powers of 1024; at least {MIN_TRACE_SIZE}): its first steps (a
                     quarter of SIZE) and the latest steps are kept, the
                     steps between are dropped, and the allocations live and
                     scopes open where the kept steps resume are written in
                     their place, so the report of those steps is the one an
                     unbounded trace gives (ALLOCSCOPE_MAX_TRACE_SIZE). The
                     live plugins see every event either way
  --per-host         write this host's traces, findings and reports into
                     DIR/host-<name> (the name: $ALLOCSCOPE_HOST, else the
                     machine's), so that the hosts of one job share DIR
                     without touching each other's files; allocscope report
                     DIR then merges every host. On by default in a
                     multi-node job: SLURM_JOB_NUM_NODES or SLURM_NNODES
                     above 1, PET_NNODES above 1, or CMD a torchrun (or
                     python -m torch.distributed.run) with --nnodes above 1

environment:
  ALLOCSCOPE_LIB     path of liballocscope.so to preload instead of the bundled one
  ALLOCSCOPE_TORCH_BRIDGE
                     path of the PyTorch bridge library instead of the bundled one

Python: unless --no-python, run sets ALLOCSCOPE_PYTHON=1 and prepends
allocscope's Python directory (sitecustomize.py and the allocscope package)
to PYTHONPATH. A Python process that imports torch then tags allocations with
the module running them (layer = the module's name, phase forward, backward or
optimizer, steps counted by optimizer.step()) and registers the parameters,
with no change to the script; others are untouched (python -E or -I ignore
PYTHONPATH and run untagged). Under PyTorch's native caching allocator the
tensors inside its segments are seen through the PyTorch bridge library
(ALLOCSCOPE_TORCH_BRIDGE is set to it). Where the bridge was not built, run
sets PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (added to the other keys
of PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF, unless a backend is set
there already) so that every tensor is a cudaMallocAsync call, and says so in
one line.

example:
  allocscope run --out /tmp/run1 -- torchrun --nproc_per_node 2 train.py
  allocscope run --check --fail-on warning -- python train.py
)";

// A size as --max-trace-size takes it: "64K", "2G"; bytes where no unit
// divides it.
std::string size_text(uint64_t bytes) {
    static constexpr std::pair<uint64_t, char> kUnits[] = {
        {uint64_t{1} << 40, 'T'}, {uint64_t{1} << 30, 'G'}, {uint64_t{1} << 20, 'M'}, {1024, 'K'}};
    for (const auto& [unit, suffix] : kUnits)
        if (bytes >= unit && bytes % unit == 0) return std::to_string(bytes / unit) + suffix;
    return std::to_string(bytes);
}

// The steps `steps` observes, as the help says them: "steps 0-3, 100-101,
// 200-201, ...", "every step".
std::string observed_steps(const ProvenanceSteps& steps) {
    if (steps.first == 0) return "every step";
    auto range = [](uint64_t from, uint64_t count) {
        return count == 1 ? std::to_string(from)
                          : std::to_string(from) + "-" + std::to_string(from + count - 1);
    };
    std::string out = (steps.first == 1 ? "step " : "steps ") + range(0, steps.first);
    if (steps.every == 0) return out;
    for (uint64_t k = 1; k <= 2; ++k)
        out += ", " + range(k * steps.every, steps.window);
    return out + ", ...";
}

// kRunHelpTemplate with its {NAME}s expanded; throws std::logic_error on a
// name it does not know (the tests run every --help).
const std::string& run_help() {
    static const std::string help = [] {
        ProvenanceSteps default_steps;
        std::string problem;
        const ConfigVariable* steps_variable = find_config_variable("ALLOCSCOPE_PROVENANCE_STEPS");
        if (steps_variable == nullptr ||
            !parse_provenance_steps(steps_variable->default_value, default_steps, problem))
            throw std::logic_error("ALLOCSCOPE_PROVENANCE_STEPS's default does not parse");
        std::string out;
        std::string_view rest = kRunHelpTemplate;
        for (size_t open; (open = rest.find('{')) != std::string_view::npos;) {
            const size_t close = rest.find('}', open);
            if (close == std::string_view::npos)
                throw std::logic_error("run's help has an unclosed {");
            const std::string_view name = rest.substr(open + 1, close - open - 1);
            out += rest.substr(0, open);
            if (name == "MAX_STACK_DEPTH") {
                out += std::to_string(Config::kMaxStackDepth);
            } else if (name == "MIN_TRACE_SIZE") {
                out += size_text(kMinTraceBound);
            } else if (name == "PROVENANCE_STEPS_OBSERVED") {
                out += observed_steps(default_steps);
            } else if (const ConfigVariable* v = find_config_variable(name)) {
                out += v->default_value;
            } else {
                throw std::logic_error("run's help names {" + std::string(name) + "}");
            }
            rest.remove_prefix(close + 1);
        }
        return out + std::string(rest);
    }();
    return help;
}

volatile sig_atomic_t g_child = 0;

void forward_signal(int sig) {
    if (g_child > 0) kill(g_child, sig);
}

std::string exe_dir() {
    char buf[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) return ".";
    return fs::path(std::string(buf, static_cast<size_t>(n))).parent_path().string();
}

std::string find_interposer() {
    if (const std::string& lib = environment_config().lib; !lib.empty()) {
        if (access(lib.c_str(), R_OK) != 0) {
            throw std::runtime_error("ALLOCSCOPE_LIB=" + lib +
                                     " is not readable: " + std::strerror(errno));
        }
        return fs::absolute(lib).string();
    }
    fs::path dir = exe_dir();
    for (const fs::path& candidate :
         {dir / ".." / "interposer" / "liballocscope.so",
          dir / ".." / ALLOCSCOPE_INSTALL_LIBDIR / "liballocscope.so"}) {
        std::error_code ec;
        if (fs::exists(candidate, ec)) return fs::weakly_canonical(candidate).string();
    }
    throw std::runtime_error("cannot find liballocscope.so next to " + dir.string() +
                             " (set ALLOCSCOPE_LIB to its path)");
}

// allocscope's Python directory (tools/python): the source tree's for a build
// tree, <prefix>/<datadir>/allocscope/python when installed; "" when absent.
std::string find_python_dir() {
    const fs::path dir = exe_dir();
    std::error_code ec;
    if (fs::exists(dir / ".." / "interposer" / "liballocscope.so", ec)) {
        const fs::path source = ALLOCSCOPE_SOURCE_PYTHON_DIR;
        if (fs::exists(source / "sitecustomize.py", ec)) return source.string();
    }
    const fs::path datadir = ALLOCSCOPE_INSTALL_DATADIR;
    const fs::path installed =
        (datadir.is_absolute() ? datadir : dir / ".." / datadir) / "allocscope" / "python";
    if (fs::exists(installed / "sitecustomize.py", ec))
        return fs::weakly_canonical(installed).string();
    return {};
}

// The PyTorch bridge next to liballocscope.so `lib`: <libdir>/allocscope when
// installed, <build>/tools/torch_bridge in a build tree; "" when not built.
std::string find_torch_bridge(const std::string& lib) {
    std::error_code ec;
    if (const std::string& env = environment_config().torch_bridge; !env.empty()) {
        if (access(env.c_str(), R_OK) != 0) {
            throw std::runtime_error("ALLOCSCOPE_TORCH_BRIDGE=" + env +
                                     " is not readable: " + std::strerror(errno));
        }
        return fs::absolute(env).string();
    }
    const fs::path dir = fs::path(lib).parent_path();
    for (const fs::path& candidate :
         {dir / "allocscope" / "liballocscope_torch_bridge.so",
          dir / ".." / "tools" / "torch_bridge" / "liballocscope_torch_bridge.so"}) {
        if (fs::exists(candidate, ec)) return fs::weakly_canonical(candidate).string();
    }
    return {};
}

// True when the allocator configuration `conf` has a "backend" key.
bool sets_backend(const std::string& conf) {
    size_t start = 0;
    while (start <= conf.size()) {
        size_t end = conf.find(',', start);
        if (end == std::string::npos) end = conf.size();
        std::string key = conf.substr(start, end - start);
        key = key.substr(0, key.find(':'));
        const size_t b = key.find_first_not_of(" \t");
        const size_t e = key.find_last_not_of(" \t");
        if (b != std::string::npos && key.substr(b, e - b + 1) == "backend") return true;
        start = end + 1;
    }
    return false;
}

// Whether CMD is (most likely) a Python program: python*, a launcher that
// starts Python (torchrun, accelerate, deepspeed), or a script whose #! line
// names python. Only decides whether the fallback line is printed.
bool looks_like_python(const std::string& command) {
    const std::string base = fs::path(command).filename().string();
    if (base.rfind("python", 0) == 0 || base == "torchrun" || base == "accelerate" ||
        base == "deepspeed")
        return true;
    std::string path = command;
    if (command.find('/') == std::string::npos) {
        const char* env_path = std::getenv("PATH");
        std::string dirs = env_path ? env_path : "";
        for (size_t start = 0; start <= dirs.size();) {
            size_t end = dirs.find(':', start);
            if (end == std::string::npos) end = dirs.size();
            const std::string candidate = dirs.substr(start, end - start) + "/" + command;
            if (access(candidate.c_str(), X_OK) == 0) {
                path = candidate;
                break;
            }
            start = end + 1;
        }
    }
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return false;
    char line[256] = {};
    const bool read = std::fgets(line, sizeof line, f) != nullptr;
    std::fclose(f);
    return read && line[0] == '#' && line[1] == '!' && std::strstr(line, "python") != nullptr;
}

// Without the bridge, PyTorch's cudaMallocAsync backend makes every tensor a
// runtime-API call: add it to the allocator configuration unless the user
// chose a backend. Says so in one line when CMD looks like a Python program.
void fall_back_to_cuda_malloc_async(bool say) {
    static const char* const kVars[] = {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"};
    for (const char* var : kVars) {
        const char* v = std::getenv(var);
        if (v && sets_backend(v)) return;
    }
    std::string shown;
    for (const char* var : kVars) {
        const char* v = std::getenv(var);
        if (!v || !*v) continue;
        const std::string value = std::string("backend:cudaMallocAsync,") + v;
        setenv(var, value.c_str(), 1);
        shown += std::string(shown.empty() ? "" : " ") + var + "=" + value;
    }
    if (shown.empty()) {
        setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync", 1);
        shown = "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync";
    }
    if (!say) return;
    std::fprintf(stderr,
                 "allocscope: the PyTorch bridge is not built: running with %s so that every "
                 "PyTorch tensor is a cudaMallocAsync call (set a backend yourself to choose "
                 "another)\n",
                 shown.c_str());
}

// ALLOCSCOPE_PYTHON, PYTHONPATH and the bridge (or its fallback) for Python
// processes of the run.
void set_up_python(const std::string& lib, const std::string& command) {
    const std::string dir = find_python_dir();
    if (dir.empty()) {
        std::fprintf(stderr,
                     "allocscope: allocscope's Python directory is not installed next to %s: "
                     "Python processes run untagged\n",
                     exe_dir().c_str());
        return;
    }
    setenv("ALLOCSCOPE_PYTHON", "1", 1);
    std::string path = dir;
    if (const char* existing = std::getenv("PYTHONPATH"); existing && *existing) {
        const std::string rest = existing;
        if (rest == dir || rest.rfind(dir + ":", 0) == 0) {
            path = rest;
        } else {
            path += ":" + rest;
        }
    }
    setenv("PYTHONPATH", path.c_str(), 1);
    const std::string bridge = find_torch_bridge(lib);
    if (!bridge.empty()) {
        setenv("ALLOCSCOPE_TORCH_BRIDGE", bridge.c_str(), 1);
    } else {
        fall_back_to_cuda_malloc_async(looks_like_python(command));
    }
}

// Refuses (or with --force, clears) traces of an earlier run so two runs are
// never mixed in one directory.
void prepare_out_dir(const fs::path& dir, bool force) {
    std::error_code ec;
    if (fs::exists(dir, ec)) {
        if (!fs::is_directory(dir, ec)) {
            throw std::runtime_error("output path " + dir.string() + " is not a directory");
        }
        std::vector<std::string> old = trace_files_in(dir);
        for (const std::string& f : rank_findings_files_in(dir))
            old.push_back(f);
        if (fs::exists(dir / "findings.json", ec)) old.push_back((dir / "findings.json").string());
        if (!old.empty() && !force) {
            throw std::runtime_error("output directory " + dir.string() + " already holds " +
                                     std::to_string(old.size()) +
                                     " trace or findings file(s) from an earlier run; pass "
                                     "--force to replace them or choose another --out");
        }
        for (const std::string& p : old)
            fs::remove(p, ec);
        return;
    }
    // Every directory created here is 0700 from the start (as the
    // interposer's own), never briefly open to others.
    std::string error;
    if (!make_private_dirs(dir.string(), error)) throw std::runtime_error(error);
}

// Merges the processes' findings into DIR/findings.json (`merged`, when
// there are any). Returns the exit status --check asks for when they could
// not be merged or there were none (after one message), else 0.
int collect_findings(const fs::path& out_dir, bool check, const Recovered& recovered,
                     std::optional<FindingsFile>& merged) {
    if (rank_findings_files_in(out_dir).empty() && recovered.replayed.empty()) {
        if (!check) return 0;
        std::fprintf(stderr,
                     trace_files_in(out_dir).empty()
                         ? "allocscope: check failed: nothing was checked: no process wrote a "
                           "trace in %s (it may not be writable, or nothing used CUDA)\n"
                         : "allocscope: check failed: nothing was checked: no findings files in "
                           "%s (no process ran plugins)\n",
                     out_dir.c_str());
        return kExitUnchecked;
    }
    try {
        FindingsFile file = merge_run_findings(out_dir.string(), recovered);
        write_findings_file((out_dir / "findings.json").string(), file);
        merged = std::move(file);
    } catch (const FindingsError& e) {
        std::fprintf(stderr, "allocscope: %s\n", e.what());
        return check ? kExitUsage : 0;
    }
    return 0;
}

// The report's cross-rank findings (imbalance_findings) into the merged
// findings and DIR/findings.json, so that the run's summary, --check and a
// later `allocscope check` count them as the report shows them.
void add_cross_rank_findings(const fs::path& out_dir, const Report& report, FindingsFile& merged) {
    std::vector<Finding> cross;
    for (const Finding& f : report.findings.findings)
        if (f.plugin == kImbalancePlugin) cross.push_back(f);
    if (cross.empty()) return;
    std::erase_if(merged.findings, [](const Finding& f) { return f.plugin == kImbalancePlugin; });
    merged.findings.insert(merged.findings.end(), cross.begin(), cross.end());
    try {
        write_findings_file((out_dir / "findings.json").string(), merged);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "allocscope: %s\n", e.what());
    }
}

}  // namespace

namespace {

// The plugin directory liballocscope.so at `lib` uses when
// ALLOCSCOPE_PLUGIN_DIR is unset (interposer/live_plugins.cpp):
// <libdir>/allocscope/plugins installed, <build>/plugins in a build tree.
std::string interposer_plugin_dir(const std::string& lib) {
    if (const std::string& dir = environment_config().plugin_dir; !dir.empty()) return dir;
    const fs::path libdir = fs::path(lib).parent_path();
    std::vector<std::string> candidates{(libdir / "allocscope" / "plugins").string()};
    if (libdir.filename() == "interposer")
        candidates.push_back((libdir.parent_path() / "plugins").string());
    return first_directory(candidates);
}

// The plugins the traced processes will load, loaded here first with their
// options: a plugin that does not load, a misspelt plugin name in an
// option, an option key a plugin does not read, a bad value. Each problem
// is one line; the program is not started while there is one, since it
// would train in full with something else checked than was asked for.
std::vector<std::string> plugin_problems(const std::string& lib) {
    PluginChoice choice = plugin_choice_from_environment();
    std::vector<std::string> problems;
    if (choice.off) return problems;
    HostSettings settings;
    settings.options = choice.options;
    settings.warn = [&problems](const std::string& line) { problems.push_back(line); };
    settings.info = [](const std::string&) {};
    PluginHost host(std::move(settings));
    host.load(choice.plugins, choice.dir.empty() ? interposer_plugin_dir(lib) : choice.dir);
    host.finish();
    return problems;
}

// Why this host is one of several in the job, or "" when nothing says so:
// the environment of a SLURM allocation or of torchelastic, or a torchrun
// command line with --nnodes above 1 (N, or MIN:MAX with MAX above 1).
std::string multi_node_reason(const std::vector<std::string>& command) {
    for (const char* name : {"SLURM_JOB_NUM_NODES", "SLURM_NNODES", "PET_NNODES"}) {
        const char* v = std::getenv(name);
        if (!v || !*v) continue;
        std::string_view text(v);
        if (const size_t colon = text.find(':'); colon != std::string_view::npos)
            text.remove_prefix(colon + 1);
        if (std::atol(std::string(text).c_str()) > 1) return std::string(name) + "=" + v;
    }
    bool launcher = false;
    for (size_t i = 0; i < command.size(); ++i) {
        const std::string& w = command[i];
        const std::string base = fs::path(w).filename().string();
        if (base == "torchrun" || w == "torch.distributed.run" || w == "torch.distributed.launch")
            launcher = true;
        if (!launcher) continue;
        std::string value;
        if (w == "--nnodes" && i + 1 < command.size()) value = command[i + 1];
        if (w.rfind("--nnodes=", 0) == 0) value = w.substr(9);
        if (value.empty()) continue;
        const size_t colon = value.find(':');
        const std::string most = colon == std::string::npos ? value : value.substr(colon + 1);
        if (std::atol(most.c_str()) > 1) return "torchrun --nnodes " + value;
    }
    return {};
}

// The host's directory name: "host-" and its name, with every character
// outside [A-Za-z0-9._-] made '_'.
std::string host_dir_name(const std::string& host) {
    std::string out = "host-";
    for (char c : host.empty() ? std::string("unknown") : host) {
        const bool plain =
            std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
        out += plain ? c : '_';
    }
    return out;
}

}  // namespace

int run_command(const std::vector<std::string>& args) {
    std::string out;
    bool force = false;
    std::string stack_depth;
    std::string plugins;
    std::string plugin_dir;
    std::vector<std::string> plugin_options;
    bool check = false;
    bool nvtx = false;
    bool python = true;
    bool provenance = false;
    bool no_provenance = false;
    bool per_host = false;
    std::string provenance_steps;
    std::string max_trace_size;
    Severity threshold = Severity::error;
    Args parser("run", run_help().c_str());
    parser.value({"--out"}, out)
        .value({"--stack-depth"}, stack_depth)
        .value({"--plugins"}, plugins)
        .value({"--plugin-dir"}, plugin_dir)
        .value({"--plugin-option"},
               [&plugin_options](const std::string& v) {
                   plugin_options.push_back(v);
                   return std::string();
               })
        .value({"--fail-on"},
               [&threshold, &check](const std::string& v) {
                   if (!parse_fail_on(v, threshold))
                       return "--fail-on expects info, warning or error, got '" + v + "'";
                   check = true;
                   return std::string();
               })
        .flag({"--force"}, force)
        .flag({"--check"}, check)
        .flag({"--nvtx"}, nvtx)
        .flag({"--no-python"}, python, false)
        .flag({"--provenance"}, provenance)
        .flag({"--no-provenance"}, no_provenance)
        .flag({"--per-host"}, per_host)
        .value({"--max-trace-size"},
               [&max_trace_size](const std::string& v) {
                   uint64_t bytes = 0;
                   if (!parse_size(v, bytes))
                       return "--max-trace-size expects a size such as 512M or 2G, got '" + v + "'";
                   if (bytes > 0 && bytes < kMinTraceBound)
                       return "--max-trace-size " + v + " is below the smallest bound, " +
                              size_text(kMinTraceBound);
                   max_trace_size = v;
                   return std::string();
               })
        .value({"--provenance-steps"},
               [&provenance_steps](const std::string& v) {
                   ProvenanceSteps steps;
                   if (std::string problem; !parse_provenance_steps(v, steps, problem))
                       return "--provenance-steps '" + v + "': " + problem;
                   provenance_steps = v;
                   return std::string();
               })
        .stop_at_first_positional();
    if (const auto status = parser.parse(args)) return *status;
    const std::vector<std::string>& command = parser.positionals();
    if (command.empty()) return fail("run needs a command to run (" + parser.see_help() + ")");
    if (!stack_depth.empty()) {
        // The interposer's own reading of ALLOCSCOPE_STACK_DEPTH decides.
        const Config parsed = parse_config([&stack_depth](const char* name) {
            return std::string_view(name) == "ALLOCSCOPE_STACK_DEPTH" ? stack_depth.c_str()
                                                                      : nullptr;
        });
        if (!parsed.warnings.empty()) {
            return fail("--stack-depth expects an integer from 0 to " +
                        std::to_string(Config::kMaxStackDepth) + ", got '" + stack_depth + "'");
        }
    }
    if (!plugins.empty()) {
        std::vector<std::string> entries;
        bool off = false;
        std::string problem;
        if (!parse_plugin_list(plugins, entries, off, problem)) {
            return fail("--plugins '" + plugins + "': " + problem);
        }
        if (off && check) return fail("--check needs plugins, but --plugins is none");
    }
    std::string options_env =
        config_value(environment_config(), "ALLOCSCOPE_PLUGIN_OPTIONS").value_or("");
    for (const std::string& o : plugin_options) {
        std::string key, value, problem;
        if (!parse_plugin_option(o, key, value, problem)) return fail("--plugin-option " + problem);
        options_env += (options_env.empty() ? "" : ",") + o;
    }
    if (!plugin_dir.empty()) {
        std::error_code ec;
        if (!fs::is_directory(plugin_dir, ec)) {
            return fail("--plugin-dir " + plugin_dir + " is not a directory");
        }
        plugin_dir = fs::absolute(plugin_dir).string();
    }
    if (out.empty()) out = environment_config().out_dir;
    fs::path out_dir = fs::absolute(out).lexically_normal();
    std::string per_host_reason = per_host ? "--per-host" : multi_node_reason(command);
    if (!per_host_reason.empty()) {
        // The name the traces record (ALLOCSCOPE_HOST, else the machine's).
        const std::string host = environment_config().host;
        const fs::path shared = out_dir;
        out_dir /= host_dir_name(host);
        std::fprintf(stderr,
                     "allocscope: one host of several (%s): this host's traces go to %s; "
                     "allocscope report %s merges every host\n",
                     per_host_reason.c_str(), out_dir.c_str(), shared.c_str());
    }
    const std::string lib = find_interposer();
    if (nvtx) {
        // NVTX loads one injection library per process: never replace another
        // tool's (Nsight Systems sets the variable for the processes it runs).
        const char* existing = std::getenv("NVTX_INJECTION64_PATH");
        std::error_code ec;
        if (existing && *existing && !fs::equivalent(existing, lib, ec)) {
            return fail(std::string("--nvtx: NVTX_INJECTION64_PATH is already set to ") + existing +
                        " (another NVTX tool, such as Nsight Systems); NVTX loads one injection "
                        "library per process: unset it or run without --nvtx");
        }
    }
    std::string preload = lib;
    if (const char* existing = std::getenv("LD_PRELOAD"); existing && *existing) {
        preload += std::string(":") + existing;
    }
    setenv("LD_PRELOAD", preload.c_str(), 1);
    setenv("ALLOCSCOPE_OUT", out_dir.c_str(), 1);
    if (!stack_depth.empty()) setenv("ALLOCSCOPE_STACK_DEPTH", stack_depth.c_str(), 1);
    if (!plugins.empty()) setenv("ALLOCSCOPE_PLUGINS", plugins.c_str(), 1);
    if (!plugin_options.empty()) setenv("ALLOCSCOPE_PLUGIN_OPTIONS", options_env.c_str(), 1);
    if (!plugin_dir.empty()) setenv("ALLOCSCOPE_PLUGIN_DIR", plugin_dir.c_str(), 1);
    if (nvtx) setenv("NVTX_INJECTION64_PATH", lib.c_str(), 1);
    if (provenance && no_provenance)
        return fail("--provenance and --no-provenance contradict each other");
    if (provenance) setenv("ALLOCSCOPE_PROVENANCE", "1", 1);
    if (no_provenance) setenv("ALLOCSCOPE_PROVENANCE", "0", 1);
    if (!provenance_steps.empty())
        setenv("ALLOCSCOPE_PROVENANCE_STEPS", provenance_steps.c_str(), 1);
    if (!max_trace_size.empty()) setenv("ALLOCSCOPE_MAX_TRACE_SIZE", max_trace_size.c_str(), 1);
    if (const std::vector<std::string> problems = plugin_problems(lib); !problems.empty()) {
        for (const std::string& line : problems)
            std::fprintf(stderr, "%s\n", line.c_str());
        return fail("the plugins or their options above are wrong; " + command[0] +
                    " was not started");
    }
    prepare_out_dir(out_dir, force);
    if (python) set_up_python(lib, command[0]);

    std::vector<char*> argv;
    for (const std::string& word : command)
        argv.push_back(const_cast<char*>(word.c_str()));
    argv.push_back(nullptr);

    std::fflush(nullptr);
    pid_t child = fork();
    if (child < 0) return fail(std::string("cannot fork: ") + std::strerror(errno));
    if (child == 0) {
        execvp(argv[0], argv.data());
        std::fprintf(stderr, "allocscope: cannot run '%s': %s\n", argv[0], std::strerror(errno));
        _exit(127);
    }
    g_child = child;
    struct sigaction sa {};
    sa.sa_handler = forward_signal;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
        sigaction(sig, &sa, nullptr);

    int status = 0;
    while (waitpid(child, &status, 0) < 0) {
        if (errno != EINTR) return fail(std::string("waitpid failed: ") + std::strerror(errno));
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::fprintf(stderr, "allocscope: %zu trace file(s) in %s (allocscope report %s)\n",
                 trace_files_in(out_dir).size(), out_dir.c_str(), out_dir.c_str());
    // A process killed or crashed before its exit left no final findings:
    // its trace is replayed through the plugins it ran with.
    const Recovered recovered = recover_findings(
        out_dir.string(), plugin_choice_from_environment(),
        [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); });
    for (const std::string& line : recovered.lines)
        std::fprintf(stderr, "allocscope: findings replayed from the trace of %s\n", line.c_str());
    std::optional<FindingsFile> merged;
    int checked = collect_findings(out_dir, check, recovered, merged);
    std::optional<Report> report;
    if (!trace_files_in(out_dir).empty()) report = write_run_reports(out_dir.string());
    if (report && merged) add_cross_rank_findings(out_dir, *report, *merged);
    // The terminal gets the problems and one line; report.txt has the rest.
    const std::string where = report ? "report: " + (out_dir / "report.txt").string()
                                     : "findings: " + (out_dir / "findings.json").string();
    if (merged) {
        print_run_findings(*merged, where, stderr);
        if (check) checked = gate(*merged, threshold, stderr);
    } else if (report) {
        std::fprintf(stderr, "allocscope: %s\n", where.c_str());
    }
    if (report) print_oom_moments(*report);
    if (code != 0 || !check) return code;
    return checked;
}

}  // namespace allocscope::cli
