"""FSDP2 + FP8 training in plain PyTorch: the two memory problems of
docs/TE-FSDP2-FP8-MEMORY.md, reproduced without TransformerEngine.

    torchrun --standalone --nproc_per_node 2 tests/gpu/fsdp2_fp8_train.py --mode seed

8 transformer-like layers (hidden 256, FFN 1024, 8 heads, fused QKV, bias,
LayerNorm, GELU, bf16 parameters), each layer and the root sharded with
fully_shard over the ranks; 32 x 2 = 64 tokens per rank, MSE loss, AdamW.
The GEMMs of --mode seed/fixed are an FP8 linear (per-tensor current
scaling, torch.float8_e4m3fn, torch._scaled_mm):

  seed   the quantized FP8 copy of the weight is saved for backward (alive
         from the layer's forward to its backward: problem 1), and backward
         keeps the transposed FP8 copy it builds for the dgrad GEMM in a
         module-level cache until that layer's next forward (problem 2)
  fixed  forward quantizes, multiplies and frees; backward re-quantizes the
         re-gathered weight, transposes, multiplies and frees: nothing
         outlives its phase
  bf16   plain bf16 nn.Linear layers

--fp8-impl picks how the FP8 linear of seed/fixed is written, with the
same lifecycles: "function" (default) quantizes into plain tensors inside
an autograd.Function; "subclass" also runs inside one, but the FP8 copies
are Float8Tensor, a __torch_dispatch__ tensor subclass holding _data (the
float8_e4m3fn bytes) and _scale (scale_inv), whose mm is torch._scaled_mm
and whose t() and contiguous() act on _data, as FP8 libraries written as
tensor subclasses do.

--checkpoint recomputes every layer in backward (activation checkpointing,
torch.utils.checkpoint, non-reentrant): the seed mode's FP8 weight copy is
then not kept from forward to backward (checkpointing drops what the layer
saved and recomputes it), so only the transpose cache is retained.

--grad-accum N runs N forward/backward micro-batches per optimizer step,
gradients reduced on the last only (FSDP2's set_requires_gradient_sync), as
training with gradient accumulation does: the same memory problems each
micro-batch.

--backend gloo runs the collectives over gloo instead of NCCL (staged
through host memory), so that several ranks can share one GPU: rank r uses
GPU r mod the GPU count. NCCL refuses two ranks on one GPU.

It does not import allocscope: run it unchanged under `allocscope run`.

The sizes a detector should find are printed per module on stdout, one JSON
object a line after "ALLOCSCOPE_EXPECT ", and per layer after
"ALLOCSCOPE_EXPECT_LAYER " (0 in modes where nothing is retained): an FP8
e4m3 copy of a W x K weight is W*K bytes (262,144 B for 1024 x 256), its
scale_inv 4 B.

64 tokens per rank by default, the reference test's count. Shapes whose
bytes coincide with a weight form's are kept on purpose (--tokens 256 is
T == H: a [T, 4H] bf16 activation has a [4H, H] bf16 weight's bytes): the
detectors must tell them apart by provenance, not by size.

--compile inplace|wrap compiles each layer with torch.compile (in place,
as torchtitan does, or as an OptimizedModule in the layer's place) before
sharding it.

--master-fp32 (with --mode bf16) keeps fp32 parameters and runs forward
under torch.autocast(bfloat16): autocast casts every Linear weight and bias
to bf16 in each layer's forward and keeps the casts until forward ends; the
weight casts are saved for backward, so every layer's bf16 weight copy is
alive at the end of forward (what FSDP2's MixedPrecisionPolicy(param_dtype=
torch.bfloat16) avoids). The expectation lines count them: per layer the
casts alive after its forward, and those still alive when backward begins
("forward_end_bytes").
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HIDDEN = 256
FFN = 1024
HEADS = 8
LAYERS = 8
SEQ = 32
BATCH = 2
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0

# seed mode: layer key -> the transposed FP8 weight its last backward built.
_TRANSPOSE_CACHE = {}


def quantize(t):
    """Per-tensor current scaling: (FP8 copy, scale_inv as a 0-dim fp32 tensor)."""
    amax = t.detach().abs().amax().float().clamp(min=1e-12)
    scale = FP8_MAX / amax
    q = (t.detach().float() * scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale.reciprocal()


class _Fp8LinearFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, key, seed):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        xq, xs = quantize(x2)
        wq, ws = quantize(weight)
        # mat2 must be column-major: wq is (N, K) row-major, wq.t() (K, N) column-major.
        y = torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)
        del xq, xs
        if bias is not None:
            y = y + bias
        if seed:
            ctx.save_for_backward(x2, wq, ws)  # the FP8 weight copy lives until backward
        else:
            ctx.save_for_backward(x2, weight)  # FSDP2 re-gathers it for backward
            del wq, ws
        ctx.key = key
        ctx.seed = seed
        ctx.has_bias = bias is not None
        ctx.x_shape = shape
        return y.reshape(*shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        if ctx.seed:
            x2, wq, ws = ctx.saved_tensors
        else:
            x2, weight = ctx.saved_tensors
            wq, ws = quantize(weight)
        dy2 = dy.reshape(-1, dy.shape[-1]).contiguous()
        # The column-wise form for the dgrad GEMM: the transposed FP8 weight
        # (K, N) row-major, passed as its (N, K) column-major view.
        wt = wq.t().contiguous()
        del wq
        dyq, dys = quantize(dy2)
        dx = torch._scaled_mm(dyq, wt.t(), scale_a=dys, scale_b=ws, out_dtype=torch.bfloat16)
        del dyq, dys
        if ctx.seed:
            _TRANSPOSE_CACHE[ctx.key] = wt  # retained until this layer's next forward
        del wt
        dw = dy2.t().matmul(x2)
        db = dy2.sum(0) if ctx.has_bias else None
        return dx.reshape(ctx.x_shape), dw, db, None, None


class Float8Tensor(torch.Tensor):
    """FP8 data with its per-tensor scale_inv, as a bf16 tensor to autograd
    and to the code around it. Only what the linear below needs: t(),
    contiguous() (clone), detach and mm, which is torch._scaled_mm on the
    FP8 data (mat2 column-major, as t() of a row-major copy is)."""

    @staticmethod
    def __new__(cls, data, scale_inv):
        return torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), dtype=torch.bfloat16, device=data.device,
            requires_grad=False)

    def __init__(self, data, scale_inv):
        self._data = data
        self._scale = scale_inv

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self):
        # torch.compile's AOT autograd prints its inputs' metadata, where
        # Tensor.__repr__ would index the FP8 data (aten.select).
        return "Float8Tensor(%s, %s)" % (tuple(self.shape), self._data.dtype)

    @classmethod
    def quantize(cls, t):
        return cls(*quantize(t))

    def __tensor_flatten__(self):
        return ["_data", "_scale"], None

    @staticmethod
    def __tensor_unflatten__(inner, meta, outer_size, outer_stride):
        return Float8Tensor(inner["_data"], inner["_scale"])

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func is aten.t.default:
            return Float8Tensor(args[0]._data.t(), args[0]._scale)
        if func is aten.clone.default:
            return Float8Tensor(args[0]._data.clone(**kwargs), args[0]._scale)
        if func is aten.detach.default:
            return Float8Tensor(args[0]._data.detach(), args[0]._scale)
        if func is aten.mm.default:
            a, b = args
            return torch._scaled_mm(a._data, b._data, scale_a=a._scale, scale_b=b._scale,
                                    out_dtype=torch.bfloat16)
        raise NotImplementedError("Float8Tensor: %s" % func)


class _Fp8SubclassLinearFn(torch.autograd.Function):
    """_Fp8LinearFn's lifecycles with Float8Tensor copies."""

    @staticmethod
    def forward(ctx, x, weight, bias, key, seed):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).contiguous()
        wq = Float8Tensor.quantize(weight)
        y = torch.mm(Float8Tensor.quantize(x2), wq.t())
        if bias is not None:
            y = y + bias
        if seed:
            ctx.save_for_backward(x2, wq)  # the FP8 weight copy lives until backward
        else:
            ctx.save_for_backward(x2, weight)  # FSDP2 re-gathers it for backward
            del wq
        ctx.key = key
        ctx.seed = seed
        ctx.has_bias = bias is not None
        ctx.x_shape = shape
        return y.reshape(*shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        if ctx.seed:
            x2, wq = ctx.saved_tensors
        else:
            x2, weight = ctx.saved_tensors
            wq = Float8Tensor.quantize(weight)
        dy2 = dy.reshape(-1, dy.shape[-1]).contiguous()
        wt = wq.t().contiguous()  # the transposed FP8 weight, (K, N) row-major
        del wq
        dx = torch.mm(Float8Tensor.quantize(dy2), wt.t())
        if ctx.seed:
            _TRANSPOSE_CACHE[ctx.key] = wt  # retained until this layer's next forward
        del wt
        dw = dy2.t().matmul(x2)
        db = dy2.sum(0) if ctx.has_bias else None
        return dx.reshape(ctx.x_shape), dw, db, None, None


FP8_IMPLS = {"function": _Fp8LinearFn, "subclass": _Fp8SubclassLinearFn}
_fp8_fn = _Fp8LinearFn  # set by --fp8-impl


class Fp8Linear(nn.Module):
    def __init__(self, in_features, out_features, key, seed):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        self.key = key
        self.seed = seed
        bound = 1.0 / in_features**0.5
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        if self.seed:
            _TRANSPOSE_CACHE.pop(self.key, None)  # the cached transpose dies here
        return _fp8_fn.apply(x, self.weight, self.bias, self.key, self.seed)


def make_linear(in_features, out_features, key, mode):
    if mode == "bf16":
        return nn.Linear(in_features, out_features)
    return Fp8Linear(in_features, out_features, key, mode == "seed")


class Layer(nn.Module):
    def __init__(self, index, mode):
        super().__init__()
        name = "layers.%d" % index
        self.ln1 = nn.LayerNorm(HIDDEN)
        self.qkv = make_linear(HIDDEN, 3 * HIDDEN, name + ".qkv", mode)
        self.proj = make_linear(HIDDEN, HIDDEN, name + ".proj", mode)
        self.ln2 = nn.LayerNorm(HIDDEN)
        self.fc1 = make_linear(HIDDEN, FFN, name + ".fc1", mode)
        self.fc2 = make_linear(FFN, HIDDEN, name + ".fc2", mode)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=-1)
        q, k, v = (t.reshape(b, s, HEADS, h // HEADS).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Model(nn.Module):
    def __init__(self, mode, checkpoint=False):
        super().__init__()
        self.layers = nn.ModuleList(Layer(i, mode) for i in range(LAYERS))
        self.norm = nn.LayerNorm(HIDDEN)
        self.checkpoint = checkpoint

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.checkpoint else layer(x)
        return self.norm(x)


def block_bytes(n):
    """A request of n bytes as PyTorch's caching allocator hands it out."""
    return max(512, (n + 511) // 512 * 512)


def global_numel(t):
    numel = 1
    for d in t.shape:  # the global shape (a DTensor's under FSDP2)
        numel *= int(d)
    return numel


def expected_sizes(model, mode, rank, checkpoint, master_fp32=False):
    """One line per FP8 module and per layer: what the detectors should find."""
    for i, layer in enumerate(model.layers):
        copy_bytes = 0
        autocast_bytes = 0  # bf16 casts of the weights and biases (--master-fp32)
        autocast_end_bytes = 0  # of which alive when backward begins: the weights'
        for name in ("qkv", "proj", "fc1", "fc2"):
            w = getattr(layer, name).weight
            numel = global_numel(w)
            if master_fp32:
                autocast_end_bytes += block_bytes(2 * numel)
                autocast_bytes += block_bytes(2 * numel) + block_bytes(
                    2 * global_numel(getattr(layer, name).bias))
            fp8 = numel if mode != "bf16" else 0
            copy_bytes += fp8
            print(
                "ALLOCSCOPE_EXPECT "
                + json.dumps(
                    {
                        "rank": rank,
                        "mode": mode,
                        "layer": "layers.%d" % i,
                        "module": "layers.%d.%s" % (i, name),
                        "weight_shape": [int(d) for d in w.shape],
                        "fp8_weight_bytes": fp8,
                        "fp8_transpose_bytes": fp8,
                        "scale_inv_bytes": 4 if mode != "bf16" else 0,
                    },
                    sort_keys=True,
                ),
                flush=True,
            )
        retained = mode == "seed"
        forward_retained = retained and not checkpoint
        forward_bytes = copy_bytes if forward_retained else 0
        forward_end_bytes = forward_bytes
        if master_fp32 and not checkpoint:
            forward_bytes, forward_end_bytes = autocast_bytes, autocast_end_bytes
        print(
            "ALLOCSCOPE_EXPECT_LAYER "
            + json.dumps(
                {
                    "rank": rank,
                    "mode": mode,
                    "layer": "layers.%d" % i,
                    "forward_copy_bytes": forward_bytes,
                    "forward_end_bytes": forward_end_bytes,
                    "forward_scale_count": 4 if forward_retained else 0,
                    "transpose_bytes": copy_bytes if retained else 0,
                },
                sort_keys=True,
            ),
            flush=True,
        )


def main():
    global HIDDEN, FFN, SEQ, _fp8_fn
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("seed", "fixed", "bf16"), default="seed")
    parser.add_argument("--fp8-impl", choices=sorted(FP8_IMPLS), default="function",
                        help="the FP8 linear of seed/fixed: plain tensors in an autograd.Function, "
                             "or a __torch_dispatch__ Float8Tensor subclass")
    parser.add_argument("--master-fp32", action="store_true",
                        help="with --mode bf16: fp32 parameters, forward under bf16 autocast")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--time", action="store_true",
                        help="print each step's wall time (ms) and end time for benchmarks")
    parser.add_argument("--hidden", type=int, default=HIDDEN,
                        help="hidden size (FFN is 4x); the proof's sizes are the defaults")
    parser.add_argument("--tokens", type=int, default=BATCH * SEQ,
                        help="tokens per rank (batch 2); benchmarks use more to make the "
                             "step GPU-bound")
    parser.add_argument("--checkpoint", action="store_true",
                        help="activation checkpointing: every layer recomputed in backward")
    parser.add_argument("--grad-accum", type=int, default=1, metavar="N",
                        help="forward/backward micro-batches per optimizer step")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl",
                        help="process group backend; gloo lets ranks share a GPU")
    parser.add_argument("--record-history", choices=("python", "all"),
                        help="torch.cuda.memory._record_memory_history(stacks=...) for the run, "
                             "the PyTorch-native recording allocscope is compared with")
    parser.add_argument("--memory-limit-mib", type=float, metavar="MIB",
                        help="cap this process's CUDA memory "
                             "(torch.cuda.set_per_process_memory_fraction), to run out of memory")
    parser.add_argument("--compile", choices=("none", "inplace", "wrap"), default="none",
                        help="torch.compile each layer before sharding it: in place "
                             "(layer.compile(), as torchtitan does) or wrapped "
                             "(torch.compile(layer), an OptimizedModule in its place)")
    args = parser.parse_args()
    if args.grad_accum < 1:
        parser.error("--grad-accum must be 1 or more")
    if args.hidden % HEADS or args.tokens % BATCH:
        parser.error("--hidden must be a multiple of %d and --tokens of %d" % (HEADS, BATCH))
    if args.master_fp32 and args.mode != "bf16":
        parser.error("--master-fp32 goes with --mode bf16")
    HIDDEN, FFN, SEQ = args.hidden, 4 * args.hidden, args.tokens // BATCH
    _fp8_fn = FP8_IMPLS[args.fp8_impl]

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    if args.memory_limit_mib:
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        torch.cuda.set_per_process_memory_fraction(args.memory_limit_mib * 2**20 / total)
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    world = dist.get_world_size()
    mesh = init_device_mesh("cuda", (world,))

    torch.manual_seed(args.seed)  # the same full model on every rank
    param_dtype = torch.float32 if args.master_fp32 else torch.bfloat16
    model = Model(args.mode, args.checkpoint).to(device="cuda", dtype=param_dtype)
    if args.compile == "inplace":
        for layer in model.layers:
            layer.compile()
    elif args.compile == "wrap":
        for i, layer in enumerate(model.layers):
            model.layers[i] = torch.compile(layer)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    expected_sizes(model, args.mode, rank, args.checkpoint, args.master_fp32)

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator(device="cuda").manual_seed(args.seed * 1000 + rank)
    x = torch.randn(BATCH, SEQ, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=gen)
    target = torch.randn(BATCH, SEQ, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=gen)
    if args.record_history:
        torch.cuda.memory._record_memory_history(stacks=args.record_history)
    if os.environ.get("FSDP2_FP8_NOOP_MODULE_HOOKS") == "1":
        # For tests/bench/torch_overhead.py --breakdown only: global module
        # hooks that do nothing, registered as allocscope.torch registers its
        # own, so that what PyTorch's hooked module call costs is measured
        # apart from what the hooks do.
        from torch.nn.modules import module as nn_module

        nn_module.register_module_forward_pre_hook(lambda module, args: None)
        nn_module.register_module_forward_hook(lambda module, args, output: None, always_call=True)
    import time

    for step in range(args.steps):
        start = time.perf_counter()
        for micro in range(args.grad_accum):
            if args.grad_accum > 1:  # reduce-scatter the gradients on the last only
                model.set_requires_gradient_sync(micro == args.grad_accum - 1)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.master_fp32):
                out = model(x)
            loss = F.mse_loss(out.to(torch.bfloat16), target) / args.grad_accum
            del out
            if micro == 0:
                # What forward leaves for backward, by torch's own counter:
                # the truth a compiled run's findings are held against.
                forward_allocated = torch.cuda.memory_allocated()
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        elapsed_ms = (time.perf_counter() - start) * 1e3
        print(
            "rank %d step %d loss %.6f allocated %d forward_allocated %d"
            % (rank, step, loss.item(), torch.cuda.memory_allocated(), forward_allocated),
            flush=True,
        )
        if args.time:
            # The step's duration and its end on the wall clock (shared by
            # processes running side by side: tests/bench/torch_overhead.py
            # --concurrent pairs their steps in time).
            print("STEP_MS rank %d step %d %.3f %.6f" % (rank, step, elapsed_ms, time.time()),
                  flush=True)
    print("rank %d peak reserved %d" % (rank, torch.cuda.max_memory_reserved()), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
