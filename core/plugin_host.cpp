// The plugin host, loading and the host table (core/plugin_host.h): finding
// plugins, loading and checking them (version 2, and version 1 through the
// v1 adapter), their allocscope_host_v2 / _v1 callbacks,
// findings and statuses. The event stream is core/plugin_feed.cpp.
// Longer than 600 lines: both ABI versions' checks and the v1 adapter sit
// with the loading they guard, so that a refusal is decided in one place.
#include "plugin_host.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <exception>
#include <filesystem>

#include "plugin_host_state.h"

namespace allocscope {

namespace {

namespace fs = std::filesystem;

constexpr const char* kFilePrefix = "allocscope-plugin-";
constexpr const char* kFileSuffix = ".so";
// Beyond this a plugin's log lines are dropped (one line says so): a
// plugin that logs per event must not flood the traced program's stderr.
constexpr int kMaxLogLines = 100;

std::string cstr(const char* s) {
    return s ? std::string(s) : std::string();
}

// The names a plugin's descriptor may be exported under, newest first (as
// NCCL looks for ncclNetPlugin_v9, then _v8, ...): version 2's, then version
// 1's, whose plugins built before the name carried the version export the
// unversioned allocscope_plugin (plugin_v1.h as released). The first name
// found is the plugin's: one that exports several is loaded by the newest.
struct DescriptorName {
    const char* symbol;
    uint32_t version;  // the layout the symbol names
};
constexpr DescriptorName kDescriptorNames[] = {
    {ALLOCSCOPE_PLUGIN_V2_SYMBOL, 2},
    {"allocscope_plugin_v1", 1},
    {ALLOCSCOPE_PLUGIN_SYMBOL, 1},  // plugin_v1.h's "allocscope_plugin"
};

struct FoundDescriptor {
    const void* descriptor = nullptr;
    const DescriptorName* name = nullptr;
};

FoundDescriptor find_descriptor(void* handle) {
    for (const DescriptorName& name : kDescriptorNames) {
        dlerror();
        if (void* sym = dlsym(handle, name.symbol)) return {sym, &name};
    }
    return {};
}

std::string descriptor_names() {
    std::string out;
    for (const DescriptorName& name : kDescriptorNames)
        out += (out.empty() ? "" : ", ") + std::string(name.symbol);
    return out;
}

// A finding of a version 1 plugin built between version 1's release and
// version 2 (plugin_v1.h then had these two fields appended, read when
// struct_size covers them): the same layout as version 2's tail.
struct FindingV1Appended {
    allocscope_finding_v1 base;
    const char* basis;
    const char* const* evidence_notes;
};
static_assert(offsetof(FindingV1Appended, basis) == sizeof(allocscope_finding_v1));

}  // namespace

std::string plugin_file_name(std::string_view name) {
    return kFilePrefix + std::string(name) + kFileSuffix;
}

bool valid_plugin_name(std::string_view name) noexcept {
    if (name.empty() || name.size() > 64) return false;
    for (char c : name) {
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
    }
    return true;
}

bool is_plugin_path(std::string_view entry) noexcept {
    return entry.find('/') != std::string_view::npos ||
           (entry.size() > 3 && entry.substr(entry.size() - 3) == kFileSuffix);
}

std::vector<std::string> discover_plugins(const std::string& dir) {
    if (dir.empty()) return {};
    const std::string_view prefix(kFilePrefix);
    std::vector<fs::path> files;
    auto consider = [&](const fs::directory_entry& entry) {
        const std::string name = entry.path().filename().string();
        std::error_code ec;
        if (name.size() > prefix.size() + 3 && name.rfind(prefix, 0) == 0 &&
            name.compare(name.size() - 3, 3, kFileSuffix) == 0 && entry.is_regular_file(ec)) {
            files.push_back(entry.path());
        }
    };
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
        std::error_code ec2;
        if (entry.is_directory(ec2)) {
            for (const auto& inner : fs::directory_iterator(entry.path(), ec2))
                consider(inner);
        } else {
            consider(entry);
        }
    }
    std::sort(files.begin(), files.end(), [](const fs::path& a, const fs::path& b) {
        return a.filename() != b.filename() ? a.filename() < b.filename() : a < b;
    });
    std::vector<std::string> out;
    for (const fs::path& f : files)
        out.push_back(f.string());
    return out;
}

