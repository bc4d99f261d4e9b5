"""allocscope for PyTorch: module, backward and optimizer hooks that tag every
allocation with the module running it, parameter registration for the
detectors, and the caching-allocator bridge.

    import allocscope.torch
    allocscope.torch.enable(model, optimizer)     # both optional

`allocscope run` calls enable() with no arguments as soon as a traced Python
process imports torch (tools/python/sitecustomize.py), so a training script
needs no change.

Tags (layer, phase), all per thread:

* forward: a global forward pre-hook enters (layer = the module's qualified
  name, "forward"); a global forward hook registered with always_call=True
  leaves it, also when forward raises (torch < 2.0 has no always_call: a
  forward that raises there leaves its entry on the thread's stack until
  an enclosing module's leave pops it).
* backward: when a module call's forward ends (with grad enabled), tensor
  hooks go on its outputs and inputs that require grad. The outputs' hooks
  enter (layer, "backward") when the first gradient of an output is ready,
  on the thread autograd runs the backward on; the inputs' hooks leave it
  when the gradient of an input is. A module none of whose inputs requires
  grad (the root, the first layer) gets no leave: its tag stays until the
  backward of a module outside it begins or the backward pass ends (an
  autograd final callback, when it runs on the same thread), so the first
  layer's backward is tagged like the others and the root's ("") encloses
  the whole backward pass. When a module and the module it returns the
  output of share an output tensor, the inner one's hook fires first; the
  outer one's enter puts the inner one back on top of it. Tensor hooks wrap
  nothing in autograd functions (global full backward hooks put two
  BackwardHookFunctions around every module call and refuse modules that
  modify their input in place) and fire before the hooks registered after
  them on the same tensor, such as FSDP2's pre-backward hooks.
* recomputation: a module forward that runs inside a backward pass
  (activation checkpointing recomputing it, reentrant or not) enters
  (layer, "backward/recompute") instead: its memory is the backward's, at
  the time it is used. Inside a backward means torch's graph task id on
  the calling thread (torch._C._current_graph_task_id, torch 2.x), or,
  where torch has none, a backward entry on the thread's tag stack or the
  autograd engine answering torch._C._will_engine_execute_node, which it
  does only on a thread that runs a backward pass (torch 1.13).
* optimizer: global optimizer step pre-/post-hooks enter and leave
  (enclosing layer, "optimizer"); torch < 2.0 has none, so there each
  Optimizer subclass's step() is wrapped instead (_StepWrappers). After
  each step of the first optimizer that steps (or the one passed to enable)
  the process-wide step is incremented (allocscope_step).

Layer names. Modules of a known model are named by its named_modules(): the
model passed to enable(), else every *root* found lazily: the top-most module
called on a thread whose tag stack is empty. The first root is the PyTorch
root "" and its children are "layers.0", "layers.0.fc1", ...; a later, different
root is named after its class ("Critic", "Critic.layers.0", ...). A module of
no known model (called inside another module before any root saw it) is named
lazily "<enclosing layer>.<ClassName>". When a root's first forward begins,
every parameter of it is registered: numel from the (global) shape, sharded
numel from DTensor.to_local() for FSDP2 parameters, the dtype as "bf16",
"fp32", "fp8_e4m3", .... The components wrappers insert are left out, as
torch's state dicts leave them out: "_orig_mod" (torch.compile's
OptimizedModule), "_checkpoint_wrapped_module" (checkpoint_wrapper) and
"_fsdp_wrapped_module" (FSDP1); a wrapper and the module it wraps share
a name.

torch.compile. Hooks do nothing while Dynamo traces (they would put
graph breaks in the compiled code). A block compiled as torch.compile(block)
(an OptimizedModule) is itself called outside, so its allocations and its
backward keep the block's tag; a module compiled in place (module.compile())
gets its hooks called around its compiled call (_compiled.py). Inside the
compiled code, the buffers inductor's generated file allocates are tagged
per line with the module of the FX node each was lowered from, under the
enclosing tag ("layers.3" + "mlp.fc1"), declared derived from a parameter
when computed from parameters alone, and their frames named by the user's
source line (_compiled.py; docs/DESIGN.md "Compiled graphs"). For that,
inductor's FX graph and AOT autograd caches are off unless the program's
environment sets TORCHINDUCTOR_FX_GRAPH_CACHE / TORCHINDUCTOR_AUTOGRAD_CACHE.

Pairing. Tags are the interposer's keyed tags (allocscope_enter and friends
in include/allocscope/allocscope.h), keyed by the module's (or optimizer's)
id: a leave pops down to its own enter (entries above it whose leave never
came go with it) and a leave without an enter does nothing, so an exception
never leaves the stack unbalanced. A backward enter is
allocscope_enter_nested: backward entries of an earlier forward pass
(generation) go, and so do those of modules that do not enclose it.
Optimizer entries of a step() that raised go at the next step().

Environment: ALLOCSCOPE_PYTHON_BACKWARD=0 leaves out the backward hooks.
ALLOCSCOPE_PYTHON_MODULES=0 leaves out the module hooks altogether (no layer
tags, no parameters registered; steps and per-tensor blocks stay).
ALLOCSCOPE_TORCH_BLOCKS=0 does not attach the bridge to the caching
allocator (segments only, and no Python lines for them). The two exist to
measure what each part costs (tests/bench/torch_overhead.py --breakdown).
ALLOCSCOPE_TORCH_BRIDGE: the bridge library's path. ALLOCSCOPE_BRIDGE_HOOKS=0:
tag through ctypes and Python tensor hooks even where the bridge is built.
ALLOCSCOPE_LOG=debug: which of the two tags, and each Python hook's calls and
average time, one line each at exit.

Provenance (on by default; ALLOCSCOPE_PROVENANCE=0 or `allocscope run
--no-provenance` turn it off): enable() installs the bridge's ATen op observer
(tools/torch_bridge/provenance.cpp) and every registered parameter is
passed to it with its full shape; the observer declares each allocation
computed from one parameter alone (allocscope_derived), with the chain of
ops that made it. It needs the bridge (or, on CPU builds of torch, the tag
hooks library) and the module hooks; without them it says so in one line
and the run goes on without it. Whether it runs, and why not, is marked in
the trace with the first parameters registered (allocscope.h,
ALLOCSCOPE_PROVENANCE_MARK), for the run's summary.

Where the bridge (tools/torch_bridge) is built, the hooks' tag calls are
its builtins, not ctypes, the forward pre-hook's plain case (a named module
that is no root) enters there in one call, and the backward wiring of
_forward_post is C++:
tensor hooks that call the interposer on autograd's threads without the GIL,
by the same rules (tag_hooks.cpp). The bridge also attaches to the native
caching allocator's trace tracker once CUDA is initialized and reports every
tensor block to the interposer. With
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync it is not needed: every
tensor is a cudaMallocAsync call the interposer sees.

Layout (one module per part; this one re-exports the public names):
_enable (enable, disable), _naming (layer names, parameters), _hooks (module
forward hooks, backward tensor hooks), _tags (the tag calls: bridge or
ctypes), _optimizer (step hooks, steps), _bridge (the caching-allocator
bridge), _provenance (the op observer), _cost (ALLOCSCOPE_LOG=debug hook
times), _common (the lock, messages, tag kinds).
"""

from ._bridge import attach_bridge
from ._enable import disable, enable
from ._naming import layer_name

__all__ = ["enable", "disable", "attach_bridge", "layer_name"]

# Under `allocscope run`, sitecustomize enables the hooks once torch is
# imported; when this package's own import brought torch in, it leaves
# the call to here.
if globals().pop("_enable_when_imported", False):
    enable()
