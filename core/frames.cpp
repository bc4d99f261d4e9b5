#include "frames.h"

#include <algorithm>
#include <array>

namespace allocscope {

namespace {

using std::string_view;

// c_prefix: a C function's name (no namespace) starting with the pattern.
// inductor_code: a file named as PyTorch inductor names the Python modules
// it generates, "c" and 51 lower-case letters or digits (a base32 code
// hash), ".py", wherever its cache directory is (TORCHINDUCTOR_CACHE_DIR).
enum class Match { name_prefix, c_prefix, name_exact, file_contains, module_prefix, inductor_code };

struct Rule {
    Match match;
    string_view pattern;
    FrameKind kind;
};

// Native frames. First match wins: the sim harness's allocator before the
// rest of allocscope::harness (the program's code) before allocscope's own,
// PyTorch's allocators before the rest of c10.
constexpr std::array kNativeRules = {
    // allocscope's source files and libraries (the bridge's anonymous
    // namespace has no other mark).
    Rule{Match::file_contains, "tools/torch_bridge/", FrameKind::allocscope},
    Rule{Match::module_prefix, "liballocscope", FrameKind::allocscope},
    Rule{Match::name_prefix, "(anonymous namespace)::on_entry<c10::", FrameKind::allocscope},
    Rule{Match::name_prefix, "allocscope::harness::alloc::", FrameKind::allocator},
    Rule{Match::name_prefix, "allocscope::harness::", FrameKind::user},
    Rule{Match::name_prefix, "allocscope::", FrameKind::allocscope},
    Rule{Match::name_prefix, "allocscope_", FrameKind::allocscope},
    // PyTorch's device and pinned-host allocators.
    Rule{Match::name_prefix, "c10::cuda::", FrameKind::allocator},
    Rule{Match::name_prefix, "c10::CachingDeviceAllocator::", FrameKind::allocator},
    Rule{Match::name_prefix, "c10::CachingAllocator::", FrameKind::allocator},
    Rule{Match::name_prefix, "at::cuda::CachingHostAllocator", FrameKind::allocator},
    Rule{Match::name_prefix, "at::CachingHostAllocatorImpl", FrameKind::allocator},
    Rule{Match::file_contains, "c10/cuda/", FrameKind::allocator},
    Rule{Match::module_prefix, "libc10_cuda", FrameKind::allocator},
    // PyTorch's tensor plumbing: empty/resize, the dispatcher and its
    // boxing wrappers, autograd, the Python bindings.
    Rule{Match::name_prefix, "at::", FrameKind::framework},
    Rule{Match::name_prefix, "c10::", FrameKind::framework},
    Rule{Match::name_prefix, "torch::", FrameKind::framework},
    Rule{Match::name_prefix, "pybind11::", FrameKind::framework},
    Rule{Match::name_prefix, "THP", FrameKind::framework},
    Rule{Match::file_contains, "aten/src/ATen/", FrameKind::framework},
    Rule{Match::file_contains, "torch/csrc/", FrameKind::framework},
    Rule{Match::file_contains, "c10/core/", FrameKind::framework},
    Rule{Match::module_prefix, "libc10", FrameKind::framework},
    Rule{Match::module_prefix, "libtorch", FrameKind::framework},
    // Process and thread start, CPython's evaluation loop and calls.
    Rule{Match::name_exact, "_start", FrameKind::runtime},
    Rule{Match::name_exact, "__libc_start_main", FrameKind::runtime},
    Rule{Match::name_exact, "__libc_start_call_main", FrameKind::runtime},
    Rule{Match::name_exact, "start_thread", FrameKind::runtime},
    Rule{Match::name_exact, "clone", FrameKind::runtime},
    Rule{Match::name_exact, "clone3", FrameKind::runtime},
    Rule{Match::c_prefix, "_Py", FrameKind::runtime},
    Rule{Match::c_prefix, "Py", FrameKind::runtime},
    Rule{Match::c_prefix, "pymain_", FrameKind::runtime},
    Rule{Match::c_prefix, "method_vectorcall", FrameKind::runtime},
    Rule{Match::c_prefix, "cfunction_", FrameKind::runtime},
    Rule{Match::c_prefix, "slot_tp_", FrameKind::runtime},
    Rule{Match::c_prefix, "vectorcall_", FrameKind::runtime},
    Rule{Match::module_prefix, "libpython", FrameKind::runtime},
    Rule{Match::module_prefix, "python3", FrameKind::runtime},
    Rule{Match::module_prefix, "libc.so", FrameKind::runtime},
};

// Python frames, by file.
constexpr std::array kPythonRules = {
    Rule{Match::file_contains, "/python/allocscope/", FrameKind::allocscope},
    Rule{Match::file_contains, "-packages/allocscope/", FrameKind::allocscope},  // installed
    Rule{Match::file_contains, "/python/sitecustomize.py", FrameKind::allocscope},
    Rule{Match::file_contains, "/torch/", FrameKind::framework},
    // torch.compile's generated code (the wrapper's call, its Triton
    // kernels' launchers): PyTorch's, not the program's.
    Rule{Match::file_contains, "/torchinductor_", FrameKind::framework},
    Rule{Match::inductor_code, "", FrameKind::framework},
    Rule{Match::file_contains, "<frozen ", FrameKind::runtime},
    Rule{Match::file_contains, "/runpy.py", FrameKind::runtime},
    // The test runner that called the program's test.
    Rule{Match::file_contains, "/_pytest/", FrameKind::runtime},
    Rule{Match::file_contains, "/pluggy/", FrameKind::runtime},
};

// Wrappers that take the kind of what they call: std::function's handler
// and std::__invoke that of their callable (the template argument after
// the first), std::function the most telling kind its signature names.
struct Wrapper {
    string_view prefix;
    size_t first_arg;
    bool signature;
};
constexpr std::array kWrappers = {Wrapper{"std::_Function_handler<", 1, false},
                                  Wrapper{"std::__invoke", 1, false},
                                  Wrapper{"std::function<", 0, true}};

struct Parts {
    string_view name;    // qualified function name, return type and arguments dropped
    string_view file;    // "" when none
    string_view module;  // a raw frame's module file name, "" otherwise
};

// "text (file:line)" or "text (file)": the file; `text` keeps the rest.
string_view split_file(string_view& text, bool python) {
    if (text.empty() || text.back() != ')') return {};
    const size_t open = text.rfind(" (");
    if (open == string_view::npos) return {};
    string_view inner = text.substr(open + 2, text.size() - open - 3);
    if (inner.find_first_of("()") != string_view::npos) return {};
    if (!python && inner.find_first_of("/.") == string_view::npos) return {};
    text = text.substr(0, open);
    const size_t colon = inner.rfind(':');
    if (colon != string_view::npos && colon + 1 < inner.size() &&
        inner.find_first_not_of("0123456789", colon + 1) == string_view::npos)
        inner = inner.substr(0, colon);
    return inner;
}

constexpr string_view kAnonymous = "(anonymous namespace)";

// The qualified name of a demangled function: without the return type a
// function template's name starts with, and without the argument list.
string_view qualified_name(string_view text) {
    size_t start = 0, depth = 0, i = 0;
    while (i < text.size()) {
        const char c = text[i];
        if (depth == 0 && text.substr(i).starts_with(kAnonymous)) {
            i += kAnonymous.size();
            continue;
        }
        if (depth == 0 && text.substr(start, i - start).ends_with("operator")) {
            // operator(), operator<, operator<<=, ...: the symbol is part of the name.
            if (text.substr(i).starts_with("()")) i += 2;
            while (i < text.size() &&
                   string_view("<>=!+-*/%&|^~[],").find(text[i]) != string_view::npos)
                ++i;
            continue;
        }
        if (c == '<' || c == '[' || c == '{' || (c == '(' && depth > 0)) {
            ++depth;
        } else if ((c == '>' || c == ']' || c == '}' || c == ')') && depth > 0) {
            --depth;
        } else if (c == '(') {
            break;  // the argument list
        } else if (c == ' ' && depth == 0) {
            start = i + 1;
        }
        ++i;
    }
    return text.substr(start, i - start);
}

Parts native_parts(string_view text) {
    Parts p;
    p.file = split_file(text, false);
    if (p.file.empty() && text.find('(') == string_view::npos) {
        const size_t plus = text.rfind("+0x");
        if (plus != string_view::npos) {
            string_view module = text.substr(0, plus);
            const size_t slash = module.rfind('/');
            p.module = slash == string_view::npos ? module : module.substr(slash + 1);
            return p;
        }
        if (text.starts_with("0x")) return p;  // an address outside every module
    }
    p.name = qualified_name(text);
    return p;
}

bool matches(const Rule& r, const Parts& p) {
    switch (r.match) {
        case Match::name_prefix:
            return p.name.starts_with(r.pattern);
        case Match::c_prefix:
            return p.name.starts_with(r.pattern) && p.name.find("::") == string_view::npos;
        case Match::name_exact:
            return p.name == r.pattern;
        case Match::file_contains:
            return p.file.find(r.pattern) != string_view::npos;
        case Match::module_prefix:
            return p.module.starts_with(r.pattern);
        case Match::inductor_code: {
            const size_t slash = p.file.rfind('/');
            const string_view base = slash == string_view::npos ? p.file : p.file.substr(slash + 1);
            if (base.size() != 55 || base[0] != 'c' || !base.ends_with(".py")) return false;
            return std::all_of(base.begin() + 1, base.end() - 3, [](char c) {
                return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
            });
        }
    }
    return false;
}

template <size_t N>
FrameKind first_match(const std::array<Rule, N>& rules, const Parts& p) {
    for (const Rule& r : rules) {
        if (matches(r, p)) return r.kind;
    }
    return FrameKind::user;
}

// The top-level template arguments of `name` from the `first`-th on.
string_view template_args(string_view name, size_t first) {
    const size_t open = name.find('<');
    if (open == string_view::npos) return {};
    size_t depth = 0, arg = 0, from = open + 1;
    for (size_t i = open; i < name.size(); ++i) {
        const char c = name[i];
        if (c == '<' || c == '(') {
            ++depth;
        } else if (c == '>' || c == ')') {
            if (--depth == 0) return arg >= first ? name.substr(from, i - from) : string_view{};
        } else if (c == ',' && depth == 1 && ++arg == first) {
            from = i + 1;
        }
    }
    return {};
}

// The most telling kind named in a signature: allocscope, then allocator,
// then framework; else user.
FrameKind signature_kind(string_view args) {
    FrameKind best = FrameKind::user;
    auto rank = [](FrameKind k) {
        return k == FrameKind::allocscope  ? 3
               : k == FrameKind::allocator ? 2
               : k == FrameKind::framework ? 1
                                           : 0;
    };
    for (size_t at = 0; at < args.size(); ++at) {
        // Names start after a delimiter, never inside another name (my::c10:: is not c10::).
        if (at > 0 && string_view(" <(,&*{").find(args[at - 1]) == string_view::npos) continue;
        Parts p;
        p.name = args.substr(at);
        const FrameKind k = first_match(kNativeRules, p);
        if (rank(k) > rank(best)) best = k;
    }
    return best;
}

}  // namespace

std::string_view to_string(FrameKind kind) noexcept {
    switch (kind) {
        case FrameKind::user:
            return "user";
        case FrameKind::allocscope:
            return "allocscope";
        case FrameKind::allocator:
            return "allocator";
        case FrameKind::framework:
            return "framework";
        case FrameKind::runtime:
            return "runtime";
    }
    return "user";
}

FrameKind native_frame_kind(std::string_view frame) noexcept {
    const Parts p = native_parts(frame);
    for (const Wrapper& w : kWrappers) {
        if (!p.name.starts_with(w.prefix)) continue;
        string_view args = template_args(p.name, w.first_arg);
        if (w.signature) return signature_kind(args);
        Parts callable;
        callable.name = args.substr(std::min(args.find_first_not_of(' '), args.size()));
        return first_match(kNativeRules, callable);
    }
    return first_match(kNativeRules, p);
}

FrameKind python_frame_kind(std::string_view frame) noexcept {
    Parts p;
    p.file = split_file(frame, true);
    return first_match(kPythonRules, p);
}

std::vector<FrameKind> frame_kinds(const std::vector<std::string>& frames, size_t first_python) {
    std::vector<FrameKind> kinds;
    kinds.reserve(frames.size());
    for (size_t f = 0; f < frames.size(); ++f) {
        kinds.push_back(f < first_python ? native_frame_kind(frames[f])
                                         : python_frame_kind(frames[f]));
    }
    return kinds;
}

size_t program_start(const std::vector<FrameKind>& kinds, size_t first_python) noexcept {
    const auto user = std::find(kinds.begin(), kinds.end(), FrameKind::user);
    if (user != kinds.end()) return size_t(user - kinds.begin());
    size_t lead = 0;
    while (lead + 1 < std::min(first_python, kinds.size()) && above_the_request(kinds[lead]))
        ++lead;
    return lead;
}

}  // namespace allocscope
