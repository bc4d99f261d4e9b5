// A check's findings' stacks as text (allocscope_check_finding::stack): the
// one place the traced process symbolizes. It runs in allocscope_check_end,
// on the program's thread after the check's plugins finished, never in a
// hook. Native frames get dladdr's names (exported and dynamic symbols
// only, no file:line); Python frames are exact (their interned text).
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "frames.h"
#include "recorder_internal.h"

namespace allocscope::recorder {

namespace {

constexpr size_t kShownFrames = 12;

struct TextFrame {
    std::string text;
    FrameKind kind;
    bool python;
};

std::string_view base_name(const char* path) {
    std::string_view p(path ? path : "");
    const size_t slash = p.rfind('/');
    return slash == std::string_view::npos ? p : p.substr(slash + 1);
}

// "function (module)", or "module+0xoffset" without a symbol. A captured
// frame is a return address: the call lies one byte before it.
TextFrame native_frame(uint64_t address) {
    Dl_info info{};
    const uint64_t call = address > 0 ? address - 1 : address;
    if (!dladdr(reinterpret_cast<void*>(call), &info) || !info.dli_fname) {
        char hex[32];
        std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(address));
        return {hex, native_frame_kind(hex), false};
    }
    const std::string_view module = base_name(info.dli_fname);
    if (!info.dli_sname) {
        char offset[32];
        std::snprintf(
            offset, sizeof offset, "+0x%llx",
            static_cast<unsigned long long>(address - reinterpret_cast<uint64_t>(info.dli_fbase)));
        std::string text = std::string(module) + offset;
        return {text, native_frame_kind(text), false};
    }
    int status = -1;
    std::unique_ptr<char, decltype(&std::free)> demangled(
        abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status), &std::free);
    const std::string name = status == 0 && demangled ? demangled.get() : info.dli_sname;
    return {name + " (" + std::string(module) + ")", native_frame_kind(name), false};
}

// Python frames' text from the recorder's string table, under its lock
// (held by hooks and the writer only for short, non-blocking stretches).
void name_python_frames(const std::vector<uint64_t>& frames, std::vector<TextFrame>& out) {
    std::lock_guard lock(g->defs_mutex);
    for (size_t i = 0; i < frames.size(); ++i) {
        if (!is_python_frame(frames[i])) continue;
        const uint32_t id = python_frame_string(frames[i]);
        out[i].text = id < g->strings.size() ? g->strings.at(id) : std::string("<python frame>");
        out[i].kind = python_frame_kind(out[i].text);
        out[i].python = true;
    }
}

}  // namespace

std::string finding_stack(const Finding& finding) noexcept {
    try {
        std::vector<uint64_t> frames;
        for (const Evidence& e : finding.evidence) {
            if (e.stack_id != 0 && g->stacks.frames_of(e.stack_id, frames) && !frames.empty())
                break;
            frames.clear();
        }
        if (frames.empty()) return {};
        std::vector<TextFrame> text(frames.size());
        for (size_t i = 0; i < frames.size(); ++i) {
            if (!is_python_frame(frames[i])) text[i] = native_frame(frames[i]);
        }
        name_python_frames(frames, text);

        // As the text report: allocscope's and the allocator's frames on top
        // go, the stack starts at the program's code.
        size_t top = 0;
        while (top < text.size() && above_the_request(text[top].kind))
            ++top;
        if (top == text.size()) top = 0;
        std::vector<const TextFrame*> rest;
        for (size_t i = top; i < text.size(); ++i)
            rest.push_back(&text[i]);

        std::vector<const TextFrame*> shown;
        if (rest.size() <= kShownFrames) {
            shown = rest;
        } else {
            for (const TextFrame* f : rest) {
                if (f->python && f->kind == FrameKind::user && shown.size() < kShownFrames)
                    shown.push_back(f);
            }
            if (shown.empty()) shown.assign(rest.begin(), rest.begin() + kShownFrames);
        }
        std::string out;
        for (const TextFrame* f : shown) {
            if (!out.empty()) out += '\n';
            out += f->text;
        }
        if (shown.size() < rest.size())
            out += "\n\u2026 " + std::to_string(rest.size() - shown.size()) + " more frames";
        return out;
    } catch (...) {
        return {};
    }
}

}  // namespace allocscope::recorder
