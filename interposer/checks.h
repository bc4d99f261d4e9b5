// Scoped checks: allocscope_check_begin / allocscope_check_end of the public
// C API (include/allocscope/allocscope.h), which include/allocscope/doctest.h
// wraps for a program's own test suite.
//
// A check is a private PluginHost with its own plugin instances, fed by the
// writer thread with the events between the check's begin and its end, as
// the run's live plugins are fed with all of them. Plugins are loaded,
// driven and finished on the writer thread only (plugin_v2.h promises that
// no call comes from the program's threads); the program's thread that
// begins or ends a check waits for the writer to do it.
//
//   program thread                 writer thread
//   begin(): request ---------->   service(): load the plugins; the check
//            <--- id or error      starts at the next event it drains
//   ... events ...                 feed(): each event of the check's range
//   end(): end position ------->   service(): once every event before the
//          <--- findings           end is fed: finish, keep the findings
//
// Events other threads record while begin or end runs may or may not be
// part of the check; those of the calling thread before end are.
//
// A check's host owns its live table: it is not a view of the writer's
// Replay, as the run's live plugins' host is (core/plugin_host.h). Its
// plugins see the allocations made since the check began (one made before
// it is not live to them, and its free is of an unknown address), and they
// read that set at the check's end, in finish, which comes once the writer
// has drained past the end, often well after it. A view would have to hide
// the allocations before the scope and keep its own live bytes for the
// rest (a second table in all but name), and could not show the set as it
// was at the end once the writer's Replay had moved on. The table holds
// only what the scope allocated and is gone when the check ends.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "event.h"
#include "findings.h"
#include "trace_format.h"

namespace allocscope {

class CheckSet {
  public:
    struct Settings {
        int32_t rank = -1;
        int32_t world_size = 0;
        std::string plugin_dir;  // where plugin names are looked up
    };
    // The writer's definition tables: string id -> text, param index ->
    // record.
    struct Tables {
        const std::vector<std::string>& strings;
        const std::vector<ParamRecord>& params;
    };
    struct Outcome {
        std::vector<Finding> findings;
        std::string error;  // "" when the check ran to its end
    };

    CheckSet();
    ~CheckSet();
    CheckSet(const CheckSet&) = delete;
    CheckSet& operator=(const CheckSet&) = delete;

    // --- program threads ---
    // Starts a check of `plugins` (a plugin list as ALLOCSCOPE_PLUGINS; ""
    // = every plugin in the directory) with `options` ("<plugin>.<key>=
    // <value>,..."). Waits for the writer to load them. Returns the check's
    // id (> 0), or 0 with `error` set.
    uint64_t begin(const std::string& plugins, const std::string& options, const Settings& settings,
                   std::string& error);
    // Ends check `id`, whose events are those before ring position `end`;
    // waits for the writer to feed and finish it. False (with out.error)
    // when it could not complete; findings made so far are in out anyway.
    bool end(uint64_t id, uint64_t end, Outcome& out);

    // --- writer thread ---
    // Loads the plugins of requested checks (a started check's first event
    // is the one at `next`, the next position the writer drains) and
    // finishes ended checks once `next` reached their end.
    void service(uint64_t next, const Tables& tables);
    // Feeds `batch` (ring positions first, first + 1, ...) to the checks
    // whose range holds them. Every drained batch comes here, checks or
    // not: the parameters registered so far are kept for later checks.
    void feed(std::span<const Event> batch, uint64_t first, const Tables& tables);
    // Recording stops: every check still running or waited for fails with
    // `why`; later begin/end calls fail too.
    void close(const std::string& why);
    // Whether any check is requested or running (cheap, lock-free).
    bool busy() const noexcept;

  private:
    struct Check;
    std::shared_ptr<Check> find_locked(uint64_t id) const;
    void prime(Check& c, const Tables& tables);
    void finish(Check& c, const Tables& tables);

    mutable std::mutex mutex_;
    std::condition_variable changed_;
    std::vector<std::shared_ptr<Check>> checks_;
    uint64_t next_id_ = 1;
    std::string closed_;  // why checks can no longer run; "" while they can
    std::atomic<uint32_t> active_{0};
    std::vector<uint32_t> registered_;  // writer: param indexes, in event order
};

}  // namespace allocscope
