"""A plain PyTorch training loop with three habits that copy more than they need to: a
model built on the host and moved, a constant uploaded every step, and the loss read back to
the host every step to be summed (tests/test_expert_rules.py)."""
import torch


class Net(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(),
                                        torch.nn.Linear(width, 3))

    def forward(self, x):
        return self.body(x)


def train(steps: int) -> tuple[float, list[float]]:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = Net(16).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(steps, 4, 8, generator=g)
    ys = torch.randint(0, 3, (steps, 4), generator=g)
    total = 0.0
    for step in range(steps):
        x, y = xs[step].to(dev), ys[step].to(dev)
        w = torch.tensor([0.2, 0.3, 0.5]).to(dev)
        loss = torch.nn.functional.cross_entropy(model(x), y, weight=w)
        loss.backward()
        opt.step()
        opt.zero_grad()
        total += loss.item()
    return total, [round(float(v), 6) for v in model.body[2].bias.detach().cpu()]


total, bias = train(6)
print("RESULT expert_loop total=%r bias=%s" % (total, bias))
