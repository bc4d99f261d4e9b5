// The PyTorch bridge, third part: provenance. An ATen op observer that
// follows the bytes of each registered parameter through the ops that read
// it and declares every allocation computed from it alone
// (allocscope_derived), so that the weight detectors can tell a quantized
// weight copy from an activation that happens to have its size.
//
// It is a global RecordFunction callback with inputs and outputs: it sees
// every dispatcher call of every thread (nested calls included, autograd's
// threads included), plain tensors only. A tensor subclass with
// __torch_dispatch__ (an FP8 tensor holding _data and _scale) is followed
// through the aten ops its Python code runs on the plain tensors inside it;
// the subclass tensors themselves (and every tensor with Python dispatch:
// reading their sizes could call into Python) count as not derived.
//
// Storages, not tensors, are the unit: a view shares its base's StorageImpl,
// and an allocation is a storage's data. The observer keeps a map from
// StorageImpl to what it knows (derived from which parameter, how), each
// entry holding a weak_intrusive_ptr to its StorageImpl: while it is held
// the StorageImpl's memory is not freed, so its address cannot be taken by
// a new storage and confuse the map; its data is freed as usual when the
// last tensor goes. Entries of dead storages go when the map has doubled
// since the last sweep (amortized constant cost).
//
// Rules:
//  * Seeds. A tensor input of an op that is a leaf requiring grad and not a
//    view (a view made under no_grad of an activation that requires grad
//    is a leaf that "requires grad" too), not yet in the map, seen while
//    the thread is inside a module's forward or backward tag (the shim's
//    keyed tag kinds), is the parameter `name` of the thread's current
//    layer (allocscope_current_layer) when its shape equals that
//    parameter's (registered by the shim with its full, unsharded shape)
//    and no other parameter of that layer has the same shape. A layer with
//    no parameters of its own looks at those of the modules inside it (a
//    transformer block whose linears' own forwards never ran: a block
//    compiled in place whose quantization runs eagerly, or code that uses
//    a child's weight directly; not in a forward recomputed inside a
//    backward pass, whose inputs a reentrant checkpoint detaches into
//    leaves that require grad), and where it has none inside either, at
//    the nearest enclosing layer that has some. Only leaves that require
//    grad are looked up, so an activation of a weight's shape is never one;
//    two parameters of one shape in the layer looked at make neither a
//    seed. The seed is its
//    StorageImpl: FSDP2's unsharded parameter keeps one StorageImpl across
//    all-gathers (the storage is resized), so one seed serves every step. A
//    seed is the parameter itself: no event.
//  * Propagation. When every tensor input of an op (tensors in lists
//    included; undefined tensors and Python scalars wrapped as tensors
//    ignored; at least one) is in the map, every output whose storage is
//    not in the map is derived from the first input's parameter and
//    declared, with `how` the chain of ops from the parameter
//    ("layers.3.fc1.weight -> abs -> amax -> mul -> _to_copy"; the first
//    and last kChainEnds op names with "…" between when longer). An
//    activation times a weight is an activation: one input outside the map
//    and nothing is derived.
//  * copy_(self, src): self's storage is derived when src's is, self is not
//    in the map and self covers its whole storage (the empty + copy_ inside
//    _to_copy and clone; a copy into part of a larger buffer is not
//    followed). It is named after the op it runs inside (_to_copy, clone),
//    copy_ when called on its own.
//  * Ops whose outputs carry no value of their inputs (empty_like,
//    zeros_like, new_empty, ...) derive nothing.
//
// Callbacks run on any thread: one mutex guards the map and the parameter
// table; allocscope_derived is called after it is released. They never
// call into Python, never throw (everything is caught), and never change a
// tensor. The observer is installed once and stays (RecordFunction
// callbacks of the process cannot be removed safely while ops run); the
// gate below disables and re-enables it.
//
// Cost. Torch boxes every observed op's inputs and outputs for the
// callback, so the callback is enabled only where an op can take a seed
// (the gate), and its start returns without the lock unless every input
// is in the lock-free filter of known storages or may be a seed (nearly
// every op has an activation among its inputs). Chains are made once per
// (chain, op) and reused every step, with their text.
//
// Steps. Even gated, the observer costs a host-bound step about a sixth of
// its time (docs/PERFORMANCE.md), nearly all of it torch's boxing. Training
// runs the same ops on the same parameters every step, and the weight
// detectors report per layer the step that kept the most, so the observer
// runs in some steps only (ALLOCSCOPE_PROVENANCE_STEPS; by default the
// first 4 steps, then 2 steps in every 100, counted from the step current
// when it was installed) and is disabled in the others, where torch then
// boxes nothing. The map lives on across the pauses: a storage derived in
// an observed step stays known while it lives. Where the window closes and
// opens again the trace gets a mark (ALLOCSCOPE_PROVENANCE_PAUSED,
// ALLOCSCOPE_PROVENANCE_RESUMED): the weight detectors match no sizes
// while paused, and the findings file names the steps observed. Where tags
// do not come through tag_hooks.cpp no step is looked at: every step is
// observed.
//
// C API (loaded by allocscope/torch/_provenance.py with ctypes, unless
// ALLOCSCOPE_PROVENANCE=0):
//   int allocscope_torch_provenance_install(uint32_t forward_kind,
//         uint32_t backward_kind, char* error, size_t error_size)
//     0 installed, 1 already installed, -1 failed (the reason in `error`:
//     the interposer's entry points are missing)
//   void allocscope_torch_provenance_param(const char* layer,
//         const char* name, const int64_t* shape, size_t ndim)
//     a parameter of `layer` with its full shape
//   void allocscope_torch_provenance_steps(uint64_t first, uint64_t every,
//         uint64_t window)
//     the steps observed (before install; the default 4, 100, 2): the
//     first `first`, then `window` steps in every `every` (0: none after
//     the first); first 0 observes every step
// ALLOCSCOPE_LOG=debug: the ops observed, the callbacks' average time per
// op and per step, the ops that took the lock, the seeds, the storages
// derived and the declarations, and how often the gate switched, at exit.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
// RecordFunction has members that exist only without NDEBUG (inputs_valid_)
// and inline accessors that read the members after them: compiled without
// NDEBUG against a release libtorch, fn.inputs() would read the wrong
// bytes. Every libtorch this is built against is a release build.
#ifndef NDEBUG
#define NDEBUG 1
#endif
// Longer than 600 lines: the observer, its storage map and the step window
// it runs in are one mechanism with one set of invariants, stated above.
#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/engine.h>
#if __has_include(<torch/version.h>)
#include <torch/version.h>
#endif