std::string first_directory(const std::vector<std::string>& candidates) {
    for (const std::string& c : candidates) {
        std::error_code ec;
        if (!c.empty() && fs::is_directory(c, ec)) return fs::weakly_canonical(c, ec).string();
    }
    return {};
}

// --- instances -------------------------------------------------------------------

PluginHost::PluginHost(HostSettings settings) : settings_(std::move(settings)) {
    source_ = settings_.has_baseline ? ALLOCSCOPE_SOURCE_BASELINE : ALLOCSCOPE_SOURCE_RUN;
}

// Plugins not finished yet are, so they free their state. Libraries stay
// loaded: a plugin may have left behind what needs its code (atexit
// handlers, thread-local destructors).
PluginHost::~PluginHost() {
    finish();
}

void PluginHost::warn(const std::string& line) const {
    if (settings_.warn) {
        settings_.warn(line);
    } else {
        std::fprintf(stderr, "%s\n", line.c_str());
    }
}

PluginHost::Instance& PluginHost::new_instance(const std::string& entry, const std::string& path) {
    auto in = std::make_unique<Instance>();
    in->host = this;
    in->entry = entry;
    in->path = path;
    instances_.push_back(std::move(in));
    return *instances_.back();
}

void PluginHost::reject(Instance& in, const std::string& reason) {
    in.enabled = false;
    in.reason = reason;
    warn("allocscope: plugin " + (in.name.empty() ? in.entry : in.name) + " disabled: " + reason);
}

void PluginHost::disable(Instance& in, const std::string& reason) {
    if (!in.enabled) return;
    reject(in, reason);
}

void PluginHost::load(const std::vector<std::string>& entries, const std::string& dir) {
    struct Todo {
        std::string entry, path, problem;
    };
    std::vector<Todo> todo;
    if (entries.empty()) {
        const size_t prefix = std::string_view(kFilePrefix).size();
        for (const std::string& path : discover_plugins(dir)) {
            const std::string file = fs::path(path).filename().string();
            todo.push_back({file.substr(prefix, file.size() - prefix - 3), path, ""});
        }
    }
    for (const std::string& e : entries) {
        Todo& t = todo.emplace_back(Todo{e, "", ""});
        if (is_plugin_path(e)) {
            std::error_code ec;
            t.path = fs::absolute(e, ec).string();
        } else if (!valid_plugin_name(e)) {
            t.problem = "'" + one_line(e) +
                        "' is neither a plugin name ([a-z0-9-]+) nor a path to a .so file";
        } else if (dir.empty()) {
            t.problem = "no plugin directory to look for " + plugin_file_name(e) +
                        " in (set ALLOCSCOPE_PLUGIN_DIR or give the plugin's path)";
        } else {
            for (const std::string& p : discover_plugins(dir)) {
                if (fs::path(p).filename() == plugin_file_name(e)) {
                    t.path = p;
                    break;
                }
            }
            if (t.path.empty()) t.problem = "no " + plugin_file_name(e) + " in " + dir;
        }
    }
    for (const Todo& t : todo) {
        Instance& in = new_instance(t.entry, t.path);
        if (!t.problem.empty()) {
            reject(in, t.problem);
            continue;
        }
        dlerror();
        void* handle = dlopen(t.path.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle) {
            const char* err = dlerror();
            reject(in, "cannot load " + t.path + ": " + (err ? one_line(err) : "unknown error"));
            continue;
        }
        in.handle = handle;
        const FoundDescriptor found = find_descriptor(handle);
        if (!found.descriptor) {
            reject(in, t.path +
                           " does not export '" ALLOCSCOPE_PLUGIN_SYMBOL
                           "' under any name this allocscope knows (" +
                           descriptor_names() + ")");
            continue;
        }
        if (found.name->version == 2) {
            install(in, static_cast<const allocscope_plugin_v2*>(found.descriptor));
        } else {
            install(in, static_cast<const allocscope_plugin_v1*>(found.descriptor),
                    found.name->symbol);
        }
    }
    // A misspelt plugin name in an option would otherwise go unnoticed.
    for (const auto& [key, value] : settings_.options) {
        const std::string name = key.substr(0, key.find('.'));
        bool known = false;
        for (const auto& in : instances_)
            known = known || (in->installed() && in->name == name) || in->entry == name;
        if (!known) {
            // Kept as a plugin that did not load, so that the findings say
            // what was not checked (and --check does not pass).
            Instance& in = new_instance(name, "");
            in.reason = "plugin option '" + one_line(key) + "' names no loaded plugin ('" +
                        one_line(name) + "')";
            warn("allocscope: " + in.reason);
        }
    }
}

