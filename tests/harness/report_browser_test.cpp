// The HTML report in a real browser (headless Chromium): a harness run's
// report.html loads, the timeline's layer areas and the findings panel are
// drawn (pixels of their colours in a screenshot, elements in the DOM), and
// a trace whose strings carry markup cannot run script or add elements.
// Exits 77 (SKIP) when no Chromium is installed (tools/setup-deps --tests
// installs it where it can).
// Environment (tests/meson.build): E2E_CLI, HARNESS.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "trace_writer.h"

namespace fs = std::filesystem;
using namespace allocscope;

namespace {

std::string env(const char* name) {
    const char* v = std::getenv(name);
    REQUIRE_MESSAGE(v != nullptr, name << " must be set (see tests/meson.build)");
    return v;
}

std::string find_browser() {
    if (const char* b = std::getenv("CHROMIUM"); b && *b) return b;
    const char* path = std::getenv("PATH");
    std::stringstream dirs(path ? path : "/usr/bin:/bin");
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
        for (const char* name :
             {"chromium", "chromium-browser", "google-chrome", "headless_shell"}) {
            const fs::path p = fs::path(dir) / name;
            if (access(p.c_str(), X_OK) == 0) return p.string();
        }
    }
    return {};
}

struct TempDir {
    fs::path dir;
    TempDir() {
        char tmpl[] = "/tmp/allocscope-browser-XXXXXX";
        dir = mkdtemp(tmpl);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(dir, ec);
    }
    fs::path operator/(const std::string& name) const { return dir / name; }
};

int status_of(const std::string& command) {
    const int raw = std::system(command.c_str());
    return WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
}

// Runs `command` with its output discarded.
int sh(const std::string& command) {
    return status_of(command + " >/dev/null 2>&1");
}

// Runs `command` with its standard output into `out`.
int sh_to(const std::string& command, const fs::path& out) {
    return status_of(command + " 2>/dev/null >" + out.string());
}

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

bool contains(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
}

std::string browser_command(const std::string& args) {
    // A throwaway profile; no sandbox (tests may run as root in CI).
    return find_browser() + " --headless --no-sandbox --disable-gpu --no-first-run " +
           "--user-data-dir=/tmp/allocscope-browser-profile --hide-scrollbars " + args;
}

// The serialized DOM after the page loaded.
std::string dom_of(const fs::path& html, const fs::path& out) {
    REQUIRE(sh_to(browser_command("--dump-dom file://" + html.string()), out) == 0);
    return slurp(out);
}

// Pixel counts of a PNG: "total", "nonwhite", and one per named colour
// (within a distance), by a small decoder in Python (zlib, the PNG filters).
std::map<std::string, long> pixel_counts(const fs::path& png, const fs::path& work) {
    const fs::path script = work / "pixels.py";
    std::ofstream(script) << R"PY(
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n'
pos, idat, w, h, ctype = 8, b'', 0, 0, 0
while pos < len(data):
    n, kind = struct.unpack('>I4s', data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b'IHDR':
        w, h, depth, ctype = struct.unpack('>IIBB', body[:10])
        assert depth == 8
    elif kind == b'IDAT':
        idat += body
    pos += 12 + n
bpp = {2: 3, 6: 4}[ctype]
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
colours = {'layer': (0x4e, 0x79, 0xa7), 'error': (0xb3, 0x26, 0x1e)}
counts = {'total': w * h, 'nonwhite': 0, 'layer': 0, 'error': 0}
i = 0
for y in range(h):
    f = raw[i]; line = bytearray(raw[i + 1:i + 1 + stride]); i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b = prev[x]; c = prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    prev = line
    for x in range(0, stride, bpp):
        r, g, bl = line[x], line[x + 1], line[x + 2]
        if r < 245 or g < 245 or bl < 245: counts['nonwhite'] += 1
        for name, (cr, cg, cb) in colours.items():
            if abs(r - cr) + abs(g - cg) + abs(bl - cb) <= (12 if name == 'layer' else 90):
                counts[name] += 1
print(' '.join('%s=%d' % kv for kv in counts.items()))
)PY";
    const fs::path out = work / "pixels.txt";
    REQUIRE(sh_to("python3 " + script.string() + " " + png.string(), out) == 0);
    std::map<std::string, long> counts;
    std::stringstream words(slurp(out));
    std::string word;
    while (words >> word) {
        const size_t eq = word.find('=');
        counts[word.substr(0, eq)] = std::stol(word.substr(eq + 1));
    }
    return counts;
}

}  // namespace

