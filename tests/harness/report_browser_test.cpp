// The HTML report in a real browser (headless Chromium): a harness run's
// report.html loads, the timeline's layer areas and the findings panel are
// drawn (pixels of their colours in a screenshot, elements in the DOM), and
// a trace whose strings carry markup cannot run script or add elements.
// Exits 77 (SKIP) when no Chromium is installed (tools/setup-deps --tests
// installs it where it can).
// Environment (tests/meson.build): E2E_CLI, HARNESS.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "support.h"

namespace fs = std::filesystem;
using namespace allocscope;

namespace {

using namespace allocscope::test;

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

std::string browser_command(const std::string& args) {
    // A throwaway profile; no sandbox (tests may run as root in CI).
    return find_browser() + " --headless --no-sandbox --disable-gpu --no-first-run " +
           "--user-data-dir=/tmp/allocscope-browser-profile --hide-scrollbars " + args;
}

// The serialized DOM after the page loaded.
std::string dom_of(const fs::path& html) {
    std::string dom;
    REQUIRE(sh(browser_command("--dump-dom file://" + html.string()), &dom) == 0);
    return dom;
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
    std::string text;
    REQUIRE(sh("python3 " + script.string() + " " + png.string(), &text) == 0);
    std::map<std::string, long> counts;
    std::stringstream words(text);
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

    const std::string dom = dom_of(html);
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
    write_tagged_trace(t / "rank0.trace",
                       "<script>document.title='owned'</script><img id=injected src=x>",
                       "forward\"><script>document.title='owned2'</script>");
    const fs::path html = t / "report.html";
    REQUIRE(sh(env("E2E_CLI") + " report " + (t / "rank0.trace").string() + " --format html -o " +
               html.string()) == 0);
    const std::string dom = dom_of(html);
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
