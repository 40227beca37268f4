"""Lightning Trainer(accelerator="gpu") training a LightningModule whose net is torch.compile'd.

ACCEL (default gpu) picks the accelerator: ACCEL=cpu python compiled_lightning.py runs it
without a GPU."""
import os, warnings
warnings.filterwarnings("ignore", ".*does not have many workers.*")
import torch
import lightning as L

L.seed_everything(0, workers=True, verbose=False)

class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                       torch.nn.LayerNorm(32), torch.nn.Linear(32, 2))
        self.cnet = torch.compile(self.net)
        self.losses = []
    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.cnet(x), y)
        self.log("loss", loss, prog_bar=True)
        self.losses.append(loss.detach())
        return loss
    def configure_optimizers(self):
        return torch.optim.AdamW(self.net.parameters(), lr=0.01)

g = torch.Generator().manual_seed(1)
X = torch.randn(48, 16, generator=g)
Y = (X[:, 0] > 0).long()
dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=16,
                                 shuffle=False)
model = Net()
trainer = L.Trainer(accelerator=os.environ.get("ACCEL", "gpu"), devices=1, max_epochs=1,
                    gradient_clip_val=1.0, logger=False, enable_checkpointing=False,
                    enable_model_summary=False, enable_progress_bar=False)
trainer.fit(model, dl)
losses = torch.stack(model.losses).cpu().tolist()
print("RESULT compiled_lightning losses=%s final=%.6f"
      % ([round(v, 6) for v in losses], float(trainer.callback_metrics["loss"])))
