#include "plugin_host.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>

#include <allocscope/sdk/flat_map.h>

#include "replay.h"
#include "trace_reader.h"

namespace allocscope {

namespace {

namespace fs = std::filesystem;

constexpr const char* kFilePrefix = "allocscope-plugin-";
constexpr const char* kFileSuffix = ".so";
// Beyond this a plugin's log lines are dropped (one line says so): a
// plugin that logs per event must not flood the traced program's stderr.
constexpr int kMaxLogLines = 100;

std::string one_line(std::string_view text) {
    std::string out(text);
    for (char& c : out) {
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) c = ' ';
    }
    return out;
}

std::string cstr(const char* s) {
    return s ? std::string(s) : std::string();
}

// The names a plugin's descriptor may be exported under, newest first (as
// NCCL looks for ncclNetPlugin_v9, then _v8, ...). The unversioned name of
// plugins built before the name carried the version is the last resort;
// install() checks abi_version whichever name it came by.
constexpr const char* kDescriptorSymbols[] = {ALLOCSCOPE_PLUGIN_SYMBOL,
                                              ALLOCSCOPE_PLUGIN_SYMBOL_UNVERSIONED};

const allocscope_plugin_v1* find_descriptor(void* handle) {
    for (const char* name : kDescriptorSymbols) {
        dlerror();
        if (void* sym = dlsym(handle, name)) return static_cast<const allocscope_plugin_v1*>(sym);
    }
    return nullptr;
}

std::string descriptor_names() {
    std::string out;
    for (const char* name : kDescriptorSymbols)
        out += (out.empty() ? "" : ", ") + std::string(name);
    return out;
}

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

struct PluginHost::Instance {
    PluginHost* host = nullptr;
    allocscope_host_v1 api{};
    const allocscope_plugin_v1* plugin = nullptr;
    void* handle = nullptr;  // dlopen handle, nullptr for add()
    void* state = nullptr;
    std::string entry;
    std::string path;
    std::string name;
    bool enabled = false;
    bool finished = false;
    std::string reason;
    std::string invalid_emit;  // set by emit(), acted on when the call returns
    int log_lines = 0;
};

// One level's live allocations as the plugins see them: only the pools
// deliver() passes, tags as the host's own string ids, restarted with each
// stream. A FlatMap without tombstones: the host need not tell an unknown
// free from a double free (the event's flags already do).
struct PluginHost::LiveSet {
    struct Live {
        uint64_t size = 0;
        uint64_t seq = 0;
        uint64_t step = 0;
        uint32_t stack = 0;
        uint32_t layer = 0;
        uint32_t phase = 0;
    };
    FlatMap<uint64_t, Live> by_address;
    uint64_t bytes = 0;
};

struct PluginHost::StoredParam {
    std::string layer, name, dtype;
    allocscope_param_v1 view{};
};

PluginHost::PluginHost(HostSettings settings)
    : settings_(std::move(settings)), live_(std::make_unique<LiveSet[]>(2)) {
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
        const allocscope_plugin_v1* descriptor = find_descriptor(handle);
        if (!descriptor) {
            reject(in, t.path +
                           " does not export '" ALLOCSCOPE_PLUGIN_SYMBOL_UNVERSIONED
                           "' under any name this allocscope knows (" +
                           descriptor_names() + ")");
            continue;
        }
        install(in, descriptor);
    }
    // A misspelt plugin name in an option would otherwise go unnoticed.
    for (const auto& [key, value] : settings_.options) {
        const std::string name = key.substr(0, key.find('.'));
        bool known = false;
        for (const auto& in : instances_)
            known = known || (in->plugin && in->name == name);
        if (!known) {
            warn("allocscope: plugin option '" + one_line(key) + "' names no loaded plugin ('" +
                 one_line(name) + "')");
        }
    }
}

void PluginHost::add(const allocscope_plugin_v1* plugin, const std::string& origin) {
    Instance& in = new_instance(origin, "");
    if (!plugin) {
        reject(in, "null plugin descriptor");
        return;
    }
    install(in, plugin);
}

