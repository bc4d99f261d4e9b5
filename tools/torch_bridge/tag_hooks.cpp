// The PyTorch bridge, second part: the module hooks' tag calls without
// ctypes, and backward tags from C++ tensor hooks.
//
// allocscope.torch tags with the interposer's keyed tags
// (allocscope_enter and friends, include/allocscope/allocscope.h). Through
// ctypes each call costs about a microsecond and each Python tensor hook
// several (Tensor.register_hook builds a handle and a dict per tensor, and
// every backward hook call takes the GIL and runs Python). Here the same
// calls are Python builtins that call the interposer directly, and the
// forward hook's backward wiring is C++:
//
//   enter(key, kind, generation, layer, phase)   allocscope_enter
//   enter_nested(key, kind, generation, layer, phase)
//   leave(key, kind, _)                          allocscope_leave (generation)
//   leave_kind(kind, older_than)                 allocscope_leave_kind
//   keyed_depth()                                allocscope_keyed_depth
//   keyed_kind_depth(kind)                       allocscope_keyed_kind_depth
//   forward_pre(module, generation, names, roots)  the forward pre-hook's
//       plain case, as _hooks.py's _forward_pre: `module` has a final name
//       in `names` (id -> (weakref, name, provisional, encoded name)) and is
//       no root in `roots`: enters (id(module), forward) with its encoded
//       name and the phase, "backward/recompute" inside a backward pass
//       (torch >= 2.0; before, the engine cannot be asked from here), and
//       returns True. Any other case returns False and enters nothing: the
//       Python hook settles the name and enters.
//   forward_post(key, args, output, backward)    leaves (key, forward); when
//       found, `backward` is true and grad mode is on, puts C++ hooks on the
//       output tensors that require grad (those that are not inputs passed
//       through), which enter (layer, "backward") with
//       allocscope_enter_nested, and on the input tensors that require grad,
//       which leave it. A backward enter also queues an autograd final
//       callback that leaves every backward tag of the thread it runs on
//       when the backward pass ends (modules whose inputs need no grad never
//       get their leave). The same rules as _hooks.py's Python version of it.
//
// layer and phase are bytes or None; keys and generations are Python ints.
// The C++ tensor hooks hold no Python object and never take the GIL: they
// run on autograd's threads and call the interposer only (its keyed tags
// are per thread). They go into the tensor's C++ hook list, which autograd
// runs with the tensor's other pre-hooks in the order they were added, so
// they run before the hooks FSDP2 registers after them on the same tensors.
//
// C API (loaded by allocscope/torch/_tags.py with ctypes.PyDLL, GIL held):
//   PyObject* allocscope_torch_bridge_ops(uint32_t forward_kind,
//                                          uint32_t backward_kind)
//     a dict of the builtins above, or None when the interposer's keyed
//     tag calls are not in the process.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>

#include <Python.h>
#include <c10/core/GradMode.h>
#if __has_include(<torch/version.h>)
#include <torch/version.h>
#endif
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/python_variable.h>

#define ALLOCSCOPE_BRIDGE_EXPORT extern "C" __attribute__((visibility("default")))

namespace allocscope::torch_bridge {
extern std::atomic<bool> g_tags_through_hooks;  // provenance.cpp
void provenance_tag_changed() noexcept;         // provenance.cpp: after each tag call
// Pins the calling thread's Python frames' code objects (bridge.cpp, once it
// provides Python frames; null where it does not, or is not in this
// library). Called with the GIL held.
constinit std::atomic<void (*)() noexcept> g_pin_python_frames{nullptr};
}  // namespace allocscope::torch_bridge

