// The host side of the detection plugin ABI (include/allocscope/plugin_v2.h,
// and version 1's plugin_v1.h through a v1 adapter): loads plugins, drives them with one rank's
// event stream and collects their findings. The same class runs live (the interposer's writer
// thread) and offline (`allocscope replay`, tests), so both deliver exactly the same calls for the
// same stream.
//
// A plugin's descriptor is looked up newest version first: allocscope_plugin_v2,
// then version 1's allocscope_plugin_v1 and allocscope_plugin. A version 1
// plugin is driven through the v1 adapter: it gets version 1 events (none of
// a kind version 1 did not have, such as DERIVED; an OOM event's address 0,
// as version 1 had it) and its findings get the fields version 1 lacked
// empty (no basis, no evidence notes).
//
// A plugin that cannot be loaded (no library, no symbol, another ABI version
// or struct size, an invalid name, a name already loaded), whose init,
// on_event, on_step or finish returns an error or throws, or that emits an
// invalid finding, is disabled with one warning naming it and why; the other
// plugins go on and findings it emitted before stay. A disabled plugin gets
// no further calls (not even finish).
//
// What the host does with each event (the ABI leaves it to the host):
//   * the live table is updated before the event is delivered, so during
//     on_event(ALLOC) the allocation is live and during on_event(FREE) it no
//     longer is; every level is tracked, pinned host memory included (it is
//     a segment-level allocation);
//   * a FREE whose real call failed (Event::result != 0) freed nothing and is
//     not delivered;
//   * on_step(step) is called when a STEP event carries a step other than the
//     current one, or any other event carries a larger one (its STEP event
//     was dropped or raced it), before that event;
//   * PARAM events add to the param registry; event->param_index is the
//     registry index (baseline params stay registered when the run begins,
//     so pointers from param() live until finish);
//   * a thread whose allocation failed (an OOM event) and that has not
//     allocated since is unwinding an error or dying of it: its TAG_POP
//     events are held back, because the scopes it leaves did not complete
//     (a detector judging "alive at the end of the scope" would judge the
//     unwinding). When the thread allocates again (the program caught the
//     error and went on), the held pops are delivered, in order, before that
//     allocation; when it never does, they never are, as for a process
//     killed inside its scopes;
//   * a change of `source` between feed() calls starts a new stream: the live
//     table is emptied and the step restarts at 0.
//
// The live table: owned, or a view of the caller's. There is one live set
// (core/replay.h): a host fed standalone (a recorded trace, `allocscope
// replay`, tests, a check scope) keeps its own Replay over the events it
// delivers. In the traced process the writer thread's Replay already holds
// every live allocation, so the host there is a view of it (view_live())
// instead of a second copy. What plugins observe is the same either way:
//   * the view hides what an owning host never takes in: physical handles
//     and VA reservations are pools it does not show, and plain driver
//     allocations (is_direct_driver_allocation) are skipped in live_foreach
//     and subtracted from live_bytes (Replay::direct_driver_live_bytes);
//   * the caller applies each event to its Replay, then feeds it with the
//     changes the Replay reported (feed(..., changes)): a free's alloc_*
//     fields, and a range unmap's one free per mapping, come from them, as
//     an owning host takes them from its own apply; a change that released
//     a plain driver allocation reads as a free of an unknown address;
//   * the records' tags are ids of the caller's string table (the one given
//     to view_live and feed), translated to the host's interned strings;
//   * an owning host applies an event after delivering the TAG_POPs that
//     event releases (a thread allocating again after an OOM): the caller
//     calls before_live_change(event) before applying it, so those pops see
//     the live set without it, as before;
//   * the view is of one stream: a change of `source` drops it and the host
//     owns an empty table from then.
// The view differs only where the owning table was wrong: an allocation
// released by a call no plugin sees (a plain driver free of a runtime
// allocation), or whose address a plain driver allocation took while its
// free was never seen, has left the view; an owning host keeps it live.
//
// Not thread-safe: one thread drives one host.
#pragma once

#include <allocscope/plugin_v2.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "event.h"
#include "findings.h"
#include "replay.h"
#include "string_table.h"
#include "trace_format.h"