void PluginHost::install(Instance& in, const allocscope_plugin_v1* p) {
    // abi_version first: a plugin of another version has another layout, so
    // its struct_size says nothing useful.
    if (p->abi_version != ALLOCSCOPE_PLUGIN_ABI_VERSION) {
        reject(in, "plugin ABI version " + std::to_string(p->abi_version) +
                       ", this allocscope supports version " +
                       std::to_string(ALLOCSCOPE_PLUGIN_ABI_VERSION));
        return;
    }
    if (p->struct_size != sizeof(allocscope_plugin_v1)) {
        reject(in, "struct_size " + std::to_string(p->struct_size) + ", expected " +
                       std::to_string(sizeof(allocscope_plugin_v1)) +
                       " (built against another plugin_v1.h)");
        return;
    }
    if (!p->name || !valid_plugin_name(p->name)) {
        reject(in, "invalid plugin name" +
                       (p->name ? " '" + one_line(p->name) + "'" : std::string(" (null)")) +
                       ": expected [a-z0-9-]+");
        return;
    }
    for (const auto& other : instances_) {
        if (other.get() != &in && other->name == p->name && other->plugin) {
            reject(in, "a plugin named '" + std::string(p->name) + "' is already loaded" +
                           (other->path.empty() ? std::string() : " from " + other->path));
            return;
        }
    }
    in.plugin = p;
    in.name = p->name;
    in.api.struct_size = sizeof(allocscope_host_v1);
    in.api.abi_version = ALLOCSCOPE_PLUGIN_ABI_VERSION;
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
    in.enabled = true;
    if (p->init) {
        invoke(in, "init", [&] { return p->init(&in.api, &in.state); });
    }
}

template <typename Call>
void PluginHost::invoke(Instance& in, const char* what, Call&& call) {
    if (!in.enabled) return;
    allocscope_plugin_status status = ALLOCSCOPE_PLUGIN_OK;
    try {
        status = call();
    } catch (const std::exception& e) {
        disable(in, std::string(what) + " threw: " + one_line(e.what()));
        return;
    } catch (...) {
        disable(in, std::string(what) + " threw an exception");
        return;
    }
    if (!in.invalid_emit.empty()) {
        disable(in, in.invalid_emit);
    } else if (status == ALLOCSCOPE_PLUGIN_ERROR) {
        disable(in, std::string(what) + " returned an error");
    } else if (status != ALLOCSCOPE_PLUGIN_OK) {
        disable(in, std::string(what) + " returned an invalid status " +
                        std::to_string(static_cast<int>(status)));
    }
}

// --- the stream ------------------------------------------------------------------

PluginHost::LiveSet& PluginHost::live(Level level) {
    return live_[level == Level::block ? 1 : 0];
}

void PluginHost::start_stream(uint32_t source) {
    source_ = source;
    mapped_table_ = nullptr;
    mapped_.clear();
    param_index_.clear();
    step_ = 0;
    live_ = std::make_unique<LiveSet[]>(2);
}

void PluginHost::feed(const Event& e, const EventText& text, uint32_t source) {
    if (finished_ || enabled_count() == 0) return;
    if (source != source_) start_stream(source);
    // Both ids first: the event's view points into the table's storage.
    const uint32_t layer = strings_.intern(text.layer).id;
    const uint32_t phase = strings_.intern(text.phase).id;
    deliver(e, layer, phase, text, source);
}

