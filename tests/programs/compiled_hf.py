"""torch.compile(model) on a tiny HF GPT-2 built from a config, AdamW, loss.item() logging.

DEVICE (default cuda) picks the device: DEVICE=cpu python compiled_hf.py runs it without a GPU."""
import os
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import GPT2Config, GPT2LMHeadModel, set_seed

dev = os.environ.get("DEVICE", "cuda")
set_seed(0)
cfg = GPT2Config(vocab_size=128, n_positions=32, n_embd=64, n_layer=2, n_head=2,
                 bos_token_id=0, eos_token_id=0, attn_pdrop=0.0, embd_pdrop=0.0,
                 resid_pdrop=0.0)
model = GPT2LMHeadModel(cfg).to(dev)
model.train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
cmodel = torch.compile(model)

g = torch.Generator().manual_seed(1)
data = torch.randint(0, 128, (4, 8, 16), generator=g)
losses = []
for step in range(4):
    ids = data[step].to(dev)
    out = cmodel(input_ids=ids, labels=ids)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(round(out.loss.item(), 6))  # a sync each step
    print(f"step {step} loss {losses[-1]}")
print("RESULT compiled_hf losses=%s" % losses)
