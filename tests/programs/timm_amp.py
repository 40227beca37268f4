"""timm resnet10t with torch.autocast("cuda", float16) and torch.amp.GradScaler("cuda")."""
import torch
import timm

torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
model = timm.create_model("resnet10t", pretrained=False, num_classes=4).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.amp.GradScaler("cuda")
g = torch.Generator().manual_seed(1)
x_all = torch.randn(3, 4, 3, 64, 64, generator=g)
y_all = torch.randint(0, 4, (3, 4), generator=g)
losses = []
for step in range(3):
    x, y = x_all[step].to(dev), y_all[step].to(dev)
    with torch.autocast("cuda", dtype=torch.float16):
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
    if step == 0:
        print("DTYPES", out.dtype, loss.dtype)
    scaler.scale(loss).backward()
    scaler.step(opt)  # GradScaler reads found_inf here
    scaler.update()
    opt.zero_grad()
    losses.append(loss.detach())
print("RESULT timm_amp losses=%s"
      % [round(v, 5) for v in torch.stack(losses).float().cpu().tolist()])
