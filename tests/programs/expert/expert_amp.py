"""A small mixed-precision training loop: torch.autocast and torch.amp.GradScaler with an AdamW
that is not fused, so GradScaler.step reads found_inf back every step
(tests/test_expert_rules.py). Without a GPU, autocast and the scaler turn themselves off."""
import warnings

import torch

warnings.filterwarnings("ignore", message=".*(CUDA is not available|torch_xla)")
torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
model.to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
scaler = torch.amp.GradScaler("cuda")
g = torch.Generator().manual_seed(1)
xs = torch.randn(5, 8, 16, generator=g).to(dev)
ys = torch.randint(0, 4, (5, 8), generator=g).to(dev)
losses = []
for step in range(5):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = torch.nn.functional.cross_entropy(model(xs[step]), ys[step])
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    losses.append(loss.detach())
print("RESULT expert_amp losses=%s scale=%s"
      % ([round(v, 4) for v in torch.stack(losses).float().cpu().tolist()], scaler.get_scale()))
