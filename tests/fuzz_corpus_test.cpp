// The trace reader fuzz target's corpus (tests/fuzz/corpus/trace_reader:
// named seeds made by tools/fuzz --make-corpus, and found-* inputs a fuzz
// session added, minimized with -merge=1) as regression inputs in every
// build, gcc and sanitizers included, so CI catches a reader regression
// without clang: each input as it is and with its checksums recomputed; the
// named seeds also cut short and with bytes flipped.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "trace_format.h"
#include "trace_reader_target.h"

namespace fs = std::filesystem;
using namespace allocscope;

namespace {

std::vector<fs::path> corpus_files() {
    const char* dir = std::getenv("FUZZ_CORPUS_DIR");
    REQUIRE_MESSAGE(dir != nullptr, "FUZZ_CORPUS_DIR must be set (tests/meson.build)");
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir)) {
        if (e.is_regular_file()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    return files;
}

std::vector<uint8_t> bytes_of(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string s = ss.str();
    return {s.begin(), s.end()};
}

}  // namespace

TEST_CASE("every seed input is read or rejected with a TraceError, never worse") {
    const auto files = corpus_files();
    CHECK(files.size() >= 10);
    int read = 0, rejected = 0;
    for (const fs::path& f : files) {
        CAPTURE(f);
        const std::vector<uint8_t> b = bytes_of(f);
        fuzz::Outcome o;
        CHECK_NOTHROW(o = fuzz::read_trace_bytes(b.data(), b.size()));
        read += o.read;
        rejected += o.rejected;
    }
    CHECK(read >= 8);  // the valid traces of both versions, complete or cut
    CHECK(rejected >= 2);
}

TEST_CASE("seed inputs cut anywhere and with a byte flipped anywhere stay contained") {
    size_t cases = 0;
    for (const fs::path& f : corpus_files()) {
        // The named seeds (tools/fuzz --make-corpus); found-* inputs are the
        // fuzzer's own mutations already.
        if (f.filename().string().rfind("found-", 0) == 0) continue;
        CAPTURE(f);
        const std::vector<uint8_t> b = bytes_of(f);
        // Every prefix of the first 200 bytes, then every 7th.
        for (size_t n = 0; n <= b.size(); n += n < 200 ? 1 : 7) {
            CHECK_NOTHROW(fuzz::read_trace_bytes(b.data(), n));
            ++cases;
        }
        for (size_t i = 0; i < b.size(); i += 3) {
            std::vector<uint8_t> m = b;
            m[i] ^= static_cast<uint8_t>(0x5a + i);
            CHECK_NOTHROW(fuzz::read_trace_bytes(m.data(), m.size()));
            ++cases;
        }
    }
    MESSAGE(cases << " mutated inputs");
}

TEST_CASE("a record declaring 4 GiB is rejected before anything is allocated for it") {
    const auto files = corpus_files();
    const auto it = std::find_if(files.begin(), files.end(),
                                 [](const fs::path& p) { return p.filename() == "v2-complete"; });
    REQUIRE(it != files.end());
    std::vector<uint8_t> b = bytes_of(*it);
    for (uint32_t length : {0xFFFFFFFFu, kMaxRecordPayload + 1}) {
        std::vector<uint8_t> m = b;
        for (int k = 0; k < 4; ++k)
            m[kTraceHeaderSize + 4 + k] = static_cast<uint8_t>(length >> (8 * k));
        fuzz::Outcome o = fuzz::read_trace_bytes(m.data(), m.size());
        CHECK(o.rejected >= 1);
        CHECK(o.read == 0);
    }
}
