// The HTML report in a real browser (headless Chromium): a harness run's
// report.html loads, the timeline's layer areas and the findings panel are
// drawn (pixels of their colours in a screenshot, elements in the DOM);
// hovering the timeline and the heat map shows the allocations and their
// stacks, clicking a layer selects it across the page, every element
// styled as clickable does something when clicked, the per-layer forward
// chart has a series per rank and per baseline rank (a probe script
// appended to a copy of the report dispatches real mouse and key events and
// writes what it saw into the DOM); and a trace whose strings carry markup
// cannot run script or add elements, hovered or not.
// Exits 77 (SKIP) when no Chromium is installed (tools/setup-deps --tests
// installs it where it can).
// Environment (tests/meson.build): E2E_CLI, HARNESS.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

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
colours = {'layer': (0x4e, 0x79, 0xa7), 'error': (0xb3, 0x26, 0x1e), 'tip': (0x3a, 0x22, 0x57)}
counts = {'total': w * h, 'nonwhite': 0, 'layer': 0, 'error': 0, 'tip': 0}
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
            if abs(r - cr) + abs(g - cg) + abs(bl - cb) <= (90 if name == 'error' else 12):
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

// A script appended to a copy of a report: once the page has loaded it
// moves the mouse over the first rank's timeline (at a point where
// elementFromPoint finds the bottom layer's area) and over a heat-map cell,
// clicks a layer's legend entry twice, clicks a table's layer cell and
// presses Escape, then clicks every element styled as clickable, and
// writes what it saw as "key=value" lines into
// <pre id=observed>. With "#shot" in the URL it only hovers the timeline
// and leaves the tooltip up (for a screenshot); with "#none" it does
// nothing.
constexpr const char* kProbe = R"JS(<script>
window.addEventListener('load', () => {
  if (location.hash === '#none') return;
  const lines = [];
  const put = (k, v) => lines.push(k + '=' + String(v).replace(/\n/g, ' | '));
  const tip = document.getElementById('tip');
  const svg = document.querySelector('div.timeline svg');
  // Headless screenshots do not repaint a scrolled page: for "#shot" the
  // window is tall enough instead.
  if (location.hash !== '#shot') svg.scrollIntoView({block: 'center'});
  const poly = svg.querySelector('polygon.layer');
  const r = poly.getBoundingClientRect();
  let hit = null;
  for (let fy = 0.98; fy > 0.3 && !hit; fy -= 0.02)
    for (let fx = 0.5; fx < 0.99 && !hit; fx += 0.01) {
      const x = r.left + r.width * fx, y = r.top + r.height * fy;
      if (document.elementFromPoint(x, y) === poly) hit = [x, y];
    }
  put('hit', !!hit);
  if (hit) poly.dispatchEvent(new MouseEvent('mousemove', {clientX: hit[0], clientY: hit[1], bubbles: true}));
  put('timeline_tip_display', getComputedStyle(tip).display);
  put('timeline_tip', Array.from(tip.children).map(e => e.textContent).join('\n'));
  put('hovered_layer', poly.getAttribute('data-g'));
  if (location.hash === '#shot') return;
  const td = document.querySelector('table.heat td.c[data-t]');
  td.scrollIntoView({block: 'center'});
  const c = td.getBoundingClientRect();
  const cx = c.left + c.width / 2, cy = c.top + c.height / 2;
  put('heat_hit', document.elementFromPoint(cx, cy) === td);
  td.dispatchEvent(new MouseEvent('mousemove', {clientX: cx, clientY: cy, bubbles: true}));
  put('heat_tip', Array.from(tip.children).map(e => e.textContent).join('\n'));
  const g = poly.getAttribute('data-g');
  const same = Array.from(document.querySelectorAll('[data-g]')).filter(e => e.getAttribute('data-g') === g);
  const state = () => {
    const sel = document.querySelectorAll('.sel').length, dim = document.querySelectorAll('.dim').length;
    return 'sel ' + sel + ' dim ' + dim + ' same ' + same.length + ' same_sel ' +
      same.filter(e => e.classList.contains('sel')).length + ' polygon ' + poly.getAttribute('class');
  };
  const entry = Array.from(document.querySelectorAll('.legend span.pick')).find(e => e.getAttribute('data-g') === g);
  entry.click();
  put('after_click', state());
  entry.click();
  put('after_second_click', state());
  const cell = document.querySelector('table.tags tr[data-g] td.pick');
  cell.click();
  put('row_layer', cell.closest('tr').getAttribute('data-g'));
  put('after_row_click', state());
  document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape', bubbles: true}));
  put('after_escape', state());
  // Every element styled as clickable (the one that sets the pointer, not
  // what it holds), every <details> open: a summary opens or closes its
  // details, anything else is a layer name whose click marks its layer.
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  const pointer = e => getComputedStyle(e).cursor === 'pointer';
  const click = e => e.dispatchEvent(new MouseEvent('click', {bubbles: true, cancelable: true}));
  const marks = () => document.querySelectorAll('.sel').length + ' ' + document.querySelectorAll('.dim').length;
  const dead = [];
  let names = 0, summaries = 0, stuck = 0;
  for (const e of Array.from(document.querySelectorAll('body *'))) {
    if (!pointer(e) || (e.parentElement && pointer(e.parentElement))) continue;
    if (e.tagName === 'SUMMARY') {
      ++summaries;
      const d = e.parentElement, was = d.open;
      click(e);
      if (d.open === was) ++stuck;
      d.open = true;
      continue;
    }
    ++names;
    const before = marks(), row = e.closest('[data-g]');
    click(e);
    if (marks() === before || !row || !row.classList.contains('sel'))
      dead.push(e.tagName.toLowerCase() + ' "' + e.textContent + '" in ' + e.parentElement.tagName.toLowerCase());
    document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape', bubbles: true}));
  }
  put('layer_names', names);
  put('dead_layer_names', dead.length);
  put('dead_examples', dead.slice(0, 5).join('; '));
  put('summaries', summaries);
  put('stuck_summaries', stuck);
  for (const p of document.querySelectorAll('svg.fwd polyline.series'))
    put('series', p.getAttribute('class') + ' ' + p.getAttribute('data-rank') +
        (p.hasAttribute('stroke-dasharray') ? ' dashed' : ''));
  put('title', document.title);
  put('images', document.querySelectorAll('img').length);
  const pre = document.createElement('pre');
  pre.id = 'observed';
  pre.textContent = '\n' + lines.join('\n') + '\n';
  document.body.appendChild(pre);
});
</script>
)JS";

