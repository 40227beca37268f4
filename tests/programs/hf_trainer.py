"""HF transformers Trainer on a tiny BERT, synthetic data, 2 epochs, clipping on (default)."""
import os, tempfile
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import (BertConfig, BertForSequenceClassification, Trainer,
                          TrainingArguments, set_seed)

set_seed(0)
cfg = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=32, num_labels=2)
model = BertForSequenceClassification(cfg)

g = torch.Generator().manual_seed(1)
N, L = 64, 16
ids = torch.randint(1, 100, (N, L), generator=g)
labels = (ids[:, 0] > 50).long()

class DS(torch.utils.data.Dataset):
    def __len__(self): return N
    def __getitem__(self, i):
        return {"input_ids": ids[i], "attention_mask": torch.ones(L, dtype=torch.long),
                "labels": labels[i]}

out = tempfile.mkdtemp()
args = TrainingArguments(output_dir=out, num_train_epochs=2, per_device_train_batch_size=8,
                         learning_rate=1e-3, logging_steps=4, save_strategy="no", report_to=[],
                         use_cpu=False, seed=0, dataloader_num_workers=0, disable_tqdm=True)
trainer = Trainer(model=model, args=args, train_dataset=DS())
res = trainer.train()
losses = [round(h["loss"], 6) for h in trainer.state.log_history if "loss" in h]
print("RESULT hf_trainer train_loss=%.6f logged=%s" % (res.training_loss, losses))