void PluginHost::deliver(const Event& e, uint32_t layer, uint32_t phase, const EventText& text,
                         uint32_t source) {
    // Detectors see the memory a program's tensors live in: runtime-API
    // segments, driver mappings (an expandable allocator's segments) and
    // blocks. Not physical handles and VA reservations (the mappings are the
    // memory a tag owns), and not plain driver allocations: those are
    // libraries' own (a cuBLAS handle made inside a layer's backward would
    // look like that layer's retained memory). Reports account for all.
    if (e.kind == EventKind::alloc || e.kind == EventKind::free || e.kind == EventKind::oom) {
        const Pool pool = pool_of(e);
        if (pool == Pool::physical || pool == Pool::address_range) return;
        if (is_direct_driver_allocation(e.api)) return;
    }
    allocscope_event_v1 ev{};
    ev.seq = e.seq;
    ev.t_ns = e.t_ns;
    ev.step = e.step;
    ev.address = e.address;
    ev.size = e.size;
    ev.kind = static_cast<uint32_t>(e.kind);
    ev.level = static_cast<uint32_t>(e.level);
    ev.source = source;
    ev.device = e.device;
    ev.tid = e.tid;
    ev.stack_id = e.stack;
    // Interned tag strings: the same text always at the same address, which
    // plugin_v1.h promises plugins (they may key by pointer).
    ev.layer = strings_.at(layer).c_str();
    ev.phase = strings_.at(phase).c_str();
    ev.alloc_layer = ev.alloc_phase = strings_.at(0).c_str();  // "", interned too
    ev.text = "";

    switch (e.kind) {
        case EventKind::alloc: {
            // An address already live (its free was never seen) is replaced.
            LiveSet& set = live(e.level);
            LiveSet::Live& r = set.by_address[e.address];
            set.bytes += e.size - r.size;
            r = {e.size, e.seq, e.step, e.stack, layer, phase};
            break;
        }
        case EventKind::free: {
            if (e.result != 0) return;  // the runtime refused: nothing was freed
            LiveSet& set = live(e.level);
            if (const LiveSet::Live* r = set.by_address.find(e.address)) {
                ev.size = r->size;
                ev.alloc_seq = r->seq;
                ev.alloc_step = r->step;
                ev.alloc_layer = strings_.at(r->layer).c_str();
                ev.alloc_phase = strings_.at(r->phase).c_str();
                ev.alloc_stack_id = r->stack;
                set.bytes -= r->size;
                set.by_address.erase(e.address);
            }
            break;
        }
        case EventKind::param: {
            if (text.param) {
                StoredParam& p = params_.emplace_back();
                p.layer = std::string(text.param->layer);
                p.name = std::string(text.param->name);
                p.dtype = std::string(text.param->dtype);
                p.view.layer = p.layer.c_str();
                p.view.name = p.name.c_str();
                p.view.dtype = p.dtype.c_str();
                p.view.numel = text.param->numel;
                p.view.sharded_numel = text.param->sharded_numel;
                ev.param_index = static_cast<uint32_t>(params_.size() - 1);
                if (e.aux < (uint32_t{1} << 24)) {  // a trace's indices are dense
                    if (param_index_.size() <= e.aux) param_index_.resize(e.aux + 1, kUnmapped);
                    param_index_[e.aux] = ev.param_index;
                }
            }
            break;
        }
        case EventKind::derived: {
            // About a parameter the stream never registered: nothing to say.
            if (e.aux >= param_index_.size() || param_index_[e.aux] == kUnmapped) return;
            ev.param_index = param_index_[e.aux];
            break;
        }
        default:
            break;
    }

    const bool step_changed = e.kind == EventKind::step ? e.step != step_ : e.step > step_;
    if (step_changed) {
        step_ = e.step;
        for (auto& in : instances_) {
            if (in->enabled && in->plugin->on_step) {
                invoke(*in, "on_step",
                       [&] { return in->plugin->on_step(in->state, step_, source); });
            }
        }
    }
    std::string note;
    if (e.kind == EventKind::mark || e.kind == EventKind::derived) {
        note = text.text;
        ev.text = note.c_str();
    }
    // A kind outside the mask's 32 bits reaches no plugin.
    const uint32_t bit = ev.kind < 32 ? ALLOCSCOPE_EVENT_BIT(ev.kind) : 0u;
    for (auto& in : instances_) {
        if (in->enabled && in->plugin->on_event && (in->plugin->event_mask & bit)) {
            invoke(*in, "on_event", [&] { return in->plugin->on_event(in->state, &ev); });
        }
    }
}

uint32_t PluginHost::host_string(std::span<const std::string> strings, uint32_t id) {
    // The caller's table only grows while it feeds one stream (a trace's,
    // the interposer's written strings); another table starts over.
    if (strings.data() != mapped_table_ || strings.size() < mapped_.size()) {
        mapped_table_ = strings.data();
        mapped_.clear();
    }
    if (id >= strings.size()) return 0;
    if (id >= mapped_.size()) mapped_.resize(strings.size(), kUnmapped);
    uint32_t& host = mapped_[id];
    if (host == kUnmapped) host = strings_.intern(strings[id]).id;
    return host;
}

void PluginHost::feed(const Event& e, std::span<const std::string> strings,
                      std::span<const ParamRecord> params, uint32_t source) {
    if (finished_ || enabled_count() == 0) return;
    if (source != source_) start_stream(source);
    auto str = [&strings](uint32_t id) -> std::string_view {
        return id < strings.size() ? std::string_view(strings[id]) : std::string_view();
    };
    EventText text;
    ParamInfo param;
    if (e.kind == EventKind::mark) text.text = str(e.aux);
    if (e.kind == EventKind::derived) text.text = str(static_cast<uint32_t>(e.stream));
    if (e.kind == EventKind::param && e.aux < params.size()) {
        const ParamRecord& p = params[e.aux];
        param.layer = str(p.layer);
        param.name = str(p.name);
        param.dtype = str(p.dtype);
        param.numel = p.numel;
        param.sharded_numel = p.sharded_numel;
        text.param = &param;
    }
    const uint32_t layer = host_string(strings, e.layer);
    const uint32_t phase = host_string(strings, e.phase);
    deliver(e, layer, phase, text, source);
}