void PluginHost::add(const allocscope_plugin_v2* plugin, const std::string& origin) {
    Instance& in = new_instance(origin, "");
    if (!plugin) {
        reject(in, "null plugin descriptor");
        return;
    }
    install(in, plugin);
}

void PluginHost::add(const allocscope_plugin_v1* plugin, const std::string& origin) {
    Instance& in = new_instance(origin, "");
    if (!plugin) {
        reject(in, "null plugin descriptor");
        return;
    }
    install(in, plugin, "allocscope_plugin_v1");
}

void PluginHost::install(Instance& in, const allocscope_plugin_v2* p) {
    // abi_version first: a plugin of another version has another layout, so
    // its struct_size says nothing useful.
    if (p->abi_version != ALLOCSCOPE_PLUGIN_V2_ABI_VERSION) {
        reject(in, "plugin ABI version " + std::to_string(p->abi_version) + " under the name " +
                       ALLOCSCOPE_PLUGIN_V2_SYMBOL + ", expected " +
                       std::to_string(ALLOCSCOPE_PLUGIN_V2_ABI_VERSION));
        return;
    }
    if (p->struct_size != sizeof(allocscope_plugin_v2)) {
        reject(in, "struct_size " + std::to_string(p->struct_size) + ", expected " +
                       std::to_string(sizeof(allocscope_plugin_v2)) +
                       " (built against another plugin_v2.h)");
        return;
    }
    if (!admit(in, p->name)) return;
    in.plugin = p;
    in.on_step = p->on_step;
    in.finish = p->finish;
    in.event_mask = p->event_mask;
    in.enabled = true;
    if (p->init) {
        invoke(in, "init", [&] { return p->init(&in.api, &in.state); });
    }
    start(in);
}

// The v1 adapter's side of loading: version 1's layout, its own host table
// (whose emit takes a version 1 finding).
void PluginHost::install(Instance& in, const allocscope_plugin_v1* p, const char* symbol) {
    if (p->abi_version != 1) {
        reject(in, "plugin ABI version " + std::to_string(p->abi_version) + " under the name " +
                       symbol + ", expected 1");
        return;
    }
    if (p->struct_size != sizeof(allocscope_plugin_v1)) {
        reject(in, "struct_size " + std::to_string(p->struct_size) + ", expected " +
                       std::to_string(sizeof(allocscope_plugin_v1)) +
                       " (built against another plugin_v1.h)");
        return;
    }
    if (!admit(in, p->name)) return;
    in.plugin_v1 = p;
    in.on_step = p->on_step;
    in.finish = p->finish;
    // Kinds version 1 did not have never reach a version 1 plugin.
    in.event_mask = p->event_mask & ALLOCSCOPE_EVENT_ALL;
    in.api_v1.struct_size = sizeof(allocscope_host_v1);
    in.api_v1.abi_version = 1;
    in.api_v1.ctx = &in;
    in.api_v1.rank = in.api.rank;
    in.api_v1.world_size = in.api.world_size;
    in.api_v1.has_baseline = in.api.has_baseline;
    in.api_v1.param_count = &cb_param_count;
    in.api_v1.param = &cb_param;
    in.api_v1.live_foreach = &cb_live_foreach;
    in.api_v1.live_bytes = &cb_live_bytes;
    in.api_v1.option = &cb_option;
    in.api_v1.emit = &cb_emit_v1;
    in.api_v1.log = &cb_log;
    in.enabled = true;
    if (p->init) {
        invoke(in, "init", [&] { return p->init(&in.api_v1, &in.state); });
    }
    start(in);
}