namespace {

using allocscope::torch_bridge::provenance_tag_changed;

using Enter = int (*)(uint64_t, uint32_t, uint64_t, const char*, const char*);
using Leave = int64_t (*)(uint64_t, uint32_t, const char**);
using LeaveKind = void (*)(uint32_t, uint64_t);
using KeyedDepth = int (*)();
using KeyedKindDepth = int (*)(uint32_t);

// Set once, under the GIL, before any builtin exists; read-only after.
struct TagApi {
    Enter enter = nullptr;
    Enter enter_nested = nullptr;
    Leave leave = nullptr;
    LeaveKind leave_kind = nullptr;
    KeyedDepth keyed_depth = nullptr;
    KeyedKindDepth keyed_kind_depth = nullptr;
    uint32_t forward = 0;
    uint32_t backward = 0;
};
TagApi g_tags;

// The generation whose backward has the final callback queued, -1 when none.
std::atomic<int64_t> g_end_queued{-1};

void end_of_backward() noexcept {
    g_end_queued.store(-1, std::memory_order_relaxed);
    g_tags.leave_kind(g_tags.backward, UINT64_MAX);
    provenance_tag_changed();
}

// Runs on an autograd thread, without the GIL; must not throw.
void backward_enter(uint64_t key, const char* layer, int64_t generation) noexcept {
    const int entered = g_tags.enter_nested(key, g_tags.backward, static_cast<uint64_t>(generation),
                                            layer, "backward");
    provenance_tag_changed();
    if (entered <= 0) return;
    if (g_end_queued.exchange(generation, std::memory_order_relaxed) == generation) return;
    try {
        torch::autograd::Engine::get_default_engine().queue_callback(end_of_backward);
    } catch (...) {  // not inside a backward pass: nothing to end
        g_end_queued.store(-1, std::memory_order_relaxed);
    }
}

bool u64_arg(PyObject* o, uint64_t& out) {
    out = PyLong_AsUnsignedLongLong(o);
    return !(out == static_cast<uint64_t>(-1) && PyErr_Occurred());
}

bool text_arg(PyObject* o, const char*& out) {
    if (o == Py_None) {
        out = nullptr;
        return true;
    }
    if (PyBytes_Check(o)) {
        out = PyBytes_AS_STRING(o);
        return true;
    }
    PyErr_SetString(PyExc_TypeError, "allocscope: a tag's layer and phase are bytes or None");
    return false;
}

bool arg_count(Py_ssize_t got, Py_ssize_t want, const char* name) {
    if (got == want) return true;
    PyErr_Format(PyExc_TypeError, "allocscope bridge: %s takes %zd arguments (%zd given)", name,
                 want, got);
    return false;
}

template <Enter TagApi::*call>
PyObject* enter_like(PyObject*, PyObject* const* args, Py_ssize_t n) {
    uint64_t key = 0, kind = 0, generation = 0;
    const char* layer = nullptr;
    const char* phase = nullptr;
    if (!arg_count(n, 5, "enter") || !u64_arg(args[0], key) || !u64_arg(args[1], kind) ||
        !u64_arg(args[2], generation) || !text_arg(args[3], layer) || !text_arg(args[4], phase))
        return nullptr;
    const int entered = (g_tags.*call)(key, static_cast<uint32_t>(kind), generation, layer, phase);
    provenance_tag_changed();
    return PyLong_FromLong(entered);
}

PyObject* leave(PyObject*, PyObject* const* args, Py_ssize_t n) {
    uint64_t key = 0, kind = 0;
    if (!arg_count(n, 3, "leave") || !u64_arg(args[0], key) || !u64_arg(args[1], kind))
        return nullptr;
    const int64_t left = g_tags.leave(key, static_cast<uint32_t>(kind), nullptr);
    provenance_tag_changed();
    return PyLong_FromLongLong(left);
}

PyObject* leave_kind(PyObject*, PyObject* const* args, Py_ssize_t n) {
    uint64_t kind = 0, older_than = 0;
    if (!arg_count(n, 2, "leave_kind") || !u64_arg(args[0], kind) || !u64_arg(args[1], older_than))
        return nullptr;
    g_tags.leave_kind(static_cast<uint32_t>(kind), older_than);
    provenance_tag_changed();
    Py_RETURN_NONE;
}

PyObject* keyed_depth(PyObject*, PyObject* const*, Py_ssize_t n) {
    if (!arg_count(n, 0, "keyed_depth")) return nullptr;
    return PyLong_FromLong(g_tags.keyed_depth());
}

PyObject* keyed_kind_depth(PyObject*, PyObject* const* args, Py_ssize_t n) {
    uint64_t kind = 0;
    if (!arg_count(n, 1, "keyed_kind_depth") || !u64_arg(args[0], kind)) return nullptr;
    return PyLong_FromLong(g_tags.keyed_kind_depth(static_cast<uint32_t>(kind)));
}

// Whether the calling thread runs a backward pass (a forward then is a
// recompute): 1 or 0, -1 where this torch cannot tell from C++.
int in_backward_pass() noexcept {
#if defined(TORCH_VERSION_MAJOR) && TORCH_VERSION_MAJOR >= 2
    return torch::autograd::get_current_graph_task_id() >= 0 ? 1 : 0;
#else
    return -1;
#endif
}

PyObject* forward_pre(PyObject*, PyObject* const* args, Py_ssize_t n) {
    uint64_t generation = 0;
    if (!arg_count(n, 4, "forward_pre") || !u64_arg(args[1], generation)) return nullptr;
    if (!PyDict_Check(args[2]) || !PyDict_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "allocscope bridge: forward_pre's names and roots are dicts");
        return nullptr;
    }
    // The frames above this module call are above every allocation in it:
    // their names are made and pinned here, with the GIL, so that the
    // allocations' walks (without it) read no code object for them.
    if (auto pin = allocscope::torch_bridge::g_pin_python_frames.load(std::memory_order_relaxed))
        pin();
    const int backward = in_backward_pass();
    if (backward < 0) Py_RETURN_FALSE;
    PyObject* key = PyLong_FromVoidPtr(args[0]);  // id(module)
    if (!key) return nullptr;
    PyObject* entry = PyDict_GetItemWithError(args[2], key);  // borrowed
    const int root = entry ? PyDict_Contains(args[3], key) : 0;
    Py_DECREF(key);
    if (root < 0 || (!entry && PyErr_Occurred())) return nullptr;
    if (!entry || root || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 4 ||
        !PyBytes_Check(PyTuple_GET_ITEM(entry, 3)))
        Py_RETURN_FALSE;
    const int provisional = PyObject_IsTrue(PyTuple_GET_ITEM(entry, 2));
    if (provisional < 0) return nullptr;
    if (provisional) Py_RETURN_FALSE;
    g_tags.enter(reinterpret_cast<uint64_t>(args[0]), g_tags.forward, generation,
                 PyBytes_AS_STRING(PyTuple_GET_ITEM(entry, 3)),
                 backward ? "backward/recompute" : "forward");
    provenance_tag_changed();
    Py_RETURN_TRUE;
}

