// NVTX end to end: tests/e2e/nvtx_program.cpp under `allocscope run --nvtx`
// (liballocscope.so preloaded and the NVTX injection library), and with
// liballocscope.so as the injection library only. Environment
// (tests/meson.build):
//   E2E_CLI         build/tools/allocscope
//   E2E_PROGRAM     build/tests/nvtx_program
//   E2E_INTERPOSER  build/interposer/liballocscope.so
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "support.h"
#include "trace_reader.h"

using namespace allocscope;
using namespace allocscope::test;

namespace {

struct Tag {
    std::string layer;
    std::string phase;
    uint64_t step = 0;
    bool operator==(const Tag&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Tag& t) {
    return os << "(" << t.layer << ", " << t.phase << ", step " << t.step << ")";
}

struct Run {
    TempDir scratch;
    int status = -1;
    std::string out, err;
    std::vector<Trace> traces;

    // `command` with every "{out}" replaced by the run's output directory.
    explicit Run(std::string command) {
        const std::string dir = (scratch / "out").string();
        for (size_t at = command.find("{out}"); at != std::string::npos;
             at = command.find("{out}", at + dir.size())) {
            command.replace(at, 5, dir);
        }
        status = sh(command, &out, &err);
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(scratch / "out", ec)) {
            if (e.path().extension() == ".trace") traces.push_back(load_trace(e.path().string()));
        }
    }

    const Trace& trace() const {
        REQUIRE(traces.size() == 1);
        return traces.front();
    }
    // The tag of every allocation, by its size (the program's are distinct).
    std::map<uint64_t, Tag> tags() const {
        std::map<uint64_t, Tag> by_size;
        const Trace& t = trace();
        for (const Event& e : t.events) {
            if (e.kind == EventKind::alloc)
                by_size[e.size] = {t.str(e.layer), t.str(e.phase), e.step};
        }
        return by_size;
    }
    std::vector<std::string> marks() const {
        std::vector<std::string> texts;
        const Trace& t = trace();
        for (const Event& e : t.events) {
            if (e.kind == EventKind::mark) texts.push_back(t.str(e.aux));
        }
        return texts;
    }
};

std::string run_nvtx(const std::string& mode) {
    return env("E2E_CLI") + " run --nvtx --plugins none --out {out} -- " + env("E2E_PROGRAM") +
           " " + mode;
}

const Run& fsdp_run() {
    static Run run(run_nvtx("fsdp"));
    return run;
}

const Run& odd_run() {
    static Run run(run_nvtx("odd"));
    return run;
}

bool has(const std::vector<std::string>& texts, const std::string& text) {
    return std::find(texts.begin(), texts.end(), text) != texts.end();
}

}  // namespace

TEST_CASE("FSDP2's range names tag allocations with their module and phase") {
    const Run& r = fsdp_run();
    INFO(r.err);
    REQUIRE(r.status == 0);
    const std::map<uint64_t, Tag> tags = r.tags();
    const std::map<uint64_t, Tag> expected = {
        {1001, {"", "forward", 3}},                              // FSDP::root_pre_forward
        {1002, {"layers.0", "forward/all_gather", 3}},           // all_gather in pre_forward
        {1003, {"layers.0", "forward/all_gather_copy_out", 3}},  //
        {1004, {"", "", 3}},                                     // aten::linear: no tag
        {1005, {"layers.0", "forward", 3}},                      // post_forward
        {1006, {"loss", "backward", 4}},                         // allocscope:loss/backward
        {1007, {"layers.1", "backward", 4}},                     // pre_backward, own thread
        {1008, {"layers.0", "backward/all_gather", 4}},          // backward_prefetch for layers.0
        {1009, {"layers.1", "backward/reduce_scatter", 4}},      // in post_backward_reduce
        {1010, {"", "", 4}},                                     // backward thread, all popped
        {1011, {"optimizer", "optimizer", 4}},                   //
        {1012, {"", "", 4}},                                     //
    };
    for (const auto& [size, tag] : expected) {
        CAPTURE(size);
        REQUIRE(tags.count(size) == 1);
        CHECK(tags.at(size) == tag);
    }
}