bool PluginHost::admit(Instance& in, const char* name) {
    if (!name || !valid_plugin_name(name)) {
        reject(in, "invalid plugin name" +
                       (name ? " '" + one_line(name) + "'" : std::string(" (null)")) +
                       ": expected [a-z0-9-]+");
        return false;
    }
    for (const auto& other : instances_) {
        if (other.get() != &in && other->name == name && other->installed()) {
            reject(in, "a plugin named '" + std::string(name) + "' is already loaded" +
                           (other->path.empty() ? std::string() : " from " + other->path));
            return false;
        }
    }
    in.name = name;
    in.api.struct_size = sizeof(allocscope_host_v2);
    in.api.abi_version = ALLOCSCOPE_PLUGIN_V2_ABI_VERSION;
    in.api.ctx = &in;
    in.api.rank = settings_.rank;
    in.api.world_size = settings_.world_size;
    in.api.has_baseline = settings_.has_baseline ? 1 : 0;
    in.api.param_count = &cb_param_count;
    in.api.param = &cb_param;
    in.api.live_foreach = &cb_live_foreach;
    in.api.live_bytes = &cb_live_bytes;
    in.api.option = &cb_option;
    in.api.emit = &cb_emit;
    in.api.log = &cb_log;
    return true;
}

void PluginHost::start(Instance& in) {
    if (in.enabled) reject_unread_options(in);
}

// A plugin reads its options in init (plugins/README.md): an option given
// for it that it did not ask for is misspelt, and running without it would
// check something else than the user asked for.
void PluginHost::reject_unread_options(Instance& in) {
    const std::string prefix = in.name + ".";
    for (const auto& [key, value] : settings_.options) {
        if (!key.starts_with(prefix)) continue;
        const std::string k = key.substr(prefix.size());
        if (std::find(in.keys_read.begin(), in.keys_read.end(), k) != in.keys_read.end()) continue;
        std::string known;
        for (const std::string& r : in.keys_read)
            known += (known.empty() ? "" : ", ") + one_line(r);
        disable(in, "option '" + one_line(key) + "' is not one it reads (" +
                        (known.empty() ? std::string("it reads none") : "its options: " + known) +
                        ")");
        release(in);
        return;
    }
}

// A plugin disabled before its stream began: finish lets it free what its
// init made (a plugin's state lives until finish, plugin_v2.h). What it
// reports then is dropped (it is no longer enabled), and how it fails does
// not matter: it is disabled already.
void PluginHost::release(Instance& in) {
    if (in.finished || !in.installed() || !in.finish) return;
    in.finished = true;
    try {
        (void)in.finish(in.state);
    } catch (...) {
    }
}

void PluginHost::finish() {
    if (finished_) return;
    finished_ = true;
    for (auto& in : instances_) {
        if (!in->enabled) continue;
        if (in->finish) {
            invoke(*in, "finish", [&] { return in->finish(in->state); });
        }
        in->finished = in->enabled;
    }
}

size_t PluginHost::enabled_count() const noexcept {
    size_t n = 0;
    for (const auto& in : instances_)
        n += in->enabled;
    return n;
}

std::vector<PluginStatus> PluginHost::statuses() const {
    std::vector<PluginStatus> out;
    for (const auto& in : instances_)
        out.push_back({in->entry, in->name, in->path, in->enabled, in->reason});
    return out;
}

RankRun PluginHost::rank_run(const std::string& trace) const {
    RankRun r;
    r.rank = settings_.rank;
    r.trace = trace;
    r.provenance = provenance_;
    if (provenance_ == "on" && provenance_steps_.windowed)
        r.provenance += " " + provenance_steps_.text();
    for (const auto& in : instances_) {
        if (in->enabled) {
            r.plugins.push_back(in->name);
        } else {
            r.disabled.push_back({in->name.empty() ? in->entry : in->name, in->reason});
        }
    }
    return r;
}

FindingsFile PluginHost::findings_file(const std::string& trace) const {
    FindingsFile f;
    f.findings = findings_;
    f.ranks.push_back(rank_run(trace));
    return f;
}

// --- callbacks ----------------------------------------------------------------------
//
// They are called from plugin code, possibly C: nothing may propagate out of
// them except what a plugin's own visitor throws through live_foreach.

size_t PluginHost::cb_param_count(void* ctx) {
    return static_cast<Instance*>(ctx)->host->params_.size();
}

