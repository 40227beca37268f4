"""accelerate Accelerator() with DataLoader(pin_memory=True) and accelerator.clip_grad_norm_."""
import torch
from accelerate import Accelerator
from accelerate.utils import set_seed

set_seed(0)
acc = Accelerator()
g = torch.Generator().manual_seed(1)
X = torch.randn(96, 16, generator=g)
Y = (X[:, 0] > 0).long()
dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=16,
                                 shuffle=False, pin_memory=True)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, opt, dl = acc.prepare(model, opt, dl)
losses = []
for step, (x, y) in enumerate(dl):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    acc.backward(loss)
    gn = acc.clip_grad_norm_(model.parameters(), 1.0)
    opt.step(); opt.zero_grad()
    losses.append(loss.detach())
losses = torch.stack(losses).cpu().tolist()
print("RESULT accel losses=%s last_grad_norm=%.6f" % ([round(l, 6) for l in losses], float(gn)))