#include <allocscope/allocscope.h>

#include "config_text.h"
#include "per_step.h"

#define ALLOCSCOPE_BRIDGE_EXPORT extern "C" __attribute__((visibility("default")))

namespace allocscope::torch_bridge {
// Whether a CUDA tensor's storage is an allocation of its own in the trace:
// a block of the native allocator (bridge.cpp attached its tracker) or,
// under cudaMallocAsync, a runtime call. Otherwise a storage lies inside a
// segment, and nothing is declared about it: an address that is also a
// segment's base would make the whole segment "derived from a weight".
// Here, not in bridge.cpp: the CPU test library has no bridge.
std::atomic<bool> g_tensors_visible{false};
// Set by tag_hooks.cpp when the shim's tag calls go through its builtins,
// which then call provenance_tag_changed() after each (the gate below).
std::atomic<bool> g_tags_through_hooks{false};
void provenance_tag_changed() noexcept;
}  // namespace allocscope::torch_bridge

namespace {

using Derived = void (*)(const void*, const char*, const char*, const char*);
using CurrentLayer = size_t (*)(char*, size_t);
using KindDepth = int (*)(uint32_t);
using CurrentStep = uint64_t (*)();
using Mark = void (*)(const char*);

constexpr size_t kChainEnds = 4;      // op names kept at each end of a chain
constexpr size_t kFirstSweep = 4096;  // map entries before dead ones are swept
constexpr int kOpenOps = 16;          // enclosing ops remembered per thread
constexpr size_t kOpName = 48;        // bytes of an enclosing op's name kept

struct Param {
    std::string layer;
    std::string name;
    std::string full;  // "layer.name", or "name" for the root's
    std::vector<int64_t> shape;
};

// How a storage was computed from its parameter: immutable once made
// (but for the cache of its extensions), shared by the entries it was
// extended for.
struct Chain;
using ChainPtr = std::shared_ptr<const Chain>;

// Lookups by std::string_view in maps keyed by std::string, with no
// string made for the key.
struct TextHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept {
        return std::hash<std::string_view>{}(s);
    }
};
template <class V>
using TextMap = std::unordered_map<std::string, V, TextHash, std::equal_to<>>;

struct Chain {
    const Param* param = nullptr;
    std::vector<std::string> head;  // the first kChainEnds ops
    std::vector<std::string> tail;  // the last kChainEnds after those
    bool elided = false;            // ops were dropped between head and tail
    std::string text;               // "layers.3.fc1.weight -> abs -> …", made once
    // The chains extended from this one, by op: every step runs the same
    // ops on the same parameter storages (FSDP2 keeps them), so after the
    // first step a derivation allocates nothing and builds no text. Read
    // and written under the map's lock; at most kMaxExtensions kept.
    mutable TextMap<ChainPtr> extensions;
};
constexpr size_t kMaxExtensions = 64;

std::string chain_text(const Chain& c) {
    std::string out = c.param->full;
    for (const std::string& op : c.head)
        out += " -> " + op;
    if (c.elided) out += " -> …";
    for (const std::string& op : c.tail)
        out += " -> " + op;
    return out;
}

// A parameter's own chain (a seed).
ChainPtr root_chain(const Param* p) {
    auto c = std::make_shared<Chain>();
    c->param = p;
    c->text = chain_text(*c);
    return c;
}

// `from` followed by `op`. The map's lock is held.
ChainPtr extend(const ChainPtr& from, std::string_view op) {
    if (auto it = from->extensions.find(op); it != from->extensions.end()) return it->second;
    auto next = std::make_shared<Chain>();
    next->param = from->param;
    next->head = from->head;
    next->tail = from->tail;
    next->elided = from->elided;
    if (next->head.size() < kChainEnds) {
        next->head.emplace_back(op);
    } else {
        next->tail.emplace_back(op);
        if (next->tail.size() > kChainEnds) {
            next->tail.erase(next->tail.begin());
            next->elided = true;
        }
    }
    next->text = chain_text(*next);
    if (from->extensions.size() < kMaxExtensions) from->extensions.emplace(std::string(op), next);
    return next;
}

struct Entry {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage;
    ChainPtr chain;
};

// Which storages may be in the map, read without the map's lock: a bit per
// hash of the StorageImpl's address, set when an entry is made and cleared
// only when the sweep rebuilds it from the entries left. A clear bit means
// "not in the map", so an op with an input that is neither in the map nor
// a possible seed derives nothing, and the callback returns without the
// lock (nearly every op: an activation is among its inputs). A set bit may
// be a collision: the map decides. The rebuild is a sequence lock: a reader
// that overlapped one takes the map's word instead.
class KnownFilter {
  public:
    static constexpr unsigned kBitsLog2 = 18;  // 32 KiB: few collisions at a few thousand entries

