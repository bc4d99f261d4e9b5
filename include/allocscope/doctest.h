// allocscope checks in a doctest suite: assert that a stretch of a test,
// a training step say, leaves the detection plugins nothing to report.
//
//   #include <allocscope/doctest.h>
//
//   TEST_CASE("a training step keeps no FP8 weight copies") {
//       allocscope::testing::Check check("weight-copy-accumulation,transpose-cache-retention");
//       model.train_step(batch);
//       ALLOCSCOPE_CHECK_NO_FINDINGS(check);
//   }
//
// Run the suite under allocscope (`allocscope run -- ./tests`, or with
// LD_PRELOAD=<libdir>/liballocscope.so). The check's plugins see only the
// events between the Check's construction and the assertion, in instances
// of their own (plugin options go in the second argument, as
// "<plugin>.<key>=<value>,..."); parameters registered before count.
// Without liballocscope.so, or when the check cannot run (a plugin that
// does not load, a bad option), the assertion fails and says why: a check
// that cannot look never passes.
//
// ALLOCSCOPE_CHECK_NO_FINDINGS fails on warnings and errors (peak-owner's
// info findings are reports, not problems); _AT(check, severity) sets the
// level (ALLOCSCOPE_SEVERITY_INFO fails on any finding). The REQUIRE forms
// end the test case on failure. Check::end() returns the findings for
// assertions of one's own.
//
// Header-only; needs <doctest/doctest.h> and links nothing (the check API
// is found at run time, <allocscope/allocscope_dl.h>).
#pragma once

#include <allocscope/allocscope_dl.h>
#include <allocscope/plugin_v2.h>
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace allocscope::testing {

struct Finding {
    std::string plugin;
    uint32_t severity = ALLOCSCOPE_SEVERITY_INFO;  // allocscope_severity_v2
    int32_t rank = -1;
    std::string layer;
    std::string phase;
    uint64_t bytes = 0;
    uint64_t count = 0;
    std::string summary;
    std::string stack;  // one frame per line, "" when none (allocscope_check_finding)
};

inline const char* severity_name(uint32_t severity) {
    return severity == ALLOCSCOPE_SEVERITY_ERROR     ? "error"
           : severity == ALLOCSCOPE_SEVERITY_WARNING ? "warning"
                                                     : "info";
}

// One check: begins when constructed, ends at end() (or, unread, when
// destroyed).
class Check {
  public:
    explicit Check(const char* plugins = nullptr, const char* options = nullptr) {
        char error[1024] = "";
        id_ = allocscope_dl_check_begin(plugins, options, error, sizeof error);
        if (id_ == 0) error_ = error;
    }
    ~Check() {
        if (id_ != 0) allocscope_dl_check_end(id_, nullptr, nullptr, nullptr, 0);
    }
    Check(const Check&) = delete;
    Check& operator=(const Check&) = delete;

    // Ends the check and returns its findings. When the check did not run
    // (or not to its end), error() says why; the findings made are returned
    // anyway. A second call returns nothing.
    std::vector<Finding> end() {
        std::vector<Finding> out;
        if (id_ == 0) return out;
        char error[1024] = "";
        const int rc = allocscope_dl_check_end(
            id_,
            [](void* user, const allocscope_check_finding* f) {
                static_cast<std::vector<Finding>*>(user)->push_back(
                    {f->plugin ? f->plugin : "", f->severity, f->rank, f->layer ? f->layer : "",
                     f->phase ? f->phase : "", f->bytes, f->count, f->summary ? f->summary : "",
                     f->stack ? f->stack : ""});
            },
            &out, error, sizeof error);
        id_ = 0;
        if (rc != 0) error_ = error;
        return out;
    }

    // Why the check did not run or complete; "" when it did (so far).
    const std::string& error() const { return error_; }

  private:
    uint64_t id_ = 0;
    std::string error_;
};

// A check's verdict: clean, or a report of what is wrong.
struct Verdict {
    bool clean = true;
    std::string report;
};

// Ends `check` and judges it: findings at or above `severity` fail it, and
// so does a check that did not run.
inline Verdict conclude(Check& check, uint32_t severity) {
    const std::vector<Finding> findings = check.end();
    Verdict v;
    if (!check.error().empty()) {
        v.clean = false;
        v.report = "allocscope check did not run: " + check.error() + "\n";
    }
    size_t failing = 0;
    std::string lines;
    for (const Finding& f : findings) {
        if (f.severity < severity) continue;
        ++failing;
        lines += "  " + f.plugin + " [" + severity_name(f.severity) + "] " + f.summary + "\n";
        // The stack under its finding, indented one level further.
        size_t start = 0;
        while (start < f.stack.size()) {
            size_t end = f.stack.find('\n', start);
            if (end == std::string::npos) end = f.stack.size();
            lines += "      " + f.stack.substr(start, end - start) + "\n";
            start = end + 1;
        }
    }
    if (failing > 0) {
        v.clean = false;
        v.report += "allocscope: " + std::to_string(failing) + " finding(s) at or above " +
                    severity_name(severity) + ":\n" + lines;
    }
    return v;
}

}  // namespace allocscope::testing

#define ALLOCSCOPE_CHECK_NO_FINDINGS_AT(check, severity)                      \
    do {                                                                      \
        const ::allocscope::testing::Verdict allocscope_verdict_ =            \
            ::allocscope::testing::conclude((check), (severity));             \
        CHECK_MESSAGE(allocscope_verdict_.clean, allocscope_verdict_.report); \
    } while (false)

#define ALLOCSCOPE_REQUIRE_NO_FINDINGS_AT(check, severity)                      \
    do {                                                                        \
        const ::allocscope::testing::Verdict allocscope_verdict_ =              \
            ::allocscope::testing::conclude((check), (severity));               \
        REQUIRE_MESSAGE(allocscope_verdict_.clean, allocscope_verdict_.report); \
    } while (false)

#define ALLOCSCOPE_CHECK_NO_FINDINGS(check) \
    ALLOCSCOPE_CHECK_NO_FINDINGS_AT(check, ALLOCSCOPE_SEVERITY_WARNING)
#define ALLOCSCOPE_REQUIRE_NO_FINDINGS(check) \
    ALLOCSCOPE_REQUIRE_NO_FINDINGS_AT(check, ALLOCSCOPE_SEVERITY_WARNING)
