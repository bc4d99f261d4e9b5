#include "checks.h"

#include <unistd.h>

#include <chrono>
#include <exception>
#include <utility>

#include "config.h"
#include "plugin_host.h"

namespace allocscope {

namespace {

// How long a program thread waits for the writer: loading plugins, or
// draining and finishing a check. The writer polls at least every 20 ms.
constexpr auto kPatience = std::chrono::seconds(60);

}  // namespace

struct CheckSet::Check {
    enum class State { requested, running, ending, done };

    uint64_t id = 0;
    State state = State::requested;
    // The request.
    std::vector<std::string> plugins;
    PluginOptions options;
    Settings settings;
    // Ring positions: the first event of the check and the first after it.
    uint64_t start = 0;
    uint64_t end = UINT64_MAX;
    // Writer thread only, while running or ending.
    std::unique_ptr<PluginHost> host;
    bool primed = false;
    bool abandoned = false;  // its waiter gave up; dropped once done
    // Written by the writer under the mutex; read by the waiter once done
    // (or running, for a begin error).
    std::vector<std::string> warnings;
    std::string error;
    std::vector<Finding> findings;
};

CheckSet::CheckSet() = default;
CheckSet::~CheckSet() = default;

bool CheckSet::busy() const noexcept {
    return active_.load(std::memory_order_acquire) != 0;
}

std::shared_ptr<CheckSet::Check> CheckSet::find_locked(uint64_t id) const {
    for (const auto& c : checks_) {
        if (c->id == id) return c;
    }
    return nullptr;
}

uint64_t CheckSet::begin(const std::string& plugins, const std::string& options,
                         const Settings& settings, std::string& error) {
    auto check = std::make_shared<Check>();
    bool off = false;
    // "" (NULL in the C API): every plugin of the directory.
    if (!plugins.empty() && !parse_plugin_list(plugins, check->plugins, off, error)) {
        error = "bad plugin list: " + error;
        return 0;
    }
    if (off) {
        error = "a check needs at least one plugin (the list is 'none')";
        return 0;
    }
    if (!parse_plugin_options(options, check->options, error)) {
        error = "bad plugin option: " + error;
        return 0;
    }
    check->settings = settings;

    std::unique_lock lock(mutex_);
    if (!closed_.empty()) {
        error = closed_;
        return 0;
    }
    check->id = next_id_++;
    checks_.push_back(check);
    active_.fetch_add(1, std::memory_order_acq_rel);
    const bool answered =
        changed_.wait_for(lock, kPatience, [&] { return check->state != Check::State::requested; });
    if (!answered) {
        error = "the recorder did not load the plugins within 60 s";
        check->state = Check::State::done;  // the writer skips it
        std::erase(checks_, check);
        active_.fetch_sub(1, std::memory_order_acq_rel);
        return 0;
    }
    if (!check->error.empty()) {
        error = check->error;
        return 0;
    }
    return check->id;
}

bool CheckSet::end(uint64_t id, uint64_t end, Outcome& out) {
    std::unique_lock lock(mutex_);
    std::shared_ptr<Check> check = find_locked(id);
    if (!check || check->state != Check::State::running) {
        out.error = "no check " + std::to_string(id) + " is running";
        return false;
    }
    check->end = std::max(end, check->start);
    check->state = Check::State::ending;
    const bool answered =
        changed_.wait_for(lock, kPatience, [&] { return check->state == Check::State::done; });
    if (!answered) {
        out.error =
            "the recorder did not deliver the check's events within 60 s; the check is abandoned";
        check->abandoned = true;  // the writer finishes and drops it when it catches up
        return false;
    }
    out.findings = std::move(check->findings);
    out.error = check->error;
    std::erase(checks_, check);
    return out.error.empty();
}

void CheckSet::prime(Check& c, const Tables& tables) {
    if (c.primed) return;
    c.primed = true;
    // The parameters registered before the check: plugins that look for
    // weight-derived sizes need them (a model registers them once).
    for (uint32_t index : registered_) {
        Event e;
        e.kind = EventKind::param;
        e.aux = index;
        c.host->feed(e, tables.strings, tables.params);
    }
}

void CheckSet::finish(Check& c, const Tables& tables) {
    std::string error;
    std::vector<Finding> findings;
    try {
        prime(c, tables);
        c.host->finish();
        findings = c.host->findings();
        for (const PluginStatus& s : c.host->statuses()) {
            if (s.enabled) continue;
            if (!error.empty()) error += "; ";
            error += "plugin " + (s.name.empty() ? s.entry : s.name) + " failed: " + s.reason;
        }
    } catch (const std::exception& e) {
        error = std::string("the check's plugins stopped: ") + e.what();
    }
    c.host.reset();
    std::lock_guard lock(mutex_);
    c.findings = std::move(findings);
    if (!error.empty()) c.error += (c.error.empty() ? "" : "; ") + error;
    c.state = Check::State::done;
    active_.fetch_sub(1, std::memory_order_acq_rel);
    if (c.abandoned) std::erase_if(checks_, [&c](const auto& p) { return p.get() == &c; });
}

void CheckSet::service(uint64_t next, const Tables& tables) {
    if (!busy()) return;
    std::vector<std::shared_ptr<Check>> load, ended;
    {
        std::lock_guard lock(mutex_);
        for (const auto& c : checks_) {
            if (c->state == Check::State::requested) load.push_back(c);
            if (c->state == Check::State::ending && next >= c->end) ended.push_back(c);
        }
    }
    for (const auto& c : load) {
        std::string error;
        std::vector<std::string> warnings, logs;
        std::unique_ptr<PluginHost> host;
        try {
            HostSettings hs;
            hs.rank = c->settings.rank;
            hs.pid = static_cast<uint32_t>(getpid());
            hs.world_size = c->settings.world_size;
            hs.options = c->options;
            hs.warn = [&warnings](const std::string& line) { warnings.push_back(line); };
            hs.info = [&logs](const std::string& line) { logs.push_back(line); };
            host = std::make_unique<PluginHost>(std::move(hs));
            host->load(c->plugins, c->settings.plugin_dir);
            // A plugin that did not load, or an option no plugin takes: the
            // check would not test what was asked.
            for (const std::string& w : warnings)
                error += (error.empty() ? "" : "; ") + w;
            if (error.empty() && host->enabled_count() == 0) {
                error = "no plugin found in '" + c->settings.plugin_dir + "'";
            }
            // What the plugins logged says why one refused to start.
            if (!error.empty()) {
                for (const std::string& line : logs)
                    error += "; " + line;
            }
        } catch (const std::exception& e) {
            error = std::string("cannot start the check's plugins: ") + e.what();
        }
        std::lock_guard lock(mutex_);
        if (c->state != Check::State::requested) continue;  // abandoned meanwhile
        if (error.empty()) {
            c->host = std::move(host);
            c->start = next;
            c->state = Check::State::running;
        } else {
            c->error = error;
            c->state = Check::State::done;
            std::erase(checks_, c);
            active_.fetch_sub(1, std::memory_order_acq_rel);
        }
    }
    for (const auto& c : ended)
        finish(*c, tables);
    if (!load.empty() || !ended.empty()) changed_.notify_all();
}

void CheckSet::feed(std::span<const Event> batch, uint64_t first, const Tables& tables) {
    if (!busy()) {
        for (const Event& e : batch) {
            if (e.kind == EventKind::param) registered_.push_back(e.aux);
        }
        return;
    }
    struct Running {
        std::shared_ptr<Check> check;
        uint64_t end;
        bool failed;
    };
    std::vector<Running> running;
    {
        std::lock_guard lock(mutex_);
        for (const auto& c : checks_) {
            if ((c->state == Check::State::running || c->state == Check::State::ending) &&
                c->host) {
                running.push_back({c, c->end, false});
            }
        }
    }
    // Event by event, so a check primed in the middle of the batch gets
    // the parameters registered before its first event, and only those.
    for (size_t i = 0; i < batch.size(); ++i) {
        const uint64_t position = first + i;
        for (Running& r : running) {
            Check& c = *r.check;
            if (r.failed || position < c.start || position >= r.end) continue;
            try {
                prime(c, tables);
                c.host->feed(batch[i], tables.strings, tables.params);
            } catch (const std::exception& e) {
                // The host's own bookkeeping ran out of memory: end() says so.
                r.failed = true;
                std::lock_guard lock(mutex_);
                c.error = std::string("the check's plugins stopped: ") + e.what();
            }
        }
        if (batch[i].kind == EventKind::param) registered_.push_back(batch[i].aux);
    }
}

void CheckSet::close(const std::string& why) {
    std::lock_guard lock(mutex_);
    closed_ = why;
    for (const auto& c : checks_) {
        if (c->state == Check::State::done) continue;
        c->error = why;
        c->state = Check::State::done;
        c->host.reset();
        active_.fetch_sub(1, std::memory_order_acq_rel);
    }
    changed_.notify_all();
}

}  // namespace allocscope