void PluginHost::feed_trace(const Trace& trace, uint32_t source) {
    for (const Event& e : trace.events)
        feed(e, trace.strings, trace.params, source);
}

void PluginHost::finish() {
    if (finished_) return;
    finished_ = true;
    for (auto& in : instances_) {
        if (!in->enabled) continue;
        if (in->plugin->finish) {
            invoke(*in, "finish", [&] { return in->plugin->finish(in->state); });
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

const allocscope_param_v1* PluginHost::cb_param(void* ctx, size_t index) {
    const PluginHost* h = static_cast<Instance*>(ctx)->host;
    return index < h->params_.size() ? &h->params_[index].view : nullptr;
}

size_t PluginHost::cb_live_foreach(void* ctx, uint32_t level, allocscope_live_visitor_v1 visit,
                                   void* user) {
    PluginHost* h = static_cast<Instance*>(ctx)->host;
    if (!visit) return 0;
    size_t visited = 0;
    for (uint32_t lv : {uint32_t{ALLOCSCOPE_LEVEL_SEGMENT}, uint32_t{ALLOCSCOPE_LEVEL_BLOCK}}) {
        if (level != 0 && level != lv) continue;
        const bool stopped = h->live(static_cast<Level>(lv))
                                 .by_address.any_of([&](uint64_t address, const LiveSet::Live& r) {
                                     allocscope_live_v1 live{};
                                     live.address = address;
                                     live.size = r.size;
                                     live.alloc_seq = r.seq;
                                     live.step = r.step;
                                     live.level = lv;
                                     live.stack_id = r.stack;
                                     live.layer = h->strings_.at(r.layer).c_str();
                                     live.phase = h->strings_.at(r.phase).c_str();
                                     ++visited;
                                     return visit(user, &live) != 0;
                                 });
        if (stopped) break;
    }
    return visited;
}

uint64_t PluginHost::cb_live_bytes(void* ctx, uint32_t level) {
    PluginHost* h = static_cast<Instance*>(ctx)->host;
    if (level == ALLOCSCOPE_LEVEL_SEGMENT) return h->live(Level::segment).bytes;
    if (level == ALLOCSCOPE_LEVEL_BLOCK) return h->live(Level::block).bytes;
    if (level == ALLOCSCOPE_LEVEL_NONE)
        return h->live(Level::segment).bytes + h->live(Level::block).bytes;
    return 0;
}

const char* PluginHost::cb_option(void* ctx, const char* key) {
    const Instance* in = static_cast<Instance*>(ctx);
    if (!key) return nullptr;
    try {
        auto it = in->host->settings_.options.find(in->name + "." + key);
        return it == in->host->settings_.options.end() ? nullptr : it->second.c_str();
    } catch (...) {
        return nullptr;
    }
}

void PluginHost::cb_emit(void* ctx, const allocscope_finding_v1* f) {
    Instance* in = static_cast<Instance*>(ctx);
    if (!in->enabled || in->finished || !in->invalid_emit.empty()) return;
    // A malformed finding means the plugin's idea of the ABI is off; it is
    // dropped and the plugin disabled when its call returns.
    if (!f) {
        in->invalid_emit = "emitted a null finding";
        return;
    }
    if (f->struct_size < ALLOCSCOPE_FINDING_V1_BASE_SIZE) {
        in->invalid_emit = "emitted a finding with struct_size " + std::to_string(f->struct_size) +
                           ", expected at least " + std::to_string(ALLOCSCOPE_FINDING_V1_BASE_SIZE);
        return;
    }
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
        out.layer = cstr(f->layer);
        out.phase = cstr(f->phase);
        out.bytes = f->bytes;
        out.count = f->count;
        out.summary = cstr(f->summary);
        // Fields appended to the struct: read only when it has them.
        const bool extended = f->struct_size >= sizeof(allocscope_finding_v1);
        const char* const* notes = extended ? f->evidence_notes : nullptr;
        if (extended) out.basis = cstr(f->basis);
        out.evidence.reserve(f->evidence_count);
        for (size_t i = 0; i < f->evidence_count; ++i) {
            const allocscope_evidence_v1& e = f->evidence[i];
            out.evidence.push_back({e.size, cstr(e.layer), cstr(e.phase), e.step, e.alloc_seq,
                                    e.free_seq, e.stack_id, notes ? cstr(notes[i]) : ""});
        }
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
