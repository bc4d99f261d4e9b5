"""A small, deterministic PyTorch training run for checking allocscope on a GPU.

Run it plain and under `allocscope run` with each allocator setting; stdout
must be byte-identical. It makes a few hundred tensors of assorted sizes.
"""
import torch


def main() -> None:
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    dev = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)
    ).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(64, 256, device=dev)
    target = torch.randn(64, 256, device=dev)
    for step in range(5):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.6f}")
    keep = [torch.empty(1 << (10 + i % 12), dtype=torch.uint8, device=dev) for i in range(200)]
    total = sum(t.numel() for t in keep)
    del keep
    torch.cuda.synchronize()
    print(f"made 200 tensors, {total} bytes")


if __name__ == "__main__":
    main()
