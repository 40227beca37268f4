"""A small training loop with the classic ``loss.item()``-every-step anti-pattern.

An MLP (64 -> 128 -> 10) is trained with SGD on random data (batch 32).

Copies between host and device that this program makes, every step:

1. The batch (``x`` and ``y``) is created on the HOST and moved with a plain
   ``.to(device)``: two host->device copies from pageable memory, which are
   synchronous with respect to the host.
2. ``total += loss.item()`` reads the loss back to the host: a synchronous
   device->host copy that makes the host wait for the whole step to finish on
   the device, so the host can never run ahead and queue the next step.

See ``clean_pinned.py`` for the same loop without these stalls.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_model():
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="device to run on (default: cuda if available, else cpu)")
    args = parser.parse_args(argv)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)

    model = make_model().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    total = 0.0
    for _ in range(args.steps):
        x_host = torch.randn(32, 64)
        y_host = torch.randint(0, 10, (32,))
        x = x_host.to(device)
        y = y_host.to(device)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.item()
    print(f"mean loss: {total / args.steps:.6f}")


if __name__ == "__main__":
    main()