const allocscope_param_v2* PluginHost::cb_param(void* ctx, size_t index) {
    const PluginHost* h = static_cast<Instance*>(ctx)->host;
    return index < h->params_.size() ? &h->params_[index].view : nullptr;
}

namespace {

// The pools a plugin's level shows: segments are device segments (mappings
// included, plain driver allocations not: shown_to_plugins) and host pinned
// memory; blocks are blocks. Physical handles and VA reservations never.
constexpr Pool kSegmentPools[] = {Pool::device_segment, Pool::host_pinned};
constexpr Pool kBlockPools[] = {Pool::device_block};

std::span<const Pool> pools_of_level(uint32_t level) {
    if (level == ALLOCSCOPE_LEVEL_BLOCK) return kBlockPools;
    return kSegmentPools;
}

}  // namespace

size_t PluginHost::cb_live_foreach(void* ctx, uint32_t level, allocscope_live_visitor_v2 visit,
                                   void* user) {
    PluginHost* h = static_cast<Instance*>(ctx)->host;
    if (!visit) return 0;
    size_t visited = 0;
    for (uint32_t lv : {uint32_t{ALLOCSCOPE_LEVEL_SEGMENT}, uint32_t{ALLOCSCOPE_LEVEL_BLOCK}}) {
        if (level != 0 && level != lv) continue;
        for (Pool pool : pools_of_level(lv)) {
            const bool stopped = h->live().table(pool).any_of([&](const LiveRecord& r) {
                if (!shown_to_plugins(pool, r)) return false;
                allocscope_live_v2 live{};
                live.address = r.address;
                live.size = r.size;
                live.alloc_seq = r.seq;
                live.step = r.step;
                live.level = lv;
                live.stack_id = r.stack;
                live.layer = h->live_text(r.layer);
                live.phase = h->live_text(r.phase);
                ++visited;
                return visit(user, &live) != 0;
            });
            if (stopped) return visited;
        }
    }
    return visited;
}

uint64_t PluginHost::cb_live_bytes(void* ctx, uint32_t level) {
    PluginHost* h = static_cast<Instance*>(ctx)->host;
    if (level != ALLOCSCOPE_LEVEL_SEGMENT && level != ALLOCSCOPE_LEVEL_BLOCK &&
        level != ALLOCSCOPE_LEVEL_NONE)
        return 0;
    uint64_t bytes = 0;
    for (uint32_t lv : {uint32_t{ALLOCSCOPE_LEVEL_SEGMENT}, uint32_t{ALLOCSCOPE_LEVEL_BLOCK}}) {
        if (level != ALLOCSCOPE_LEVEL_NONE && level != lv) continue;
        for (Pool pool : pools_of_level(lv)) {
            bytes += h->live().totals(pool).live_bytes;
            // An owning host's table holds none: it never takes them in.
            if (pool == Pool::device_segment) bytes -= h->live().direct_driver_live_bytes();
            if (pool == Pool::device_block) bytes -= h->live().graph_pools().live_bytes;
        }
    }
    return bytes;
}

const char* PluginHost::cb_option(void* ctx, const char* key) {
    Instance* in = static_cast<Instance*>(ctx);
    if (!key) return nullptr;
    try {
        if (std::find(in->keys_read.begin(), in->keys_read.end(), key) == in->keys_read.end())
            in->keys_read.emplace_back(key);
        auto it = in->host->settings_.options.find(in->name + "." + key);
        return it == in->host->settings_.options.end() ? nullptr : it->second.c_str();
    } catch (...) {
        return nullptr;
    }
}

void PluginHost::cb_emit(void* ctx, const allocscope_finding_v2* f) {
    Instance* in = static_cast<Instance*>(ctx);
    if (!in->enabled || in->finished || !in->invalid_emit.empty()) return;
    // A malformed finding means the plugin's idea of the ABI is off; it is
    // dropped and the plugin disabled when its call returns.
    if (!f) {
        in->invalid_emit = "emitted a null finding";
        return;
    }
    if (f->struct_size < sizeof(allocscope_finding_v2)) {
        in->invalid_emit = "emitted a finding with struct_size " + std::to_string(f->struct_size) +
                           ", expected at least " + std::to_string(sizeof(allocscope_finding_v2));
        return;
    }
    store_finding(in, *f);
}