TEST_CASE("odd NVTX names and calls never unbalance the tag stack") {
    const Run& r = odd_run();
    INFO(r.err);
    REQUIRE(r.status == 0);
    const std::map<uint64_t, Tag> tags = r.tags();
    const std::map<uint64_t, Tag> expected = {
        // NULL, unknown, malformed, control characters, an unknown message
        // type, a short struct, a forged and a NULL string: pushed, no tag.
        {2001, {"layers.0", "forward", 0}},
        {2002, {"layers.0", "forward", 0}},          // their pops left layers.0 alone
        {2003, {"layers.\xc3\xbc", "backward", 0}},  // nvtxRangePushW, UTF-8
        {2004, {"layers.1", "backward/wgrad", 0}},   // registered string in a domain
        {2005, {"layers.1", "backward/wgrad", 0}},   // domain popped under the default
        {2006, {"layers.0", "forward", 0}},          // ...and left with it
        {2007, {"layers.2", "forward", 0}},          // nvtxRangeStartA
        {2008, {"layers.3", "forward", 0}},          // the first ended out of order
        {2009, {"layers.0", "forward", 0}},          // both left with the second
        {2010, {"layers.4", "forward", 0}},          // ended on another thread
        {2011, {"layers.0", "forward", 0}},          // left at this thread's next call
        {2012, {"", "", 0}},                         //
        {2013, {"", "", 9}},                         // allocscope:step=9
        {2014, {"deep", "forward", 9}},              // 150 deep
        {2015, {"", "", 9}},                         //
    };
    for (const auto& [size, tag] : expected) {
        CAPTURE(size);
        REQUIRE(tags.count(size) == 1);
        CHECK(tags.at(size) == tag);
    }
    const std::vector<std::string> marks = r.marks();
    CHECK(has(marks, "odd mode done"));
    CHECK_FALSE(has(marks, "unrelated mark"));
    CHECK(has(marks, "nvtx: a range pop without an open push was ignored"));
    CHECK(has(marks,
              "nvtx: a tagged range ended before a range opened after it; its tag is left when "
              "that range ends"));
    CHECK(has(marks,
              "nvtx: a tagged range ended on another thread; its tag is left at its own "
              "thread's next NVTX call"));
    CHECK(r.trace().footer.has_value());
}

TEST_CASE("as the injection library only, liballocscope.so records NVTX tags but no allocations") {
    Run r("ALLOCSCOPE_OUT={out} ALLOCSCOPE_PLUGINS=none NVTX_INJECTION64_PATH=" +
          env("E2E_INTERPOSER") + " " + env("E2E_PROGRAM") + " fsdp");
    INFO(r.err);
    REQUIRE(r.status == 0);
    const Trace& t = r.trace();
    CHECK(t.footer.has_value());
    std::vector<std::string> pushed;
    size_t allocs = 0;
    for (const Event& e : t.events) {
        if (e.kind == EventKind::tag_push) pushed.push_back(t.str(e.layer) + " " + t.str(e.phase));
        allocs += e.kind == EventKind::alloc;
    }
    CHECK(allocs == 0);
    CHECK(has(pushed, "layers.0 forward/all_gather"));
    CHECK(has(pushed, "layers.0 backward/all_gather"));
    CHECK(has(pushed, "layers.1 backward/reduce_scatter"));
}

TEST_CASE("without --nvtx, NVTX ranges tag nothing") {
    Run r(env("E2E_CLI") + " run --plugins none --out {out} -- " + env("E2E_PROGRAM") + " fsdp");
    INFO(r.err);
    REQUIRE(r.status == 0);
    for (const auto& [size, tag] : r.tags())
        CHECK(tag == Tag{"", "", 0});
}

TEST_CASE("run --nvtx refuses another tool's NVTX injection library, naming it") {
    Run r("NVTX_INJECTION64_PATH=/opt/nsight-systems/libToolsInjection64.so " + run_nvtx("fsdp"));
    CHECK(r.status == 2);
    CHECK(contains(r.err,
                   "NVTX_INJECTION64_PATH is already set to "
                   "/opt/nsight-systems/libToolsInjection64.so"));
    CHECK(r.traces.empty());
}

TEST_CASE("run --nvtx accepts NVTX_INJECTION64_PATH already naming liballocscope.so") {
    Run r("NVTX_INJECTION64_PATH=" + env("E2E_INTERPOSER") + " " + run_nvtx("fsdp"));
    INFO(r.err);
    REQUIRE(r.status == 0);
    CHECK(r.tags().at(1002) == Tag{"layers.0", "forward/all_gather", 3});
}
