// An out-of-tree plugin, "sdk-probe", built by tests/sdk/out_of_tree_test.sh
// against an installed allocscope (pkg-config --cflags allocscope) and
// nothing else: it counts the allocations of the followed level by base
// phase and emits one info finding at finish, so the test can see that it
// was loaded and ran.
#include <allocscope/sdk.h>

#include <cstdint>
#include <map>
#include <string>

namespace {

using namespace allocscope::plugins;

class Probe {
  public:
    explicit Probe(const allocscope_host_v2& host)
        : host_(host), level_(option_level(host, "level")) {}

    void on_event(const allocscope_event_v2& e) {
        if (e.kind != ALLOCSCOPE_EVENT_ALLOC && e.kind != ALLOCSCOPE_EVENT_FREE) return;
        bool switched = false;
        if (!level_.follow(e, &switched) || e.kind != ALLOCSCOPE_EVENT_ALLOC) return;
        if (switched) by_phase_.clear();
        Count& c = by_phase_[strings_.base_phase(strings_.tag(e.phase))];
        ++c.allocations;
        c.bytes += e.size;
    }
    void on_step(uint64_t, uint32_t) {}
    void finish() {
        Finding f;
        f.severity = ALLOCSCOPE_SEVERITY_INFO;
        f.summary = "sdk-probe:";
        for (const auto& [phase, c] : by_phase_) {
            const std::string& name = strings_.text(phase);
            f.summary += " " + (name.empty() ? std::string("(untagged)") : name) + " " +
                         std::to_string(c.allocations) + " (" + format_bytes(c.bytes) + ")";
            f.count += c.allocations;
            f.bytes += c.bytes;
        }
        emit(host_, f);
    }

  private:
    struct Count {
        uint64_t allocations = 0;
        uint64_t bytes = 0;
    };
    const allocscope_host_v2& host_;
    LevelFilter level_;
    Interner strings_;
    std::map<uint32_t, Count> by_phase_;
};

}  // namespace

ALLOCSCOPE_DEFINE_PLUGIN(Probe, "sdk-probe", "allocations by base phase (SDK test plugin)",
                         ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_ALLOC) |
                             ALLOCSCOPE_EVENT_BIT(ALLOCSCOPE_EVENT_FREE));