// Containers inside containers looked into (allocscope/torch/_hooks.py: the same).
constexpr int kMaxNesting = 4;

// The tensors in `value` that require grad, as the Python objects (identity
// decides "passed through"): `value` itself, or those in it when it is a
// tuple, list or dict (values), or a dataclass instance (the fields in its
// __dict__), down to kMaxNesting levels, as _grad_tensors in
// allocscope/torch/_hooks.py. Every pointer is borrowed from a container that
// `value` holds, so it lives as long as the call's arguments do.
// A module call's tensors: on the stack for the usual few, no allocation.
using Tensors = c10::SmallVector<PyObject*, 8>;

void grad_tensors(PyObject* value, Tensors& out, int depth = 0) {
    if (THPVariable_Check(value)) {
        if (THPVariable_Unpack(value).requires_grad()) out.push_back(value);
        return;
    }
    if (depth >= kMaxNesting || value == Py_None) return;
    if (PyTuple_Check(value)) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(value); ++i)
            grad_tensors(PyTuple_GET_ITEM(value, i), out, depth + 1);
    } else if (PyList_Check(value)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(value); ++i)
            grad_tensors(PyList_GET_ITEM(value, i), out, depth + 1);
    } else if (PyDict_Check(value)) {
        PyObject* key = nullptr;
        PyObject* item = nullptr;
        Py_ssize_t pos = 0;
        while (PyDict_Next(value, &pos, &key, &item))
            grad_tensors(item, out, depth + 1);
    } else {
        PyObject* fields = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(value)),
                                                  "__dataclass_fields__");
        if (fields == nullptr) {
            PyErr_Clear();
            return;
        }
        // A new reference to the instance's own __dict__ (slots dataclasses
        // have none): its items stay alive through the instance.
        PyObject* attrs = PyDict_Check(fields) ? PyObject_GenericGetDict(value, nullptr) : nullptr;
        if (attrs == nullptr) {
            PyErr_Clear();
        } else if (PyDict_Check(attrs)) {
            PyObject* name = nullptr;
            PyObject* field = nullptr;
            Py_ssize_t pos = 0;
            while (PyDict_Next(fields, &pos, &name, &field)) {
                PyObject* item = PyDict_GetItemWithError(attrs, name);
                if (item != nullptr) {
                    grad_tensors(item, out, depth + 1);
                } else if (PyErr_Occurred()) {
                    PyErr_Clear();
                }
            }
        }
        Py_XDECREF(attrs);
        Py_DECREF(fields);
    }
}

