"""torch.compile(mode="reduce-overhead") (CUDA graphs) on a small MLP: training steps with an
optimizer, an inference loop under no_grad, and a read of the output each step.

DEVICE (default cuda): DEVICE=cpu python compiled_cudagraphs.py runs it without a GPU (there
Inductor does not use CUDA graphs)."""
import os
import torch

dev = os.environ.get("DEVICE", "cuda")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 4)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
step_fn = torch.compile(model, mode="reduce-overhead")

g = torch.Generator().manual_seed(1)
X = torch.randn(6, 16, 32, generator=g)
Y = torch.randint(0, 4, (6, 16), generator=g)
losses = []
for i in range(4):
    x, y = X[i].to(dev, non_blocking=True), Y[i].to(dev, non_blocking=True)
    if dev == "cuda":
        torch.compiler.cudagraph_mark_step_begin()
    loss = torch.nn.functional.cross_entropy(step_fn(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(round(loss.item(), 6))
model.eval()
preds = []
with torch.no_grad():
    for i in range(4, 6):
        if dev == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        out = step_fn(X[i].to(dev))
        preds.append(out.argmax(1).cpu())
acc = (torch.cat(preds) == Y[4:6].reshape(-1)).float().mean().item()
print("RESULT compiled_cudagraphs losses=%s acc=%.4f" % (losses, acc))
