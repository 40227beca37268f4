"""Model code not written for this project runs unchanged on the simulated GPU, with the same
results as a CPU run (Hugging Face transformers, built small and randomly initialised)."""

from __future__ import annotations

import pytest
import torch

import memcpy_doctor

transformers = pytest.importorskip("transformers")


def gpt2_generate(device: str) -> list[list[int]]:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2,
                                  n_head=2, bos_token_id=0, eos_token_id=99)
    model = transformers.GPT2LMHeadModel(cfg).to(device).eval()
    ids = torch.tensor([[1, 2, 3, 4]], device=device)
    out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert out.device.type == device
    return out.tolist()


def bert_train_step(device: str) -> tuple[float, torch.Tensor]:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64, num_labels=3)
    model = transformers.BertForSequenceClassification(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 50, (2, 7)).to(device)
    mask = torch.ones(2, 7, dtype=torch.long).to(device)
    labels = torch.tensor([0, 2]).to(device)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    opt.step()
    return out.loss.item(), model.classifier.weight.detach().cpu()


def test_gpt2_generate_runs_unchanged():
    expected = gpt2_generate("cpu")
    with memcpy_doctor.profiler(device="sim") as prof:
        got = gpt2_generate("cuda")
    assert got == expected
    trace = prof.trace
    assert any(c.direction == "HtoD" for c in trace.copies)  # the model's weights went over
    # generate() asks the device every step whether all sequences are done
    assert any(c.direction == "DtoH" and c.sync and "generation" in c.site.file
               for c in trace.copies)


def test_bert_train_step_matches_cpu():
    expected_loss, expected_weight = bert_train_step("cpu")
    with memcpy_doctor.profiler(device="sim") as prof:
        loss, weight = bert_train_step("cuda")
    assert loss == expected_loss
    assert torch.equal(weight, expected_weight)
    devices = {o.device for o in prof.trace.ops if o.op == "aten::addmm"}
    assert devices == {"cuda:0"}
