"""Embedding -> L2 normalize -> MSE loss -> SGD step (docs/paddle-report.md, example 1).

The model is an ``nn.Embedding(vocab, 150)`` looked up with a single int64 id
(128), L2-normalized along the last dimension, compared with a [1, 150] label
filled with 0.5 by mean squared error, and trained with SGD(lr=0.001).

Copies between host and device that this program makes:

1. ``model = Net(vocab).to(device)``: the embedding weight is created on the
   host and copied to the device once (host->device). At the full size of the
   original example, ``--vocab 10000000``, that is 10_000_000 * 150 float32
   values = 5.59 GiB in one copy; the default ``--vocab 10000`` keeps it small.
   Creating the module directly on the device (``device=...``) would avoid it.
2. ``ids`` and ``label`` are created directly on the device, so no copy.
3. The training steps themselves make no copies: the loss is not read inside
   the loop.
4. After the loop the final loss is read once with ``loss.item()``: one
   synchronous device->host copy.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self, vocab, dim=150):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)

    def forward(self, ids):
        return F.normalize(self.emb(ids), p=2, dim=-1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=10_000,
                        help="embedding rows (default 10000; the original is 10000000 = 5.59 GiB)")
    parser.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="device to run on (default: cuda if available, else cpu)")
    args = parser.parse_args(argv)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)

    model = Net(args.vocab).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    ids = torch.full([1], 128, dtype=torch.int64, device=device)
    label = torch.full([1, 150], 0.5, device=device)

    loss = None
    for _ in range(args.steps):
        out = model(ids)
        loss = F.mse_loss(out, label).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"final loss: {loss.item():.6f}")


if __name__ == "__main__":
    main()
