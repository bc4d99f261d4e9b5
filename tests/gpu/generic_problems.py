"""Memory problems that are not FP8's, and a healthy habit that looks like
one, in a small FSDP2 training loop: a labelled workload for the accuracy
corpus (tests/corpus/, tools/accuracy).

    torchrun --standalone --nproc_per_node 2 tests/gpu/generic_problems.py --problem keep-outputs

4 MLP blocks (hidden 256, FFN 1024, LayerNorm, GELU, bf16 parameters), each
block and the root sharded with fully_shard, MSE loss, AdamW. --problem:

  none              a clean loop
  keep-last-output  the script keeps the step's output in a variable until
                    the next step overwrites it: normal Python behaviour,
                    one output alive between steps, never growing
  keep-outputs      the script appends every step's output to a list (for
                    metrics, say): T x H bf16 bytes more every step
  module-cache      layers.2 appends a detached copy of its input to a list
                    attribute in every forward: T x H bf16 bytes more every
                    step, made in layers.2's forward
  optimizer-hook    an optimizer step post-hook appends a 1 MiB buffer every
                    step (a "history" kept on the GPU)

It does not import allocscope: run it unchanged under `allocscope run`.
What the workload retains, computed from its own shapes, is printed on
stdout, one JSON object a line after "ALLOCSCOPE_LABEL " (rank, problem,
the plugins that name such a problem, its layer ("" when the problem has no
layer), bytes added per step); nothing is printed for --problem none and
keep-last-output, where nothing grows.
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
BATCH = 2
OPTIMIZER_HOOK_BYTES = 1 << 20
# A problem that grows across steps is a cross-step leak; one that a
# (layer, phase) makes and keeps past the next step's same phase is a phase
# retention too. Either plugin naming it is right.
LEAK_PLUGINS = ["cross-step-leak", "phase-retention"]


class Block(nn.Module):
    def __init__(self, cache):
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.fc1 = nn.Linear(HIDDEN, FFN)
        self.fc2 = nn.Linear(FFN, HIDDEN)
        self.cache = [] if cache else None

    def forward(self, x):
        if self.cache is not None:
            self.cache.append(x.detach().clone())
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self, cached_layer):
        super().__init__()
        self.layers = nn.ModuleList(Block(i == cached_layer) for i in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def label(rank, problem, layer, bytes_per_step):
    print(
        "ALLOCSCOPE_LABEL "
        + json.dumps(
            {
                "rank": rank,
                "problem": problem,
                "plugins": LEAK_PLUGINS,
                "layer": layer,
                "bytes_per_step": bytes_per_step,
            },
            sort_keys=True,
        ),
        flush=True,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--problem",
        choices=("none", "keep-last-output", "keep-outputs", "module-cache", "optimizer-hook"),
        default="none",
    )
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=128, help="tokens per rank (batch 2)")
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    args = parser.parse_args()
    if args.tokens % BATCH:
        parser.error("--tokens must be a multiple of %d" % BATCH)
    seq = args.tokens // BATCH

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))

    torch.manual_seed(0)
    model = Model(2 if args.problem == "module-cache" else -1)
    model = model.to(device="cuda", dtype=torch.bfloat16)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    activation_bytes = args.tokens * HIDDEN * 2  # one [T, H] bf16 tensor
    history = []
    if args.problem == "optimizer-hook":

        def keep_history(opt, *_):
            history.append(torch.zeros(OPTIMIZER_HOOK_BYTES // 4, device="cuda"))

        optimizer.register_step_post_hook(keep_history)
        label(rank, "optimizer-hook", "", OPTIMIZER_HOOK_BYTES)
    elif args.problem == "keep-outputs":
        label(rank, "keep-outputs", "", activation_bytes)
    elif args.problem == "module-cache":
        label(rank, "module-cache", "layers.2", activation_bytes)

    gen = torch.Generator(device="cuda").manual_seed(rank)
    x = torch.randn(BATCH, seq, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=gen)
    target = torch.randn(BATCH, seq, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=gen)
    outputs = []
    out = None
    for step in range(args.steps):
        out = model(x)
        loss = F.mse_loss(out, target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if args.problem == "keep-outputs":
            outputs.append(out.detach())
        if args.problem != "keep-last-output":
            out = None
        print("rank %d step %d loss %.6f" % (rank, step, loss.item()), flush=True)
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
