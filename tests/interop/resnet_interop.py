#!/usr/bin/env python3
"""PyTorch <-> flux-cpp on real convolutional networks (ctest entries; see tests/resnet_interop.cmake).

  resnet_interop.py torch-to-flux HELPER WORKDIR
      torchvision.models.resnet18() with seeded random weights and random BatchNorm running
      statistics, eval mode: writes its state_dict unchanged (num_batches_tracked included), a fixed
      batch x (2, 3, 64, 64) and its logits (float32, and float64 as the reference) as safetensors;
      then `HELPER resnet WORKDIR` loads the state into flux::models::ResNet18 on every test device
      and checks its logits (max abs diff <= 1e-4).
  resnet_interop.py flux-to-torch HELPER WORKDIR
      `HELPER cnn WORKDIR` trains a small flux-cpp CNN (Conv, BatchNorm, relu, MaxPool, Conv,
      BatchNorm, relu, AdaptiveMeanPool, flatten, Dropout, Dense) for a few Adam steps and saves it
      with save(); this script loads it into the matching torch.nn.Sequential with
      load_state_dict(strict=True) and checks PyTorch's eval-mode outputs against flux's (<= 1e-5).

Safetensors are written and read by tests/interop/torch_interop.py's helpers (Debian has no
`safetensors` package). Exits 77 (skipped) when torch or torchvision is missing, unless CI or
FLUX_REQUIRE_INTEROP is set.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_interop import load_safetensors, save_safetensors  # noqa: E402 (exits 77 without torch)

import torch  # noqa: E402
from torch import nn  # noqa: E402

try:
    import torchvision
except ImportError as e:
    required = os.environ.get("FLUX_REQUIRE_INTEROP") or os.environ.get("CI")
    print(f"{'FAIL' if required else 'SKIPPED'}: torchvision is not importable by {sys.executable} ({e}); "
          "install python3-torchvision (scripts/deps.sh does)")
    sys.exit(1 if required else 77)


def run_helper(helper, mode, work):
    run = subprocess.run([helper, mode, work], capture_output=True, text=True)
    print(run.stdout, end="")
    if run.returncode != 0:
        print(run.stderr, end="")
        print(f"FAIL: {helper} {mode} exited with {run.returncode}")
    return run.returncode


def random_resnet18():
    """torchvision's ResNet-18, seeded random weights, every BatchNorm with random affine parameters
    and running statistics (so that eval mode really uses them), eval mode."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.weight.copy_(0.5 + torch.rand(c, generator=g))
                m.bias.copy_(0.2 * torch.randn(c, generator=g))
                m.running_mean.copy_(0.2 * torch.randn(c, generator=g))
                m.running_var.copy_(0.5 + torch.rand(c, generator=g))
                m.num_batches_tracked.fill_(int(torch.randint(1, 1000, (1,), generator=g)))
    return model.eval()


def torch_to_flux(helper, work):
    model = random_resnet18()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(x)
        logits64 = model.double()(x.double())
    state = model.float().state_dict()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"torchvision resnet18: {len(state)} state tensors, {n_params} parameters, "
          f"logits {tuple(logits.shape)} in [{logits.min():.3f}, {logits.max():.3f}], "
          f"|torch f32 - torch f64| = {(logits.double() - logits64).abs().max():.3g}")
    save_safetensors(f"{work}/resnet18.safetensors", state, {"format": "pt"})
    save_safetensors(f"{work}/resnet18_io.safetensors", {"x": x, "logits": logits, "logits64": logits64})
    return run_helper(helper, "resnet", work)


def small_cnn():
    """The torch twin of the flux CNN in resnet_interop.cpp (indices match Chain's)."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(2),
        nn.Flatten(), nn.Dropout(0.5), nn.Linear(64, 5))


def flux_to_torch(helper, work):
    rc = run_helper(helper, "cnn", work)
    if rc != 0:
        return rc
    state, meta = load_safetensors(f"{work}/flux_cnn.safetensors")
    assert meta.get("written_by") == "flux-cpp", meta
    theirs = small_cnn()
    missing = sorted(set(theirs.state_dict()) ^ set(state))
    assert not missing, f"names differ between flux's file and nn.Sequential: {missing}"
    theirs.load_state_dict(state, strict=True)
    theirs.eval()
    trained = int(state["1.num_batches_tracked"])
    assert trained > 0, "flux's BatchNorm did not count its training steps"
    assert not torch.equal(state["1.running_mean"], torch.zeros(8)), "flux's running mean never moved"
    io, _ = load_safetensors(f"{work}/flux_cnn_io.safetensors")
    with torch.no_grad():
        err = (theirs(io["x"]) - io["y"]).abs().max().item()
    print(f"flux -> torch: small CNN trained {trained} steps in flux-cpp, loaded with strict=True; "
          f"max |torch - flux| = {err:.3g} on {tuple(io['x'].shape)}")
    if not err <= 1e-5:
        print("FAIL: PyTorch's outputs for flux's CNN differ by more than 1e-5")
        return 1
    print(f"interop OK (torch {torch.__version__}, torchvision {torchvision.__version__})")
    return 0


def main():
    if len(sys.argv) != 4 or sys.argv[1] not in ("torch-to-flux", "flux-to-torch"):
        print(__doc__)
        return 2
    mode, helper, work = sys.argv[1:]
    os.makedirs(work, exist_ok=True)
    return torch_to_flux(helper, work) if mode == "torch-to-flux" else flux_to_torch(helper, work)


if __name__ == "__main__":
    sys.exit(main())
