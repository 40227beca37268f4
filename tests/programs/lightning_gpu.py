"""Lightning Trainer(accelerator="gpu") with self.log(prog_bar=True) and gradient clipping."""
import os, warnings
warnings.filterwarnings("ignore", ".*does not have many workers.*")
import torch
import lightning as L

L.seed_everything(0, workers=True, verbose=False)

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                       torch.nn.Linear(32, 2))
        self.losses = []
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        self.losses.append(loss.detach())
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

g = torch.Generator().manual_seed(1)
X = torch.randn(128, 16, generator=g)
Y = (X[:, 0] > 0).long()
dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=16,
                                 shuffle=False)
model = Net()
trainer = L.Trainer(accelerator=os.environ.get("ACCEL", "gpu"), devices=1, max_epochs=1,
                    gradient_clip_val=1.0, logger=False, enable_checkpointing=False,
                    enable_model_summary=False, enable_progress_bar=True)
trainer.fit(model, dl)
losses = torch.stack(model.losses).cpu().tolist()
print("RESULT lightning_gpu losses=%s final=%.6f"
      % ([round(v, 6) for v in losses], float(trainer.callback_metrics["loss"])))
