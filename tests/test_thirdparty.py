"""Model code not written for this project runs unchanged on the simulated GPU, with the same
results as a CPU run (Hugging Face transformers, built small and randomly initialised), and
real training libraries' programs (tests/programs/) give the same result line under the
tracer as without it, with their known host waits found and no copy a GPU does not make.

Each library's tests skip where it is not installed (`pip install -e '.[test]'` installs
transformers, accelerate, lightning and torchmetrics). timm and torchvision are not in the
extra: PyPI's torchvision wheels are CUDA builds that do not import next to the CPU torch
2.13.0 ("operator torchvision::nms does not exist"; its _C.so needs libc10_cuda.so), timm
imports torchvision, and a torchvision that fails to import also breaks the imports of
transformers' models, lightning and torchmetrics. `pip install torch==2.14.1
torchvision==0.29.1 timm` (a CUDA build of torch, about 5.5 GB, that runs on the CPU) is a
pair where they run."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest
import torch

import memcpy_doctor
from helpers import concurrently
from memcpy_doctor import load_trace
from memcpy_doctor.analysis.compare import sync_sites as line_sites

try:
    import transformers
except Exception:  # not installed, or broken by a torchvision that does not import
    transformers = None

PROGRAMS = pathlib.Path(__file__).resolve().parent / "programs"


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except Exception:  # not installed, or a broken install (torchvision beside a CPU torch)
        return False
    return True


def _needs(*names: str):
    missing = [n for n in names if not _importable(n)]
    return pytest.mark.skipif(bool(missing), reason=f"needs {', '.join(missing)}")


def _result_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith("RESULT")]
    assert len(lines) == 1, text[-2000:]
    return lines[0]


def run_plain(name: str, env: dict | None = None) -> str:
    """The program's RESULT line, run as `python PROGRAM` (here, on the host)."""
    done = subprocess.run([sys.executable, str(PROGRAMS / name)], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return _result_line(done.stdout)


def run_traced(name: str, tmp_path: pathlib.Path):
    """The program's output and trace, run as `memcpy-doctor profile PROGRAM` (the simulated
    GPU, here)."""
    trace_path = tmp_path / "trace.json"
    done = subprocess.run([sys.executable, "-m", "memcpy_doctor", "profile", "-o",
                           str(trace_path), str(PROGRAMS / name)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, load_trace(str(trace_path))


def run_unchanged(name: str, tmp_path: pathlib.Path, plain_env: dict | None = None):
    """The program's trace under the tracer, once its result line is checked to be the one a
    plain run prints, and its copies to hold none of the old phantoms. The two runs go side
    by side."""
    want, (got, trace) = concurrently(lambda: run_plain(name, plain_env),
                                      lambda: run_traced(name, tmp_path))
    assert _result_line(got) == want
    assert_no_phantoms(trace)
    return trace


def sync_sites(trace) -> set[tuple[str, str, str]]:
    """(direction, trigger, "dir/file.py") of every sync copy, the file's last two parts."""
    return {(c.direction, c.trigger, "/".join(pathlib.Path(c.site.file).parts[-2:]))
            for c in trace.copies if c.sync}


def assert_no_phantoms(trace) -> None:
    """None of the copies the simulated GPU used to make up (issue 18): clip_grad's grouping
    by device, one_hot's host-only range check, `t[mask] = 0.0`."""
    for c in trace.copies:
        where = f"{c.direction} {c.trigger} {c.site.file}:{c.site.line}"
        assert "clip_grad" not in c.site.file, where
        assert not (c.direction == "DtoH" and c.trigger == "to"
                    and any(k in c.site.file for k in ("accelerator.py", "precision.py"))), where
        assert "torchmetrics/utilities/compute.py" not in c.site.file, where


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


@_needs("transformers")
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


@_needs("transformers")
def test_bert_train_step_matches_cpu():
    expected_loss, expected_weight = bert_train_step("cpu")
    with memcpy_doctor.profiler(device="sim") as prof:
        loss, weight = bert_train_step("cuda")
    assert loss == expected_loss
    assert torch.equal(weight, expected_weight)
    devices = {o.device for o in prof.trace.ops if o.op == "aten::addmm"}
    assert devices == {"cuda:0"}


@pytest.mark.thirdparty
@_needs("transformers", "accelerate")
def test_hf_trainer_with_clipping(tmp_path):
    trace = run_unchanged("hf_trainer.py", tmp_path)
    sites = sync_sites(trace)
    assert ("DtoH", "item", "transformers/trainer.py") in sites  # the logged loss
    assert any(o.op == "aten::addmm" and o.device == "cuda:0" for o in trace.ops)


@pytest.mark.thirdparty
@_needs("lightning")
def test_lightning_trainer_on_gpu(tmp_path):
    # without a GPU, Lightning refuses accelerator="gpu": the plain run is on "cpu"
    trace = run_unchanged("lightning_gpu.py", tmp_path, {"ACCEL": "cpu"})
    # the logged loss, read back for the progress bar
    assert ("DtoH", "item", "utilities/apply_func.py") in sync_sites(trace)


@pytest.mark.thirdparty
@_needs("accelerate")
def test_accelerate_with_pinned_loader_and_clipping(tmp_path):
    trace = run_unchanged("accel.py", tmp_path)
    batches = [c for c in trace.copies if c.direction == "HtoD" and c.pinned]
    assert batches and sum(c.calls for c in batches) == 12  # 6 batches of (x, y), pinned
    assert ("DtoH", "float", "programs/accel.py") in sync_sites(trace)


@pytest.mark.thirdparty
@_needs("torchmetrics")
def test_torchmetrics_on_the_device(tmp_path):
    trace = run_unchanged("tmetrics.py", tmp_path)
    counts = [c for c in trace.copies if c.trigger == "bincount"]
    assert counts and sum(c.calls for c in counts) == 16  # 8 updates: minimum and maximum


@pytest.mark.thirdparty
@_needs("timm")
def test_timm_with_amp_and_grad_scaler(tmp_path):
    out, trace = run_traced("timm_amp.py", tmp_path)
    assert "DTYPES torch.float16 torch.float32" in out  # CUDA's autocast policy
    assert_no_phantoms(trace)
    reads = [c for c in trace.copies
             if c.trigger == "item" and c.site.file.endswith("timm_amp.py")]
    assert [c.site.line for c in reads] == [22] and reads[0].calls == 3  # found_inf, per step
    assert any(o.op == "aten::convolution" and o.device == "cuda:0" for o in trace.ops)


@pytest.mark.thirdparty
@_needs("torchvision")
def test_torchvision_detection_records_nms(tmp_path):
    trace = run_unchanged("tv_detect.py", tmp_path)
    nms = [c for c in trace.copies if c.trigger == "nms"]
    assert nms and all(c.direction == "DtoH" and c.sync for c in nms)



def run_light(name: str, tmp_path: pathlib.Path):
    """The program's trace under `memcpy-doctor profile --light` (the simulated GPU)."""
    trace_path = tmp_path / "light.json"
    done = subprocess.run([sys.executable, "-m", "memcpy_doctor", "profile", "--light",
                           "--device", "sim", "-o", str(trace_path), str(PROGRAMS / name)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return load_trace(str(trace_path))


@pytest.mark.thirdparty
@pytest.mark.parametrize("name, needs", [
    ("accel.py", ("accelerate",)), ("hf_trainer.py", ("transformers", "accelerate")),
    ("lightning_gpu.py", ("lightning",)), ("tmetrics.py", ("torchmetrics",)),
    ("compiled_hf.py", ("transformers",))])
def test_light_and_full_report_the_same_sync_sites(name, needs, tmp_path):
    """`profile --light` and `profile` find the same syncs at the same (line, thread,
    direction), with the same calls, on each library program (issue 41; the samples are in
    tests/test_light.py); and the full tracer finds no race there (issue 42)."""
    missing = [n for n in needs if not _importable(n)]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}")
    (_, full), light = concurrently(lambda: run_traced(name, tmp_path),
                                    lambda: run_light(name, tmp_path))
    assert light.meta.light and not full.meta.light
    assert full.races == []  # (issue 42: no race in these programs)
    assert line_sites(light) == line_sites(full)
    assert sum(line_sites(light).values()) > 0