namespace allocscope {

// A registered parameter, resolved.
struct ParamInfo {
    std::string_view layer;
    std::string_view name;
    std::string_view dtype;
    uint64_t numel = 0;
    uint64_t sharded_numel = 0;
};

// The strings of one event, resolved from its ids.
struct EventText {
    std::string_view layer;  // the event's tag
    std::string_view phase;
    std::string_view text;             // MARK: the note; DERIVED: how
    const ParamInfo* param = nullptr;  // PARAM: the parameter registered
};

struct PluginStatus {
    std::string entry;  // as requested (a name or a path)
    std::string name;   // the plugin's own name, "" if it never loaded
    std::string path;   // the library, "" for add()
    bool enabled = false;
    std::string reason;  // why it was disabled
};

struct HostSettings {
    int32_t rank = -1;       // -1: no rank
    uint32_t pid = 0;        // the process, named in findings when it has no rank
    int32_t world_size = 0;  // 0: unknown
    bool has_baseline = false;
    PluginOptions options;  // "<plugin>.<key>" -> value
    // One line each, without a trailing newline; default: stderr.
    std::function<void(const std::string&)> warn;  // a plugin disabled, a bad option
    std::function<void(const std::string&)> info;  // plugins' own log lines
};

// The file name of plugin `name` in a plugin directory.
std::string plugin_file_name(std::string_view name);
// [a-z0-9-]+, at most 64 characters.
bool valid_plugin_name(std::string_view name) noexcept;
// An entry of a plugin list is a path when it contains '/' or ends in ".so".
bool is_plugin_path(std::string_view entry) noexcept;
// Every allocscope-plugin-*.so in `dir` and its immediate subdirectories
// (a build tree keeps each plugin in its own folder), sorted by file name.
std::vector<std::string> discover_plugins(const std::string& dir);
// The first of `candidates` that is a directory, "" when none is.
std::string first_directory(const std::vector<std::string>& candidates);

class PluginHost {
  public:
    explicit PluginHost(HostSettings settings);
    ~PluginHost();  // calls finish() if it was not called
    PluginHost(const PluginHost&) = delete;
    PluginHost& operator=(const PluginHost&) = delete;

    // Loads and initializes the plugins of `entries` (names looked up in
    // `dir`, or paths); an empty list loads every plugin discover_plugins()
    // finds in `dir` ("" = none). Warns about options that name no loaded
    // plugin. Call before the first feed().
    void load(const std::vector<std::string>& entries, const std::string& dir);
    // A plugin descriptor already in memory (a plugin compiled into a test);
    // checked and initialized like a loaded one.
    void add(const allocscope_plugin_v2* plugin, const std::string& origin);
    // The same for a version 1 descriptor (driven through the v1 adapter).
    void add(const allocscope_plugin_v1* plugin, const std::string& origin);

    // Delivers one event with its strings resolved.
    void feed(const Event& event, const EventText& text, uint32_t source = ALLOCSCOPE_SOURCE_RUN);
    // Delivers one event whose ids index a trace's tables (string id ->
    // text, param index -> record), as the trace and the interposer hold them.
    void feed(const Event& event, std::span<const std::string> strings,
              std::span<const ParamRecord> params, uint32_t source = ALLOCSCOPE_SOURCE_RUN);
    // (A recorded trace is fed offline: analyze/plugin_replay.h.)

    // Makes this host a view of `live`, a Replay its caller applies every
    // event of the stream to, whose records' tag ids index `strings` (see
    // the top of this file). Both must outlive the host. Call before the
    // first feed(). The caller then, for each event:
    //   before_live_change(event); apply it to `live`, collecting the
    //   changes; feed(event, strings, params, changes).
    void view_live(const Replay& live, const std::vector<std::string>& strings);
    bool viewing() const noexcept { return view_ != nullptr; }
    // A viewing host: what an owning host delivers before the event changes
    // the live set (the pops it releases). Does nothing on an owning host.
    void before_live_change(const Event& event, uint32_t source = ALLOCSCOPE_SOURCE_RUN);
    // A viewing host: one event, after the viewed Replay applied it, with
    // the changes that reported, in order. An owning host ignores `changes`
    // and applies the event to its own table.
    void feed(const Event& event, std::span<const std::string> strings,
              std::span<const ParamRecord> params, std::span<const LiveChange> changes,
              uint32_t source = ALLOCSCOPE_SOURCE_RUN);

    // Calls finish on every enabled plugin; idempotent. No feed() after it.
    void finish();

    // Plugins still enabled (load failures and disabled ones excluded).
    size_t enabled_count() const noexcept;
    std::vector<PluginStatus> statuses() const;
    const std::vector<Finding>& findings() const noexcept { return findings_; }
    // This host's entry of a findings file.
    RankRun rank_run(const std::string& trace) const;
    // Both together: what a rank writes as findings.rank<R>.json.
    FindingsFile findings_file(const std::string& trace) const;

  private:
    struct Instance;
    struct StoredParam;