// The v1 adapter's emit: version 1's finding, whose fields version 2 added
// stay empty, unless the plugin was built against plugin_v1.h as it was
// between the versions, with basis and evidence notes appended (read when
// its struct_size covers them).
void PluginHost::cb_emit_v1(void* ctx, const allocscope_finding_v1* f) {
    Instance* in = static_cast<Instance*>(ctx);
    if (!in->enabled || in->finished || !in->invalid_emit.empty()) return;
    if (!f) {
        in->invalid_emit = "emitted a null finding";
        return;
    }
    if (f->struct_size < sizeof(allocscope_finding_v1)) {
        in->invalid_emit = "emitted a finding with struct_size " + std::to_string(f->struct_size) +
                           ", expected at least " + std::to_string(sizeof(allocscope_finding_v1));
        return;
    }
    allocscope_finding_v2 out{};
    out.struct_size = sizeof out;
    out.severity = f->severity;
    out.layer = f->layer;
    out.phase = f->phase;
    out.bytes = f->bytes;
    out.count = f->count;
    out.summary = f->summary;
    out.evidence = f->evidence;
    out.evidence_count = f->evidence_count;
    if (f->struct_size >= sizeof(FindingV1Appended)) {
        const auto* appended = reinterpret_cast<const FindingV1Appended*>(f);
        out.basis = appended->basis;
        out.evidence_notes = appended->evidence_notes;
    }
    store_finding(in, out);
}

void PluginHost::store_finding(Instance* in, const allocscope_finding_v2& finding) {
    const allocscope_finding_v2* f = &finding;
    if (f->severity > ALLOCSCOPE_SEVERITY_ERROR) {
        in->invalid_emit = "emitted a finding with invalid severity " + std::to_string(f->severity);
        return;
    }
    if (f->evidence_count > 0 && !f->evidence) {
        in->invalid_emit = "emitted a finding with evidence_count " +
                           std::to_string(f->evidence_count) + " but no evidence";
        return;
    }
    try {
        Finding out;
        out.plugin = in->name;
        out.severity = static_cast<Severity>(f->severity);
        out.rank = in->host->settings_.rank;
        if (out.rank < 0) out.pid = in->host->settings_.pid;
        out.layer = cstr(f->layer);
        out.phase = cstr(f->phase);
        out.bytes = f->bytes;
        out.count = f->count;
        out.summary = cstr(f->summary);
        out.basis = cstr(f->basis);
        const char* const* notes = f->evidence_notes;
        out.evidence.reserve(f->evidence_count);
        for (size_t i = 0; i < f->evidence_count; ++i) {
            const allocscope_evidence_v2& e = f->evidence[i];
            out.evidence.push_back({e.size, cstr(e.layer), cstr(e.phase), e.step, e.alloc_seq,
                                    e.free_seq, e.stack_id, notes ? cstr(notes[i]) : ""});
        }
        // A finding opens with its largest allocation (the report shows the
        // first evidence's stack): a 9 MiB weight copy before its 512 B
        // scale. Stable: equal sizes keep the plugin's order.
        std::stable_sort(out.evidence.begin(), out.evidence.end(),
                         [](const Evidence& a, const Evidence& b) { return a.size > b.size; });
        in->host->findings_.push_back(std::move(out));
    } catch (...) {
        in->invalid_emit = "a finding could not be stored (out of memory)";
    }
}

void PluginHost::cb_log(void* ctx, const char* message) {
    Instance* in = static_cast<Instance*>(ctx);
    if (!message) return;
    try {
        const PluginHost* h = in->host;
        std::string line;
        if (in->log_lines < kMaxLogLines) {
            line = "allocscope: plugin " + in->name + ": " + one_line(message);
        } else if (in->log_lines == kMaxLogLines) {
            line = "allocscope: plugin " + in->name + ": further messages suppressed";
        }
        ++in->log_lines;
        if (line.empty()) return;
        if (h->settings_.info) {
            h->settings_.info(line);
        } else {
            std::fprintf(stderr, "%s\n", line.c_str());
        }
    } catch (...) {
    }
}

}  // namespace allocscope