    // Whether `p` may be in the map. Any thread, no lock.
    bool may_hold(const void* p) const noexcept {
        const uint64_t g = gen_.load(std::memory_order_acquire);
        if (g & 1) return true;  // being rebuilt
        const size_t b = bit(p);
        const bool set = words_[b / 64].load(std::memory_order_relaxed) & (uint64_t{1} << (b % 64));
        std::atomic_thread_fence(std::memory_order_acquire);
        return set || gen_.load(std::memory_order_relaxed) != g;
    }
    // The map's lock is held.
    void add(const void* p) noexcept {
        const size_t b = bit(p);
        words_[b / 64].fetch_or(uint64_t{1} << (b % 64), std::memory_order_relaxed);
    }
    // Clears every bit, then add()s what `refill` adds; the map's lock is held.
    template <class Refill>
    void rebuild(Refill&& refill) {
        gen_.store(gen_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_release);
        for (auto& w : words_)
            w.store(0, std::memory_order_relaxed);
        refill();
        gen_.store(gen_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    }

  private:
    static size_t bit(const void* p) noexcept {
        const uint64_t x = (reinterpret_cast<uintptr_t>(p) >> 4) * 0x9E3779B97F4A7C15ull;
        return static_cast<size_t>(x >> (64 - kBitsLog2));
    }
    std::atomic<uint64_t> gen_{0};  // odd while rebuilt
    std::atomic<uint64_t> words_[(size_t{1} << kBitsLog2) / 64] = {};
};

struct State {
    std::mutex mu;
    std::unordered_map<const c10::StorageImpl*, Entry> known;
    KnownFilter filter;  // the keys of `known`, readable without `mu`
    size_t sweep_at = kFirstSweep;
    std::deque<Param> params;  // never shrinks: chains point into it
    TextMap<std::vector<const Param*>> by_layer;
    // The parameters of the modules inside each layer ("" holds all).
    TextMap<std::vector<const Param*>> inside;

    // The chain each adopted copy of a compiled graph starts from, by its
    // parameter's "layer.name" (allocscope.torch's frame scopes): from the
    // registered parameter where there is one, else from one of its own in
    // `params` (never in by_layer: it has no shape and seeds nothing).
    TextMap<ChainPtr> compiled;

    // Set once by install, read-only after.
    Derived derived = nullptr;
    CurrentLayer current_layer = nullptr;
    KindDepth kind_depth = nullptr;
    CurrentStep current_step = nullptr;
    Mark mark = nullptr;
    uint32_t forward = 0;
    uint32_t backward = 0;
    bool debug = false;