// A copy of `html` with the probe appended.
fs::path with_probe(const fs::path& html, const fs::path& dir) {
    const fs::path copy = dir / "probed.html";
    std::ofstream(copy) << slurp(html) << kProbe;
    return copy;
}

// The DOM after the probe ran.
std::string probed_dom(const fs::path& page) {
    std::string dom;
    REQUIRE(sh(browser_command("--virtual-time-budget=5000 --dump-dom file://" + page.string()),
               &dom) == 0);
    return dom;
}

// The probe's value for `key` (the first line "key=..."), "" when absent.
std::string observed(const std::string& dom, const std::string& key) {
    const size_t at = dom.find("\n" + key + "=", dom.find("<pre id=\"observed\">"));
    if (at == std::string::npos) return {};
    const size_t from = at + key.size() + 2;
    return dom.substr(from, dom.find('\n', from) - from);
}

std::vector<std::string> observed_all(const std::string& dom, const std::string& key) {
    std::vector<std::string> out;
    const std::string needle = "\n" + key + "=";
    for (size_t at = dom.find(needle, dom.find("<pre id=\"observed\">")); at != std::string::npos;
         at = dom.find(needle, at + 1)) {
        const size_t from = at + needle.size();
        out.push_back(dom.substr(from, dom.find('\n', from) - from));
    }
    return out;
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
    "hovering the timeline and the heat map shows allocations and stacks; clicking a layer "
    "selects it across the page, and every layer name that looks clickable does so") {
    TempDir t;
    const std::string harness = env("HARNESS") +
                                " --backend sim --ranks 2 --layers 2 --steps 6 --warmup 1 "
                                "--recipe delayed";
    REQUIRE(sh(env("E2E_CLI") + " run --force --out " + (t / "run").string() + " -- " + harness +
               " --te seed") == 0);
    REQUIRE(sh(env("E2E_CLI") + " run --force --out " + (t / "base").string() + " -- " + harness +
               " --te fixed") == 0);
    const fs::path html = t / "report.html";
    REQUIRE(sh(env("E2E_CLI") + " report " + (t / "run").string() + " --baseline " +
               (t / "base").string() + " --format html -o " + html.string()) == 0);
    // Six steps of two ranks in well under a MiB (the report has every
    // finding, stack and timeline sample of both).
    const auto size = fs::file_size(html);
    INFO("report.html: " << size << " bytes");
    CHECK(size < 1024 * 1024);
    CHECK(fs::file_size(t / "run" / "report.html") < 1024 * 1024);

    const std::string dom = probed_dom(with_probe(html, t.dir));
    REQUIRE(contains(dom, "<pre id=\"observed\">"));
    CHECK(observed(dom, "hit") == "true");
    CHECK(observed(dom, "timeline_tip_display") == "block");
    // The timeline's tooltip: where and when, the hovered layer's bytes,
    // its largest live allocations with their tags and stacks, the
    // allocator's own frames folded away.
    const std::string tip = observed(dom, "timeline_tip");
    const std::string layer = observed(dom, "hovered_layer");
    INFO("timeline tooltip: " << tip);
    CHECK(contains(tip, "rank 0 "));
    CHECK(contains(tip, " step "));
    CHECK(contains(tip, layer + ": "));
    CHECK(contains(tip, "largest live allocation"));
    CHECK(contains(tip, "allocation #"));
    CHECK(contains(tip, "trainer.cpp:"));
    CHECK_FALSE(contains(tip, "CachingAllocator::allocate"));
    // The heat map's: the tags the cell adds up and where they allocated.
    CHECK(observed(dom, "heat_hit") == "true");
    const std::string heat = observed(dom, "heat_tip");
    INFO("heat-map tooltip: " << heat);
    CHECK(contains(heat, " allocation(s)"));
    CHECK(contains(heat, "allocated at:"));
    CHECK(contains(heat, "trainer.cpp:"));
    // A click on the layer's legend entry selects it everywhere (every
    // element of that layer marked, the others dimmed); a second click and
    // Escape clear it.
    const std::string clicked = observed(dom, "after_click");
    INFO("after the legend click: " << clicked);
    std::istringstream words(clicked);
    std::string w;
    long sel = -1, dim = -1, same = -1, same_sel = -1;
    words >> w >> sel >> w >> dim >> w >> same >> w >> same_sel;
    CHECK(same > 2);  // the legend entry, the timeline areas, table rows
    CHECK(same_sel == same);
    CHECK(sel == same);
    CHECK(dim > 0);
    CHECK(contains(clicked, "polygon layer sel"));
    CHECK(observed(dom, "after_second_click").starts_with("sel 0 dim 0 "));
    // A table row's layer cell selects that row's layer (another one here:
    // the hovered layer's area is dimmed); Escape clears.
    const std::string row = observed(dom, "after_row_click");
    INFO("after the row click: " << row);
    CHECK(observed(dom, "row_layer") != layer);
    CHECK_FALSE(row.starts_with("sel 0 "));
    CHECK(contains(row, "polygon layer dim"));
    CHECK(observed(dom, "after_escape").starts_with("sel 0 dim 0 "));
    // Whatever is styled as clickable does something: every layer name
    // (legend entries, the cells of tables, the heat maps and the findings'
    // evidence, the forward chart's labels) marks its layer, and every
    // summary opens or closes its details.
    const std::string names = observed(dom, "layer_names");
    MESSAGE("pointer-styled layer names: " << names << ", of them doing nothing when clicked: "
                                           << observed(dom, "dead_layer_names")
                                           << "; summaries: " << observed(dom, "summaries"));
    INFO("layer names doing nothing, the first: " << observed(dom, "dead_examples"));
    REQUIRE_FALSE(names.empty());
    CHECK(std::stol(names) > 20);
    CHECK(observed(dom, "dead_layer_names") == "0");
    CHECK(std::stol(observed(dom, "summaries")) > 20);
    CHECK(observed(dom, "stuck_summaries") == "0");
    // The per-layer forward chart: one series per rank, one per baseline
    // rank (dashed).
    const std::vector<std::string> series = observed_all(dom, "series");
    INFO("series: " << series.size());
    CHECK(series.size() == 4);
    for (const char* want : {"series run rank 0", "series run rank 1",
                             "series baseline rank 0 dashed", "series baseline rank 1 dashed"}) {
        CHECK(std::count(series.begin(), series.end(), std::string(want)) == 1);
    }

    // The tooltip on screen: its dark background in a screenshot of the
    // hovered page, none in one of the page left alone.
    const fs::path probed = t / "probed.html";
    const fs::path shot = t / "tip.png", still = t / "still.png";
    REQUIRE(sh(browser_command("--window-size=1280,2200 --virtual-time-budget=5000 --screenshot=" +
                               shot.string() + " 'file://" + probed.string() + "#shot'")) == 0);
    REQUIRE(sh(browser_command("--window-size=1280,2200 --virtual-time-budget=5000 --screenshot=" +
                               still.string() + " 'file://" + probed.string() + "#none'")) == 0);
    const auto hovered = pixel_counts(shot, t.dir);
    const auto alone = pixel_counts(still, t.dir);
    INFO("tooltip pixels: hovered " << hovered.at("tip") << ", alone " << alone.at("tip"));
    CHECK(hovered.at("tip") > 20000);
    CHECK(alone.at("tip") < 100);
    CHECK(hovered.at("layer") > 2000);  // the timeline it hovers is in view
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
    CHECK(count_lines(dom, "<script") == 2);  // the report's own data and script
    CHECK_FALSE(contains(dom, "<script>document.title"));
    CHECK(contains(dom, "&lt;script&gt;document.title='owned'&lt;/script&gt;"));
    // Hovered, the tooltip shows the layer's name as text.
    const std::string probed = probed_dom(with_probe(html, t.dir));
    CHECK(observed(probed, "hit") == "true");
    CHECK(contains(
        observed(probed, "timeline_tip"),
        "&lt;script&gt;document.title='owned'&lt;/script&gt;&lt;img id=injected src=x&gt;"));
    CHECK(observed(probed, "title") == "allocscope report");
    CHECK(observed(probed, "images") == "0");
}

int main(int argc, char** argv) {
    if (find_browser().empty()) {
        std::fprintf(stderr, "skipped: no chromium (tools/setup-deps --tests installs it)\n");
        return 77;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
