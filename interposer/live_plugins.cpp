// Live plugins: the detection plugins run inside the traced process, on the
// writer thread, fed every event it writes; and the findings file they
// leave next to the trace (checkpointed while the program runs, written at
// exit).
#include <unistd.h>

#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "findings.h"
#include "output_file.h"
#include "recorder_internal.h"

namespace allocscope::recorder {

namespace {

// The build tree's layout as meson makes it (interposer/meson.build): this
// library's directory and the plugins' directory, each under the build
// directory, with a leading '/'. Empty when built otherwise.
#ifdef ALLOCSCOPE_BUILD_LIB_SUBDIR
constexpr std::string_view kBuildLibSuffix = "/" ALLOCSCOPE_BUILD_LIB_SUBDIR;
constexpr std::string_view kBuildPlugins = "/" ALLOCSCOPE_BUILD_PLUGIN_SUBDIR;
#else
constexpr std::string_view kBuildLibSuffix;
constexpr std::string_view kBuildPlugins;
#endif

}  // namespace

void keep_definition(const Definition& d) {
    if (d.type == RecordType::string) {
        if (g->written_strings.size() <= d.id) g->written_strings.resize(d.id + 1);
        g->written_strings[d.id] = d.text;
    } else if (d.type == RecordType::param) {
        if (g->written_params.size() <= d.param.index) g->written_params.resize(d.param.index + 1);
        g->written_params[d.param.index] = d.param;
    }
}

// <ALLOCSCOPE_PLUGIN_DIR>, else relative to liballocscope.so: installed,
// <libdir>/liballocscope.so -> <libdir>/allocscope/plugins; in the build
// tree, <build>/interposer/liballocscope.so -> <build>/plugins (kBuildLibSuffix,
// kBuildPlugins).
std::string plugin_dir() {
    if (!g->config.plugin_dir.empty()) return g->config.plugin_dir;
    // The library's absolute path as it was when loaded: a relative
    // LD_PRELOAD path must not make plugins load from wherever the program
    // has chdir'ed to since, and nothing is looked up in "." implicitly.
    const std::string lib = g_self_path;
    const size_t slash = lib.rfind('/');
    if (lib.empty() || lib[0] != '/' || slash == std::string::npos) return {};
    const std::string dir = lib.substr(0, slash);
    std::vector<std::string> candidates{dir + "/allocscope/plugins"};
    if (!kBuildLibSuffix.empty() && dir.ends_with(kBuildLibSuffix)) {
        const std::string build = dir.substr(0, dir.size() - kBuildLibSuffix.size());
        candidates.push_back(build + std::string(kBuildPlugins));
    }
    return first_directory(candidates);
}

void start_plugins() {
    if (g->config.plugins_off) return;
    try {
        HostSettings settings;
        settings.rank = g->config.rank;
        settings.pid = static_cast<uint32_t>(getpid());
        settings.world_size = g->config.world_size > 0 ? g->config.world_size : 0;
        settings.options = g->config.plugin_options;
        settings.warn = [](const std::string& line) { log_line(LogLevel::quiet, line); };
        settings.info = [](const std::string& line) { log_line(LogLevel::info, line); };
        auto host = std::make_unique<PluginHost>(std::move(settings));
        const std::string dir = plugin_dir();
        if (dir.empty() && g->config.plugins.empty()) {
            log_line(LogLevel::debug,
                     "allocscope: no plugin directory found (set ALLOCSCOPE_PLUGIN_DIR); no "
                     "plugins run");
        }
        host->load(g->config.plugins, dir);
        // One live table: the plugins read the writer's (see the top of
        // core/plugin_host.h), which the writer has applied every event to
        // before they see it.
        host->view_live(g->live, g->written_strings);
        g->plugins = std::move(host);
    } catch (const std::exception& e) {
        log_line(LogLevel::quiet, std::string("allocscope: plugins off: ") + e.what());
    } catch (...) {
        log_line(LogLevel::quiet, "allocscope: plugins off: unexpected exception");
    }
}

namespace {

// Only the host's own bookkeeping throws (out of memory); plugin failures
// are contained by the host.
template <typename Call>
void call_plugins(Call&& call) {
    try {
        call();
    } catch (const std::exception& e) {
        log_line(LogLevel::quiet,
                 std::string("allocscope: plugins stopped, no findings written: ") + e.what());
        g->plugins.reset();
    } catch (...) {
        log_line(LogLevel::quiet, "allocscope: plugins stopped, no findings written");
        g->plugins.reset();
    }
}

}  // namespace

void before_live_plugins(const Event& e) {
    if (!g->plugins) return;
    call_plugins([&] { g->plugins->before_live_change(e); });
}

void feed_plugins(const Event& e, bool tracked) {
    if (!g->plugins) return;
    if (!tracked) {
        log_line(LogLevel::quiet,
                 "allocscope: plugins stopped, no findings written: out of memory keeping the "
                 "live allocations");
        g->plugins.reset();
        return;
    }
    call_plugins(
        [&] { g->plugins->feed(e, g->written_strings, g->written_params, g->live_changes); });
}

namespace {

// findings.<stem>.json next to <stem>.trace: the trace's name is unique in
// the directory, so is this one.
std::string trace_name() {
    const std::string& trace = g->writer.path();
    const size_t slash = trace.rfind('/');
    return slash == std::string::npos ? trace : trace.substr(slash + 1);
}

std::string findings_path() {
    const std::string name = trace_name();
    return g->config.out_dir + "/findings." + std::string(trace_stem(name)) + ".json";
}

}  // namespace

// Findings emitted while the program runs are written out (the same file,
// replaced atomically) at most once a second, so a process killed with
// SIGKILL leaves those of about a second before; the file written at exit
// replaces the last checkpoint. Built-in plugins emit at finish, so for them
// this never writes. Failures stay silent: the final write reports them.
void checkpoint_findings() {
    static size_t written = 0;
    static uint64_t last_ns = 0;
    if (!g->plugins) return;
    const size_t n = g->plugins->findings().size();
    const uint64_t now = mono_ns();
    if (n == written || (last_ns != 0 && now - last_ns < 1'000'000'000ull)) return;
    last_ns = now;
    try {
        write_findings_file(findings_path(), g->plugins->findings_file(trace_name()));
        written = n;
    } catch (...) {
    }
}

void finish_plugins() {
    if (!g->plugins) return;
    const std::string name = trace_name();
    const std::string path = findings_path();
    try {
        g->plugins->finish();
        FindingsFile file = g->plugins->findings_file(name);
        write_findings_file(path, file);
        log_line(LogLevel::info, "allocscope: wrote " + path + " (" +
                                     std::to_string(file.findings.size()) + " finding(s))");
    } catch (const std::exception& e) {
        // After a failed trace write (disk full) its one warning has said
        // that output is being lost; the findings share its fate.
        if (!g->writer.failed()) {
            log_line(LogLevel::quiet, std::string("allocscope: findings not written: ") + e.what());
        }
    } catch (...) {
        if (!g->writer.failed()) log_line(LogLevel::quiet, "allocscope: findings not written");
    }
}

}  // namespace allocscope::recorder
