"""A training loop whose device work outlasts the host's, which prepares each batch on the host
(pinned, copied without waiting) and reads the loss back every step only to sum it, or, with
the argument `list`, to list it (tests/test_expert_rules.py)."""
import sys

import torch

dev = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(),
                            torch.nn.Linear(2048, 4)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(1)
pin = torch.cuda.is_available()


def batch():
    x = torch.randn(512, 512, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    if pin:
        x, y = x.pin_memory(), y.pin_memory()
    return x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)


def train(steps: int, listed: bool):
    total, losses = 0.0, []
    for step in range(steps):
        x, y = batch()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if listed:
            losses.append(loss.item())
        else:
            total += loss.item()
    return total, losses


total, losses = train(6, sys.argv[1:] == ["list"])
print("RESULT expert_sum total=%r losses=%r" % (total, losses))
