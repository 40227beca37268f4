"""Graph breaks inside a compiled HF-style forward: a tiny BERT from a config whose wrapper
trims padding with `.item()` (a host read: a graph break and a sync per step), reads token
counts with `.tolist()` and branches on a tensor (data-dependent control flow).

DEVICE (default cuda): DEVICE=cpu python compiled_break.py runs it without a GPU."""
import os
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import BertConfig, BertModel, set_seed

dev = os.environ.get("DEVICE", "cuda")
set_seed(0)
cfg = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=128, max_position_embeddings=32,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bert = BertModel(cfg)
        self.head = torch.nn.Linear(64, 2)
    def forward(self, input_ids, attention_mask, labels):
        longest = int(attention_mask.sum(1).max().item())   # graph break: a sync
        input_ids, attention_mask = input_ids[:, :longest], attention_mask[:, :longest]
        h = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.head(h[:, 0])
        counts = attention_mask.sum(1).tolist()              # graph break: a sync
        if logits.abs().max() > 10:                          # data-dependent branch: a sync
            logits = logits / 10
        return torch.nn.functional.cross_entropy(logits, labels), counts

model = Classifier().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
cmodel = torch.compile(model)
g = torch.Generator().manual_seed(1)
losses = []
for step in range(3):
    ids = torch.randint(1, 100, (4, 16), generator=g)
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[:, 12:] = 0                                         # same length each step
    labels = (ids[:, 0] > 50).long()
    loss, counts = cmodel(ids.to(dev), mask.to(dev), labels.to(dev))
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(round(loss.item(), 6))
print("RESULT compiled_break losses=%s counts=%s" % (losses, counts))
