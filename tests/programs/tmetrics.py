"""torchmetrics Accuracy / F1 on cuda tensors, update per batch, compute at end."""
import torch
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

torch.manual_seed(0)
dev = "cuda" if torch.cuda.is_available() else "cpu"
acc = MulticlassAccuracy(num_classes=4, average="micro").to(dev)
f1 = MulticlassF1Score(num_classes=4, average="macro").to(dev)
for step in range(8):
    logits = torch.randn(32, 4, device=dev)
    target = torch.randint(0, 4, (32,), device=dev)
    acc.update(logits, target)
    f1.update(logits, target)
a, f = acc.compute(), f1.compute()
print("RESULT tmetrics acc=%.6f f1=%.6f" % (a.item(), f.item()))