    std::atomic<uint64_t> ops{0}, op_ns{0}, slow{0}, seeds{0}, marked{0}, declared{0}, adopted{0};
};

// Never destroyed: callbacks may still run on other threads while the
// process exits.
State& state() {
    static State* s = new State;
    return *s;
}

std::atomic<bool> g_installed{false};

// What compiled graphs declared derived, by address (the interposer's scope
// listener): the observer follows an eager op's input whose storage is one
// of these as it follows a storage of its own map. Inductor allocates a
// buffer per FX node inside the compiled call, where no op is observed, so
// without this a weight copy that a compiled forward saves for an eager
// backward (an autograd.Function's body compiled as its own frame) is known
// to the trace but not to the observer, and the backward's transpose of it
// goes unproven. An address leaves when it is freed (before the free: it
// cannot have been taken again yet). Its own lock, held for a map lookup or
// change only: the listener runs inside the caching allocator's lock, and
// the observer takes this one under the map's lock, never the other way.
struct CompiledCopy {
    std::string layer;
    std::string param;
};
struct CompiledCopies {
    std::mutex mu;
    std::unordered_map<const void*, CompiledCopy> by_address;
    KnownFilter filter;  // the keys of by_address (and some freed ones)
    size_t freed = 0;    // erased since the filter was last rebuilt
    std::atomic<bool> any{false};
};
CompiledCopies& compiled_copies() {
    static CompiledCopies* d = new CompiledCopies;  // never destroyed, as the state
    return *d;
}

void on_scope_derived(const void* address, const char* layer, const char* param,
                      const char*) noexcept {
    if (!address || !layer || !param) return;
    CompiledCopies& d = compiled_copies();
    try {
        std::lock_guard lock(d.mu);
        d.by_address.insert_or_assign(address, CompiledCopy{layer, param});
        d.filter.add(address);
        d.any.store(true, std::memory_order_relaxed);
    } catch (...) {  // out of host memory: the copy is not followed
    }
}

// Called for every free of the process: nothing but an atomic load until a
// compiled graph has declared a copy.
void on_address_freed(const void* address) noexcept {
    CompiledCopies& d = compiled_copies();
    if (!d.any.load(std::memory_order_relaxed) || !d.filter.may_hold(address)) return;
    std::lock_guard lock(d.mu);
    if (d.by_address.erase(address) == 0) return;
    // Freed addresses keep their bits until the filter is rebuilt.
    if (++d.freed < std::max<size_t>(1024, 2 * d.by_address.size())) return;
    d.filter.rebuild([&d] {
        for (const auto& entry : d.by_address)
            d.filter.add(entry.first);
    });
    d.freed = 0;
}

// Whether the storage's data may be a compiled graph's declared copy;
// without a lock.
bool may_be_compiled_copy(const c10::StorageImpl* impl) noexcept {
    const CompiledCopies& d = compiled_copies();
    return d.any.load(std::memory_order_relaxed) && d.filter.may_hold(impl->data_ptr().get());
}

uint64_t mono_ns() noexcept {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The gate. An op can derive from a parameter only where a seed can be
// found (inside a forward or backward tag of a layer that has registered
// parameters, or has modules with some inside it, or is inside such a
// layer: seed_param's rule) or where what was derived there is used
// again, which is the same places for the
// weight copies and transposes that FP8 linears make. Elsewhere (attention
// and activation functions between the linears, the loss, the optimizer,
// FSDP's copies between the layers) no op can take a parameter's seed, and
// RecordFunction would still box every op's inputs and outputs for the
// callback. So where the shim's tags come through tag_hooks.cpp, the
// callback is enabled only while some thread is in such a scope:
// provenance_tag_changed() looks again after each tag call of a thread,
// and the callback is disabled when no thread is in one. Where tags come
// another way (ctypes, NVTX) the gate stays open.
// The steps observed (see "Steps" above): set before install, read-only
// after.
struct Schedule {
    uint64_t first = 4;    // the first steps observed; 0: every step
    uint64_t every = 100;  // then `window` steps in every `every`; 0: none
    uint64_t window = 2;
    bool observes(uint64_t since_install) const noexcept {
        if (first == 0 || since_install < first) return true;
        return every > 0 && since_install % every < window;
    }
};
Schedule g_schedule;

struct Gate {
    std::mutex mu;
    at::CallbackHandle handle = 0;
    bool enabled = true;  // the callback's state
    int threads = 0;      // threads in a parameter scope
    std::atomic<uint64_t> switches{0};
    // The window: whether the current step is observed, as of the step in
    // `step_seen` (the first tag call of each step looks again).
    bool windowed = false;  // a schedule applies (tags through tag_hooks.cpp)
    bool observing = true;
    std::atomic<bool> observing_now{true};  // `observing`, read without the lock
    // Paused, no thread's scope is followed: a pause starts a new
    // generation, and a thread's t_in_scope of an older one counts as false.
    std::atomic<uint64_t> generation{1};
    uint64_t base_step = 0;  // the interposer's step at install
    std::atomic<uint64_t> step_seen{0};
    std::atomic<uint64_t> pauses{0};
};
Gate& gate() {
    static Gate* g = new Gate;  // never destroyed, as the state
    return *g;
}
std::atomic<bool> g_gating{false};
thread_local bool t_in_scope = false;
thread_local uint64_t t_generation = 0;  // of Gate::generation, when t_in_scope was set

// "first 4, then 2 in every 100", for the debug line.
std::string schedule_text() {
    const Schedule& c = g_schedule;
    if (c.first == 0) return "all";
    std::string out = "the first " + std::to_string(c.first);
    if (c.every == 0) return out + ", none after";
    return out + ", then " + std::to_string(c.window) + " in every " + std::to_string(c.every);
}

// ALLOCSCOPE_LOG=debug: one line at exit.
struct Report {
    ~Report() {
        // Not in a process that ran no op under the observer (a launcher).
        if (!g_installed.load() || !state().debug || state().ops.load() == 0) return;
        State& s = state();
        const uint64_t ops = s.ops.load();
        const std::string per_step = allocscope::torch_bridge::per_step_text(s.op_ns.load());
        std::fprintf(stderr,
                     "allocscope: provenance: %llu ops observed, %llu ns each, %llu on the slow "
                     "path; %llu seeds, %llu derived storages, %llu declared%s\n",
                     static_cast<unsigned long long>(ops),
                     static_cast<unsigned long long>(ops ? s.op_ns.load() / ops : 0),
                     static_cast<unsigned long long>(s.slow.load()),
                     static_cast<unsigned long long>(s.seeds.load()),
                     static_cast<unsigned long long>(s.marked.load()),
                     static_cast<unsigned long long>(s.declared.load()), per_step.c_str());
        if (s.adopted.load())
            std::fprintf(stderr,
                         "allocscope: provenance: %llu storages of compiled graphs' weight "
                         "copies read by observed ops\n",
                         static_cast<unsigned long long>(s.adopted.load()));
        if (g_gating.load())
            std::fprintf(stderr,
                         "allocscope: provenance: the gate switched the observer %llu times\n",
                         static_cast<unsigned long long>(gate().switches.load()));
        if (gate().windowed)
            std::fprintf(stderr, "allocscope: provenance: paused %llu times (steps %s)\n",
                         static_cast<unsigned long long>(gate().pauses.load()),
                         schedule_text().c_str());
    }
};
Report g_report;

enum class OpKind { plain, copy, no_values };

// Ops whose outputs hold none of their inputs' values: the input is there
// for its shape, dtype and device.
bool carries_no_values(std::string_view op) {
    static constexpr std::string_view kOps[] = {
        "aten::empty_like",        "aten::zeros_like", "aten::ones_like",    "aten::full_like",
        "aten::rand_like",         "aten::randn_like", "aten::randint_like", "aten::new_empty",
        "aten::new_empty_strided", "aten::new_zeros",  "aten::new_ones",     "aten::new_full",
        "aten::empty_strided",     "aten::empty",      "aten::zeros",        "aten::ones",
    };
    return std::find(std::begin(kOps), std::end(kOps), op) != std::end(kOps);
}

OpKind classify(std::string_view op) {
    if (op == "aten::copy_") return OpKind::copy;
    if (carries_no_values(op)) return OpKind::no_values;
    return OpKind::plain;
}

std::string_view short_name(std::string_view op) {
    constexpr std::string_view kAten = "aten::";
    if (op.substr(0, kAten.size()) == kAten) op.remove_prefix(kAten.size());
    return op;
}

// The storage behind `t` (alive as long as `t` is), or nullptr for a tensor
// the observer does not follow: undefined, without storage (sparse), or
// with Python dispatch. unsafe_storage: storage() throws for some tensors.
const c10::Storage* storage_of(const at::Tensor& t) {
    if (!t.defined()) return nullptr;
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (impl->is_python_dispatch() || !impl->has_storage()) return nullptr;
    const c10::Storage& storage = impl->unsafe_storage();
    return storage ? &storage : nullptr;
}

// Calls `f(tensor)` for each tensor in `v` (lists and tuples looked into).
template <class F>
void each_tensor(const c10::IValue& v, F&& f) {
    if (v.isTensor()) {
        f(v.toTensor());
    } else if (v.isList()) {
        for (const c10::IValue& item : v.toListRef())
            if (item.isTensor()) f(item.toTensor());
    } else if (v.isTuple()) {
        for (const c10::IValue& item : v.toTupleRef().elements())
            if (item.isTensor()) f(item.toTensor());
    }
}

// Per thread: the propagating ops now running, innermost last, for the
// name of a copy_ inside one of them.
struct OpenOp {
    const void* ctx;
    char name[kOpName];
};
thread_local OpenOp t_open[kOpenOps];
thread_local int t_depth = 0;

struct Context : at::ObserverContext {
    ChainPtr chain;
    std::string label;         // the op's name in the chain
    c10::Storage copy_target;  // copy_: self's storage
    int slot = -1;             // index in t_open, -1 when not pushed
};

// Whether the calling thread is inside a module's forward or backward tag.
bool in_pass(const State& s) {
    return s.kind_depth(s.forward) > 0 || s.kind_depth(s.backward) > 0;
}

// The layer of the calling thread's innermost tag, in a buffer of the
// thread's that is reused (it runs after every tag call under the gate):
// valid until the thread's next call.
std::string_view current_layer(const State& s) {
    thread_local std::string layer(256, '\0');
    size_t n = s.current_layer(layer.data(), layer.size());
    if (n >= layer.size()) {
        layer.resize(n + 1);
        n = std::min(s.current_layer(layer.data(), layer.size()), n);
    }
    return std::string_view(layer.data(), n);
}

// Whether the calling thread recomputes a forward inside a backward pass
// (activation checkpointing). A reentrant checkpoint detaches the inputs
// of what it recomputes: leaves that require grad, whose shape (tokens,
// hidden) one of the parameters inside a block may have where a layer's
// own rarely does. Torch before 2.0 cannot be asked from here: false.
bool recomputing(const State& s) {
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
    return s.kind_depth(s.forward) > 0 && torch::autograd::get_current_graph_task_id() >= 0;
#else
    (void)s;
    return false;
#endif
}

// The registered parameters of `layer`; where it has none, those of the
// modules inside it (not while recomputing: see there); where it has none
// inside either, those of the nearest layer enclosing it that has some; or
// nullptr. `s`'s map lock is held.
const std::vector<const Param*>* nearest_params(const State& s, std::string_view layer,
                                                bool look_inside) {
    if (s.by_layer.empty()) return nullptr;
    if (auto own = s.by_layer.find(layer);
        look_inside && (own == s.by_layer.end() || own->second.empty())) {
        auto inside = s.inside.find(layer);
        if (inside != s.inside.end() && !inside->second.empty()) return &inside->second;
    }
    for (;;) {
        auto it = s.by_layer.find(layer);
        if (it != s.by_layer.end() && !it->second.empty()) return &it->second;
        if (layer.empty()) return nullptr;
        const size_t dot = layer.rfind('.');
        layer = layer.substr(0, dot == std::string_view::npos ? 0 : dot);
    }
}

// The registered parameter `t` is (see the rules above), or nullptr. `s`'s
// map lock is held.
const Param* seed_param(State& s, const at::Tensor& t) {
    if (s.by_layer.empty() || !in_pass(s)) return nullptr;
    const std::vector<const Param*>* params = nearest_params(s, current_layer(s), !recomputing(s));
    if (!params) return nullptr;
    const c10::IntArrayRef shape = t.sizes();
    const Param* found = nullptr;
    for (const Param* p : *params) {
        if (!std::equal(p->shape.begin(), p->shape.end(), shape.begin(), shape.end())) continue;
        if (found) return nullptr;  // two parameters of that shape
        found = p;
    }
    return found;
}

bool in_param_scope(State& s) {
    if (!in_pass(s)) return false;
    const std::string_view layer = current_layer(s);
    const bool look_inside = !recomputing(s);
    std::lock_guard lock(s.mu);
    return nearest_params(s, layer, look_inside) != nullptr;
}

// Drops the entries of dead storages when the map has doubled since the
// last sweep. `s`'s map lock is held.
void sweep_if_due(State& s) {
    if (s.known.size() < s.sweep_at) return;
    for (auto it = s.known.begin(); it != s.known.end();) {
        if (it->second.storage.expired()) {
            it = s.known.erase(it);
        } else {
            ++it;
        }
    }
    s.filter.rebuild([&s] {
        for (const auto& [impl, entry] : s.known)
            s.filter.add(impl);
    });
    s.sweep_at = std::max(kFirstSweep, 2 * s.known.size());
}

// The chain of a storage whose data a compiled graph declared derived, or
// nullptr: "layers.0.fc1.weight -> torch.compile'd graph". `s`'s map lock is
// held.
ChainPtr compiled_copy(State& s, const c10::StorageImpl* impl) {
    if (!may_be_compiled_copy(impl)) return nullptr;
    CompiledCopy copy;
    {
        CompiledCopies& d = compiled_copies();
        std::lock_guard lock(d.mu);
        auto it = d.by_address.find(impl->data_ptr().get());
        if (it == d.by_address.end()) return nullptr;
        copy = it->second;
    }
    std::string full = copy.layer.empty() ? copy.param : copy.layer + "." + copy.param;
    auto [at, made] = s.compiled.try_emplace(std::move(full));
    if (made) {
        const Param* param = nullptr;
        if (auto own = s.by_layer.find(copy.layer); own != s.by_layer.end())
            for (const Param* p : own->second)
                if (p->name == copy.param) param = p;
        if (!param) {
            s.params.push_back(Param{copy.layer, copy.param, at->first, {}});
            param = &s.params.back();
        }
        at->second = extend(root_chain(param), "torch.compile'd graph");
    }
    return at->second;
}

// A tensor that may be a seed (the rules above; the layer and shape are
// looked at under the lock).
bool may_seed(const at::Tensor& t) {
    return t.requires_grad() && t.is_leaf() && !t.is_view();
}

// The map's entry of `storage` (`t`'s), made here for a seed or for a
// compiled graph's declared copy, or nullptr. `s`'s map lock is held.
const Entry* entry_for(State& s, const c10::Storage& storage, const at::Tensor& t) {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    if (auto it = s.known.find(impl); it != s.known.end()) return &it->second;
    ChainPtr chain;
    if (const Param* p = may_seed(t) ? seed_param(s, t) : nullptr) {
        chain = root_chain(p);
        s.seeds.fetch_add(1, std::memory_order_relaxed);
    } else if ((chain = compiled_copy(s, impl))) {
        s.adopted.fetch_add(1, std::memory_order_relaxed);
    } else {
        return nullptr;
    }
    s.filter.add(impl);
    return &s.known.emplace(impl, Entry{storage.getWeakStorageImpl(), std::move(chain)})
                .first->second;
}

// Whether the op can derive anything, from its inputs alone and without
// the lock: every tensor input of a plain op, and the source of a copy_,
// must be in the map or a possible seed. False for nearly every op.
bool may_derive(const State& s, c10::ArrayRef<const c10::IValue> inputs, OpKind kind) {
    bool ok = true;
    size_t tensors = 0;
    size_t index = 0;
    for (const c10::IValue& v : inputs) {
        const size_t arg = index++;
        if (kind == OpKind::copy && arg != 1) continue;
        each_tensor(v, [&](const at::Tensor& t) {
            if (!ok || !t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
            ++tensors;
            const c10::Storage* storage = storage_of(t);
            ok = storage && (s.filter.may_hold(storage->unsafeGetStorageImpl()) || may_seed(t) ||
                             may_be_compiled_copy(storage->unsafeGetStorageImpl()));
        });
        if (!ok) return false;
    }
    return tensors > 0;
}

std::unique_ptr<at::ObserverContext> start(const at::RecordFunction& fn) {
    State& s = state();
    const c10::ArrayRef<const c10::IValue> inputs = fn.inputs();
    if (inputs.empty()) return nullptr;
    const std::string_view name = fn.name();
    // copy_ first: which inputs may_derive looks at depends on it; the
    // list of ops that carry no values only for the few ops that pass.
    if (!may_derive(s, inputs, name == "aten::copy_" ? OpKind::copy : OpKind::plain))
        return nullptr;
    const OpKind kind = classify(name);
    if (kind == OpKind::no_values) return nullptr;
    if (s.debug) s.slow.fetch_add(1, std::memory_order_relaxed);

    size_t tensors = 0;
    bool all_known = true;
    ChainPtr first;
    ChainPtr copy_src;
    c10::Storage copy_target;
    {
        std::lock_guard lock(s.mu);
        size_t index = 0;
        for (const c10::IValue& v : inputs) {
            const size_t arg = index++;
            each_tensor(v, [&](const at::Tensor& t) {
                if (!t.defined() || t.unsafeGetTensorImpl()->is_wrapped_number()) return;
                ++tensors;
                const c10::Storage* storage = storage_of(t);
                const Entry* entry = storage ? entry_for(s, *storage, t) : nullptr;
                if (kind == OpKind::copy) {
                    if (arg == 0 && !entry && storage) {
                        // self must be a whole storage, filled by this copy.
                        const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
                        if (impl->storage_offset() == 0 && impl->is_non_overlapping_and_dense() &&
                            static_cast<size_t>(impl->numel()) * impl->itemsize() ==
                                storage->nbytes())
                            copy_target = *storage;
                    } else if (arg == 1 && entry) {
                        copy_src = entry->chain;
                    }
                }
                if (!entry) {
                    all_known = false;
                } else if (tensors == 1) {
                    first = entry->chain;
                }
            });
        }
    }

    if (kind == OpKind::copy) {
        if (!copy_src || !copy_target) return nullptr;
        auto ctx = std::make_unique<Context>();
        ctx->chain = std::move(copy_src);
        ctx->copy_target = std::move(copy_target);
        ctx->label = t_depth > 0 && t_depth <= kOpenOps ? t_open[t_depth - 1].name : "copy_";
        return ctx;
    }
    if (kind != OpKind::plain || tensors == 0 || !all_known) return nullptr;
    auto ctx = std::make_unique<Context>();
    ctx->chain = std::move(first);
    ctx->label = short_name(name);
    ctx->slot = t_depth;
    if (t_depth < kOpenOps) {
        OpenOp& open = t_open[t_depth];
        open.ctx = ctx.get();
        const size_t n = std::min(ctx->label.size(), kOpName - 1);
        std::memcpy(open.name, ctx->label.data(), n);
        open.name[n] = '\0';
    }
    ++t_depth;
    return ctx;
}

struct Declaration {
    const void* ptr;
    ChainPtr chain;  // its parameter and text
    bool cuda;       // a CUDA storage: declared only where it is an allocation (bridge.cpp)
};

void mark(State& s, const c10::Storage& storage, const ChainPtr& chain,
          c10::SmallVector<Declaration, 2>& out) {
    s.known.emplace(storage.unsafeGetStorageImpl(), Entry{storage.getWeakStorageImpl(), chain});
    s.filter.add(storage.unsafeGetStorageImpl());
    s.marked.fetch_add(1, std::memory_order_relaxed);
    const void* ptr = storage.unsafeGetStorageImpl()->data_ptr().get();
    if (ptr) out.push_back({ptr, chain, storage.device().is_cuda()});
}

void end(const at::RecordFunction& fn, Context& ctx) {
    State& s = state();
    if (ctx.slot >= 0) {
        // Back to the depth before this op; an op that ended on another
        // thread (async) leaves the entries that a later end truncates.
        if (t_depth > ctx.slot && (ctx.slot >= kOpenOps || t_open[ctx.slot].ctx == &ctx))
            t_depth = ctx.slot;
    }
    c10::SmallVector<Declaration, 2> declare;
    {
        std::lock_guard lock(s.mu);
        sweep_if_due(s);
        ChainPtr chain;
        auto derive = [&](const c10::Storage* storage) {
            if (!storage || s.known.count(storage->unsafeGetStorageImpl())) return;
            if (!chain) chain = extend(ctx.chain, ctx.label);
            mark(s, *storage, chain, declare);
        };
        if (ctx.copy_target) {
            derive(&ctx.copy_target);
        } else {
            for (const c10::IValue& v : fn.outputs())
                each_tensor(v, [&](const at::Tensor& t) {
                    if (t.defined() && t.numel() > 0) derive(storage_of(t));
                });
        }
    }
    // A CUDA storage only where it is an allocation of its own (bridge.cpp);
    // other storages are never allocations of the trace, and a declaration
    // about one names nothing a detector follows.
    const bool visible =
        allocscope::torch_bridge::g_tensors_visible.load(std::memory_order_relaxed);
    for (const Declaration& d : declare) {
        if (d.cuda && !visible) continue;
        const Param* p = d.chain->param;
        s.derived(d.ptr, p->layer.c_str(), p->name.c_str(), d.chain->text.c_str());
    }
    s.declared.fetch_add(declare.size(), std::memory_order_relaxed);
}

// Adds the time since `t0` to the callbacks' total (debug only).
void count_time(State& s, uint64_t t0) {
    if (s.debug) s.op_ns.fetch_add(mono_ns() - t0, std::memory_order_relaxed);
}

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
    State& s = state();
    uint64_t t0 = 0;
    if (s.debug) {
        t0 = mono_ns();
        s.ops.fetch_add(1, std::memory_order_relaxed);
    }
    std::unique_ptr<at::ObserverContext> ctx;
    try {
        ctx = start(fn);
    } catch (...) {  // out of memory, a tensor whose sizes cannot be read
    }
    count_time(s, t0);
    return ctx;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
    if (!ctx) return;
    State& s = state();
    const uint64_t t0 = s.debug ? mono_ns() : 0;
    try {
        end(fn, *static_cast<Context*>(ctx));
    } catch (...) {
    }
    count_time(s, t0);
}

void copy_error(const char* text, char* error, size_t error_size) {
    if (!error || error_size == 0) return;
    std::snprintf(error, error_size, "%s", text);
}

template <class F>
bool resolve(F& out, const char* name) {
    out = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
    return out != nullptr;
}

// Whether the callback should run now: some thread in a parameter scope
// (when gated) and the step observed (when windowed). `g`'s lock is held.
void apply_gate(Gate& g) {
    const bool want = (!g_gating.load(std::memory_order_relaxed) || g.threads > 0) && g.observing;
    if (want == g.enabled) return;
    if (want) {
        at::reenableCallback(g.handle);
    } else {
        at::disableCallback(g.handle);
    }
    g.enabled = want;
    g.switches.fetch_add(1, std::memory_order_relaxed);
}

// The first tag call of a step looks whether the step is observed, and
// marks the trace where that changes. `g`'s lock is not held.
void check_window(Gate& g) {
    const State& s = state();
    const uint64_t step = s.current_step();
    if (step == g.step_seen.load(std::memory_order_relaxed)) return;
    std::lock_guard lock(g.mu);
    if (step == g.step_seen.load(std::memory_order_relaxed)) return;
    g.step_seen.store(step, std::memory_order_relaxed);
    const bool observe = g_schedule.observes(step >= g.base_step ? step - g.base_step : 0);
    if (observe == g.observing) return;
    g.observing = observe;
    g.observing_now.store(observe, std::memory_order_relaxed);
    if (!observe) {
        g.pauses.fetch_add(1, std::memory_order_relaxed);
        g.threads = 0;
        g.generation.fetch_add(1, std::memory_order_relaxed);
    }
    // Before the callback changes: the mark precedes what the step does.
    s.mark(observe ? ALLOCSCOPE_PROVENANCE_RESUMED : ALLOCSCOPE_PROVENANCE_PAUSED);
    apply_gate(g);
}

}  // namespace

void allocscope::torch_bridge::provenance_tag_changed() noexcept {
    if (!g_installed.load(std::memory_order_acquire)) return;
    try {
        Gate& g = gate();
        if (g.windowed) check_window(g);
        if (!g_gating.load(std::memory_order_relaxed)) return;
        // Paused: nothing to follow until the window opens again.
        if (!g.observing_now.load(std::memory_order_relaxed)) return;
        const bool now = in_param_scope(state());
        if (t_generation == g.generation.load(std::memory_order_relaxed) && now == t_in_scope)
            return;
        std::lock_guard lock(g.mu);
        if (t_generation != g.generation.load(std::memory_order_relaxed)) {
            t_generation = g.generation.load(std::memory_order_relaxed);
            t_in_scope = false;  // not counted in this generation
        }
        if (!g.observing || now == t_in_scope) return;
        t_in_scope = now;
        g.threads += now ? 1 : -1;
        apply_gate(g);
    } catch (...) {  // out of memory: the gate stays as it is
    }
}

ALLOCSCOPE_BRIDGE_EXPORT int allocscope_torch_provenance_install(uint32_t forward_kind,
                                                                 uint32_t backward_kind,
                                                                 char* error, size_t error_size) {
    copy_error("", error, error_size);
    static std::mutex install_mu;
    std::lock_guard lock(install_mu);
    if (g_installed.load()) return 1;
    State& s = state();
    if (!resolve(s.derived, "allocscope_derived") ||
        !resolve(s.current_layer, "allocscope_current_layer") ||
        !resolve(s.kind_depth, "allocscope_keyed_kind_depth") ||
        !resolve(s.current_step, "allocscope_current_step") ||
        !resolve(s.mark, "allocscope_mark")) {
        copy_error(
            "liballocscope.so in this process has no allocscope_derived (too old, or not "
            "loaded)",
            error, error_size);
        return -1;
    }
    s.forward = forward_kind;
    s.backward = backward_kind;
    s.debug = allocscope::torch_bridge::config_text("ALLOCSCOPE_LOG") == "debug";
    try {
        Gate& g = gate();
        std::lock_guard lock(g.mu);
        g.handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                             .needsInputs(true)
                                             .needsOutputs(true)
                                             .scopes({at::RecordScope::FUNCTION}));
        // Gated from here on when the tags come through tag_hooks.cpp;
        // enable() installs before any module runs, so no thread is in a
        // scope yet. ALLOCSCOPE_PROVENANCE_GATE=0 keeps it open (to measure
        // what the gate saves, and whether it loses anything).
        const bool hooks = allocscope::torch_bridge::g_tags_through_hooks.load();
        if (hooks && allocscope::torch_bridge::config_text("ALLOCSCOPE_PROVENANCE_GATE") != "0") {
            at::disableCallback(g.handle);
            g.enabled = false;
            g_gating.store(true);
        }
        // The steps are counted from this one; windowed only where the
        // tag calls come here to look at the step.
        g.windowed = hooks && g_schedule.first != 0;
        g.base_step = s.current_step();
        g.step_seen.store(g.base_step, std::memory_order_relaxed);
    } catch (const std::exception& e) {
        std::string what = e.what();
        if (const size_t nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
        copy_error(("addGlobalCallback failed: " + what).c_str(), error, error_size);
        return -1;
    }
    // An older liballocscope.so has no listener: compiled graphs' copies
    // are then followed only where an observed op makes them.
    using ScopeListener = void (*)(void (*)(const void*, const char*, const char*, const char*),
                                   void (*)(const void*));
    if (ScopeListener listen = nullptr; resolve(listen, "allocscope_set_scope_listener"))
        listen(on_scope_derived, on_address_freed);
    g_installed.store(true);
    return 0;
}

ALLOCSCOPE_BRIDGE_EXPORT void allocscope_torch_provenance_steps(uint64_t first, uint64_t every,
                                                                uint64_t window) {
    if (g_installed.load()) return;  // read without a lock once installed
    g_schedule.first = first;
    g_schedule.every = every;
    g_schedule.window = every == 0 ? 0 : std::min(std::max<uint64_t>(window, 1), every);
}

ALLOCSCOPE_BRIDGE_EXPORT void allocscope_torch_provenance_param(const char* layer, const char* name,
                                                                const int64_t* shape, size_t ndim) {
    if (!layer || !name || (ndim && !shape)) return;
    State& s = state();
    try {
        std::lock_guard lock(s.mu);
        Param p;
        p.layer = layer;
        p.name = name;
        p.full = p.layer.empty() ? p.name : p.layer + "." + p.name;
        p.shape.assign(shape, shape + ndim);
        std::vector<const Param*>& of_layer = s.by_layer[p.layer];
        for (const Param* q : of_layer)
            if (q->name == p.name) return;  // registered already (a second root of it)
        s.params.push_back(std::move(p));
        const Param* added = &s.params.back();
        of_layer.push_back(added);
        // Each enclosing layer's "inside": "a.b.c" is inside "a.b", "a" and "".
        std::string_view enclosing = added->layer;
        while (!enclosing.empty()) {
            const size_t dot = enclosing.rfind('.');
            enclosing = enclosing.substr(0, dot == std::string_view::npos ? 0 : dot);
            s.inside[std::string(enclosing)].push_back(added);
        }
    } catch (...) {
    }
}