TEST_CASE("a run's HTML report renders its timeline and findings in a browser") {
    TempDir t;
    REQUIRE(sh(env("E2E_CLI") + " run --force --out " + (t / "run").string() + " -- " +
               env("HARNESS") +
               " --backend sim --ranks 2 --layers 2 --steps 3 --warmup 1 --recipe delayed "
               "--te seed") == 0);
    const fs::path html = t / "run" / "report.html";
    REQUIRE(fs::exists(html));

    const std::string dom = dom_of(html, t / "dom.html");
    CHECK(contains(dom, "<svg"));
    CHECK(contains(dom, "<polygon class=\"layer\""));
    CHECK(contains(dom, "<details class=\"finding\""));
    CHECK(contains(dom, "weight-copy-accumulation"));
    CHECK(contains(dom, "<title>allocscope report</title>"));

    const fs::path png = t / "shot.png";
    REQUIRE(sh(browser_command("--window-size=1280,1600 --screenshot=" + png.string() + " file://" +
                               html.string())) == 0);
    const auto px = pixel_counts(png, t.dir);
    INFO("pixels: total " << px.at("total") << ", non-white " << px.at("nonwhite")
                          << ", timeline layer colour " << px.at("layer") << ", error red "
                          << px.at("error"));
    CHECK(px.at("total") == 1280L * 1600L);
    CHECK(px.at("nonwhite") > px.at("total") / 50);  // more than a blank page
    CHECK(px.at("layer") > 2000);                    // the first layer's area
    CHECK(px.at("error") > 10);                      // "error" findings' labels
}

TEST_CASE(
    "markup in a trace's strings stays text in the browser: no script runs, no element added") {
    TempDir t;
    {
        TraceWriter w;
        TraceHeader h;
        h.tool_version = "test";
        h.pid = 7;
        h.rank = 0;
        h.world_size = 1;
        std::string error;
        REQUIRE_MESSAGE(w.open((t / "rank0.trace").string(), h, error), error);
        w.string(1, "<script>document.title='owned'</script><img id=injected src=x>");
        w.string(2, "forward\"><script>document.title='owned2'</script>");
        uint64_t seq = 0;
        auto event = [&](EventKind kind) {
            Event e;
            e.seq = ++seq;
            e.t_ns = seq * 1000;
            e.kind = kind;
            e.tid = 1;
            e.layer = 1;
            e.phase = 2;
            return e;
        };
        w.event(event(EventKind::tag_push));
        Event a = event(EventKind::alloc);
        a.level = Level::segment;
        a.memory = MemoryKind::device;
        a.api = Api::cudaMalloc;
        a.address = 0x1000;
        a.size = 1 << 20;
        w.event(a);
        w.event(event(EventKind::tag_pop));
        w.close(FooterRecord{});
    }
    const fs::path html = t / "report.html";
    REQUIRE(sh(env("E2E_CLI") + " report " + (t / "rank0.trace").string() + " --format html -o " +
               html.string()) == 0);
    const std::string dom = dom_of(html, t / "dom.html");
    CHECK(contains(dom, "<title>allocscope report</title>"));
    CHECK_FALSE(contains(dom, "owned</title>"));
    CHECK_FALSE(contains(dom, "<img"));
    CHECK_FALSE(contains(dom, "<script"));
    CHECK(contains(dom, "&lt;script&gt;document.title='owned'&lt;/script&gt;"));
}

int main(int argc, char** argv) {
    if (find_browser().empty()) {
        std::fprintf(stderr, "skipped: no chromium (tools/setup-deps --tests installs it)\n");
        return 77;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