PyObject* forward_post(PyObject*, PyObject* const* args, Py_ssize_t n) {
    uint64_t key = 0;
    if (!arg_count(n, 4, "forward_post") || !u64_arg(args[0], key)) return nullptr;
    const int wanted = PyObject_IsTrue(args[3]);
    if (wanted < 0) return nullptr;
    const char* layer = nullptr;
    const int64_t generation = g_tags.leave(key, g_tags.forward, &layer);
    provenance_tag_changed();
    if (generation < 0 || !wanted || !c10::GradMode::is_enabled()) Py_RETURN_NONE;
    try {
        Tensors outputs, inputs;
        grad_tensors(args[2], outputs);
        if (outputs.empty()) Py_RETURN_NONE;
        grad_tensors(args[1], inputs);
        for (PyObject* o : outputs) {
            if (std::find(inputs.begin(), inputs.end(), o) != inputs.end()) continue;
            THPVariable_Unpack(o).register_hook([key, layer, generation](const at::TensorBase&) {
                backward_enter(key, layer, generation);
            });
        }
        for (PyObject* i : inputs) {
            THPVariable_Unpack(i).register_hook([key](const at::TensorBase&) {
                g_tags.leave(key, g_tags.backward, nullptr);
                provenance_tag_changed();
            });
        }
    } catch (python_error& e) {
        e.restore();
        return nullptr;
    } catch (const std::exception& e) {
        PyErr_Format(PyExc_RuntimeError, "allocscope bridge: %s", e.what());
        return nullptr;
    }
    Py_RETURN_NONE;
}

PyMethodDef g_methods[] = {
    {"enter",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&enter_like<&TagApi::enter>)),
     METH_FASTCALL, "allocscope_enter(key, kind, generation, layer, phase)"},
    {"enter_nested",
     reinterpret_cast<PyCFunction>(
         reinterpret_cast<void (*)()>(&enter_like<&TagApi::enter_nested>)),
     METH_FASTCALL, "allocscope_enter_nested(key, kind, generation, layer, phase)"},
    {"leave", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&leave)), METH_FASTCALL,
     "allocscope_leave(key, kind): the entry's generation, -1 when none"},
    {"leave_kind", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&leave_kind)),
     METH_FASTCALL, "allocscope_leave_kind(kind, older_than)"},
    {"keyed_depth", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&keyed_depth)),
     METH_FASTCALL, "allocscope_keyed_depth()"},
    {"keyed_kind_depth",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&keyed_kind_depth)), METH_FASTCALL,
     "allocscope_keyed_kind_depth(kind)"},
    {"forward_pre", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&forward_pre)),
     METH_FASTCALL, "forward_pre(module, generation, names, roots): see tag_hooks.cpp"},
    {"forward_post", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&forward_post)),
     METH_FASTCALL, "forward_post(key, args, output, backward): see tag_hooks.cpp"},
};

template <class F>
bool resolve(F& out, const char* name) {
    out = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
    return out != nullptr;
}

}  // namespace

// The torch this library was compiled against, "<torch.__version__>
// cxx11abi=<0|1>": its structs' layouts (TraceEntry, RecordFunction,
// StorageImpl) are that torch's, so allocscope.torch loads it only into the
// same torch (tools/python/allocscope/torch/_bridge.py).
ALLOCSCOPE_BRIDGE_EXPORT const char* allocscope_torch_bridge_built_for() {
#ifdef ALLOCSCOPE_TORCH_BUILT_FOR
    return ALLOCSCOPE_TORCH_BUILT_FOR;
#else
    return "";
#endif
}

ALLOCSCOPE_BRIDGE_EXPORT PyObject* allocscope_torch_bridge_ops(uint32_t forward_kind,
                                                               uint32_t backward_kind) {
    TagApi api;
    if (!resolve(api.enter, "allocscope_enter") ||
        !resolve(api.enter_nested, "allocscope_enter_nested") ||
        !resolve(api.leave, "allocscope_leave") ||
        !resolve(api.leave_kind, "allocscope_leave_kind") ||
        !resolve(api.keyed_depth, "allocscope_keyed_depth") ||
        !resolve(api.keyed_kind_depth, "allocscope_keyed_kind_depth"))
        Py_RETURN_NONE;
    api.forward = forward_kind;
    api.backward = backward_kind;
    if (g_tags.enter == nullptr) {
        g_tags = api;
    } else if (g_tags.forward != forward_kind || g_tags.backward != backward_kind) {
        // Hooks already made keep their kinds: a second caller must agree.
        PyErr_SetString(PyExc_ValueError, "allocscope bridge: the tag kinds are set already");
        return nullptr;
    }
    PyObject* ops = PyDict_New();
    if (!ops) return nullptr;
    for (PyMethodDef& def : g_methods) {
        PyObject* fn = PyCFunction_New(&def, nullptr);
        if (!fn || PyDict_SetItemString(ops, def.ml_name, fn) < 0) {
            Py_XDECREF(fn);
            Py_DECREF(ops);
            return nullptr;
        }
        Py_DECREF(fn);
    }
    // The shim tags through these from now on (_tags.py): provenance may
    // gate its observer on them.
    allocscope::torch_bridge::g_tags_through_hooks.store(true);
    return ops;
}