    void warn(const std::string& line) const;
    Instance& new_instance(const std::string& entry, const std::string& path);
    void reject(Instance& in, const std::string& reason);
    void install(Instance& in, const allocscope_plugin_v2* plugin);
    void install(Instance& in, const allocscope_plugin_v1* plugin, const char* symbol);
    // What both versions check and set up; false when `in` was rejected.
    bool admit(Instance& in, const char* name);
    void start(Instance& in);
    void disable(Instance& in, const std::string& reason);
    void reject_unread_options(Instance& in);
    void release(Instance& in);
    template <typename Call>
    void invoke(Instance& in, const char* what, Call&& call);
    void start_stream(uint32_t source);
    // `changes`: a viewing host's, what the viewed Replay reported for it.
    void deliver(const Event& event, uint32_t layer, uint32_t phase, const EventText& text,
                 uint32_t source, std::span<const LiveChange> changes);
    // Delivers the TAG_POPs held back for thread `tid`, if any.
    void release_held(uint32_t tid, uint32_t source);
    // The host's id of string `id` of a caller's table (cached per table).
    uint32_t host_string(std::span<const std::string> strings, uint32_t id);
    // The live set plugins read: the viewed Replay, or the host's own.
    const Replay& live() const noexcept { return view_ ? *view_ : live_; }
    // A live record's tag string (an id of the host's table, or of the
    // viewed caller's), interned. record_text may throw (out of memory);
    // live_text, for the callbacks, gives "" then.
    const char* record_text(uint32_t id);
    const char* live_text(uint32_t id) noexcept;

    // allocscope_host_v2 (and _v1) callbacks; ctx is the Instance.
    static size_t cb_param_count(void* ctx);
    static const allocscope_param_v2* cb_param(void* ctx, size_t index);
    static size_t cb_live_foreach(void* ctx, uint32_t level, allocscope_live_visitor_v2 visit,
                                  void* user);
    static uint64_t cb_live_bytes(void* ctx, uint32_t level);
    static const char* cb_option(void* ctx, const char* key);
    static void cb_emit(void* ctx, const allocscope_finding_v2* finding);
    static void cb_emit_v1(void* ctx, const allocscope_finding_v1* finding);
    // A finding (version 2's fields) stored for `in`, or why it is invalid.
    static void store_finding(Instance* in, const allocscope_finding_v2& finding);
    static void cb_log(void* ctx, const char* message);

    HostSettings settings_;
    std::vector<std::unique_ptr<Instance>> instances_;
    std::vector<Finding> findings_;
    std::deque<StoredParam> params_;  // a deque: param() pointers stay valid as it grows
    // The stream's param index (a PARAM event's aux) -> index in params_,
    // for DERIVED events; kUnmapped where the stream registered none.
    std::vector<uint32_t> param_index_;
    StringTable strings_;  // tag strings seen; the live table holds their ids
    // The caller's string table last fed, and its ids mapped to strings_'s.
    static constexpr uint32_t kUnmapped = UINT32_MAX;
    const std::string* mapped_table_ = nullptr;
    std::vector<uint32_t> mapped_;
    // The stream's live allocations: the one live set (core/replay.h, which
    // also splits a range unmap) over the events deliver() passes, their
    // tags as the host's string ids. Segments are its device_segment and
    // host_pinned pools, blocks its device_block pool. Empty while viewing.
    Replay live_;
    // A viewing host's: the caller's Replay and string table (view_live()).
    const Replay* view_ = nullptr;
    const std::vector<std::string>* view_strings_ = nullptr;
    // Threads after a failed allocation, and the TAG_POP events held back
    // meanwhile (see the top of this file), with their interned tag ids.
    struct HeldPop {
        Event event;
        uint32_t layer;
        uint32_t phase;
    };
    std::vector<std::pair<uint32_t, std::vector<HeldPop>>> failing_;
    uint32_t source_ = ALLOCSCOPE_SOURCE_RUN;
    uint64_t step_ = 0;
    bool finished_ = false;
    std::string provenance_;  // the run stream's last provenance mark (RankRun::provenance)
    // Provenance that pauses (ALLOCSCOPE_PROVENANCE_PAUSED / _RESUMED): the
    // steps observed since the last "on" mark, for RankRun::provenance.
    struct ProvenanceSteps {
        bool windowed = false;   // paused at least once
        bool observing = true;   // not paused now
        uint64_t on_step = 0;    // the step of the "on" mark
        uint64_t from = 0;       // the first step of the open window
        uint64_t last_step = 0;  // the run stream's latest step with a tag pushed
        std::vector<std::pair<uint64_t, uint64_t>> observed;  // closed windows, inclusive
        // A provenance mark (ALLOCSCOPE_PROVENANCE_MARK...) at `step`; true
        // for a pause or a resumption, which leave the status as it is.
        bool on_mark(std::string_view mark, uint64_t step);
        std::string text() const;  // "in steps 0–3, 100 of 0–140"
    } provenance_steps_;
};

}  // namespace allocscope
