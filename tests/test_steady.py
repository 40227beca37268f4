"""Steady state and setup (analysis/steady.py): which sync copies repeat every step, how many
steps ran, and how the report, explain and its library-setting rule use that. Hand-built
traces with round numbers."""

from __future__ import annotations

import dataclasses

from memcpy_doctor.analysis.attribution import explain
from memcpy_doctor.analysis.rules import suggest
from memcpy_doctor.analysis.steady import per_step, split_sync
from memcpy_doctor.core.summary import summarize
from memcpy_doctor.core.trace import CopyRecord, Meta, OpRecord, Site, Trace
from memcpy_doctor.render.explain import render_explain_text
from memcpy_doctor.render.text import render_text

TOTAL = 10_000_000


def _copy(trigger: str, calls: int, first: int | None, last: int | None, site: Site,
          direction: str = "DtoH", stack: list[Site] | None = None) -> CopyRecord:
    return CopyRecord(direction, True, False, trigger, calls, 4 * calls, 10_000 * calls,
                      1_000 * calls, site, stack or [site], None, None, [], "float32",
                      first_ns=first, last_ns=last)


def test_a_path_is_per_step_when_its_calls_spread_over_a_quarter_of_the_run():
    at = Site("/w/train.py", 9, "<module>")
    assert not per_step(_copy("to", 1, 5_000, 5_000, at), TOTAL)  # once
    assert not per_step(_copy("to", 122, 1_000, 2_000_000, at), TOTAL)  # a burst: model.to
    assert per_step(_copy("item", 10, 1_000_000, 3_500_000, at), TOTAL)  # 25%
    assert per_step(_copy("item", 2, None, None, at), TOTAL)  # an older trace: repeats count


def _trace(tmp_path) -> tuple[Trace, Site, Site]:
    train = tmp_path / "train.py"
    train.write_text("import torch\n" * 8 + "model.to('cuda')\n" + "x\n" * 10
                     + "    total += loss.item()\n")
    setup, step = Site(str(train), 9, "<module>"), Site(str(train), 20, "<module>")
    copies = [_copy("to", 122, 100_000, 1_000_000, setup, "HtoD"),
              _copy("item", 20, 2_000_000, 9_000_000, step)]
    ops = [OpRecord("aten::mm", "cuda:0", step, 10, 50_000, 20_000),   # once a step
           OpRecord("aten::add", "cuda:0", step, 10, 50_000, 20_000),
           OpRecord("aten::relu", "cuda:0", step, 20, 100_000, 40_000),  # twice a step
           OpRecord("aten::empty", "cpu", setup, 3, 6_000, 0)]  # host ops do not count
    meta = Meta(device="sim", simulated=True, device_name="GPU", device_profile=None,
                torch_version="2.13.0", command=["train.py"])
    return Trace(meta, summarize(TOTAL, [], copies), [], ops, copies, []), setup, step


def test_the_report_has_one_line_for_a_step(tmp_path):
    trace, _, _ = _trace(tmp_path)
    split = split_sync(trace)
    assert (split.steps, split.step_calls, split.step_ns) == (10, 20, 220_000)
    assert (split.setup_calls, split.setup_ns) == (122, 1_342_000)
    assert ("  GpuMemcpySync per step Calls: 2           Total: 0.022       Steps: 10, "
            "estimated (setup and one-off: 122 calls, 1.342)") in render_text(trace).splitlines()


def test_explain_puts_the_step_first_and_setup_on_one_line(tmp_path):
    trace, setup, step = _trace(tmp_path)
    exp = explain(trace)
    assert [(ch.per_step, ch.steps[0].copy.trigger) for ch in exp.chains] == [
        (True, "item"), (False, "to")]
    text = render_explain_text(exp, [], cwd=str(tmp_path))
    lines = text.splitlines()
    assert lines[3] == "Every step:"
    i = lines.index("Setup and one-off (not every step):")
    assert lines[i + 1] == "    122 copies (HtoD `to`), 1.342 ms, pageable, 0.004 GB/s, at train.py:9"
    assert not any("#2" in line for line in lines)  # setup is a line, not a chain


def test_a_library_setting_is_advised_at_the_users_call(tmp_path):
    trace, _, step = _trace(tmp_path)
    lib = Site("/env/lib/python3.11/site-packages/lightning/pytorch/loops/x.py", 134, "f")
    trace.copies = [_copy("item", 20, 2_000_000, 9_000_000, lib, stack=[lib, step])]
    (s,) = suggest(trace, explain(trace), cwd=str(tmp_path))
    assert s.rule == "library-setting" and s.sites == [step] and s.diff is None
    assert s.title == ("change Lightning's setting for its reads to the host every step "
                       "(under train.py:20), which changes what is logged")
    assert s.changes_results
    assert "Trainer(log_every_n_steps=...)" in s.detail and s.saving_ns == 200_000
    trace.copies[0].last_ns = 2_500_000  # not every step: no advice
    assert suggest(trace, explain(trace), cwd=str(tmp_path)) == []


def test_the_hf_trainers_pinned_batches_get_its_own_setting(tmp_path):
    trace, _, step = _trace(tmp_path)
    site = "/env/lib/python3.11/site-packages/"
    moved = Site(site + "accelerate/utils/operations.py", 158, "send_to_device")
    loop = Site(site + "transformers/trainer.py", 2500, "_inner_training_loop")
    copy = _copy("to", 20, 2_000_000, 9_000_000, moved, "HtoD", [moved, loop, step])
    trace.copies = [dataclasses.replace(copy, pinned=True)]
    (s,) = suggest(trace, explain(trace), cwd=str(tmp_path))
    assert s.title == ("change the HF Trainer's setting for its copies to the device every "
                       "step (under train.py:20)")
    assert 'TrainingArguments(accelerator_config={"non_blocking": True})' in s.detail
    assert s.diff is None and not s.changes_results  # (train.py builds no TrainingArguments)


def test_the_hf_trainers_settings_are_one_edit_of_the_users_training_arguments(tmp_path):
    trace, _, step = _trace(tmp_path)
    train = tmp_path / "train.py"  # (parsed this time: the user's arguments are read)
    train.write_text("from transformers import Trainer, TrainingArguments\n"
                     "args = TrainingArguments(output_dir='o',\n"
                     "                         logging_steps=4)\n" + "x\n" * 16
                     + "Trainer(args=args).train()\n")
    site = "/env/lib/python3.11/site-packages/"
    moved = Site(site + "accelerate/utils/operations.py", 158, "send_to_device")
    loop = Site(site + "transformers/trainer.py", 2500, "_inner_training_loop")
    nan = Site(site + "transformers/trainer.py", 2600, "_inner_training_loop")
    trace.copies = [
        dataclasses.replace(_copy("to", 20, 2_000_000, 9_000_000, moved, "HtoD",
                                  [moved, loop, step]), pinned=True),
        _copy("bool", 20, 2_000_000, 9_000_000, nan, "DtoH", [nan, step])]
    (s,) = suggest(trace, explain(trace), cwd=str(tmp_path))
    assert s.title == ("change the HF Trainer's settings for its copies to the device and "
                       "reads to the host every step (under train.py:20), which changes what "
                       "is logged")
    assert s.apply == {"kind": "lines", "edits": [{
        "file": str(train), "line": 3, "old": "                         logging_steps=4)",
        "new": "                         logging_steps=4, accelerator_config={\"non_blocking\": "
               "True}, logging_nan_inf_filter=False)"}]}
    assert s.changes_results and s.exact and len(s.removes) == 2
    train.write_text(train.read_text().replace("logging_steps=4)", "**kw)"))
    (s,) = suggest(trace, explain(trace), cwd=str(tmp_path))
    assert s.diff is None  # (**kw may set them already: no edit)


def test_without_device_ops_of_its_own_the_steps_come_from_every_copy_made_each_step(tmp_path):
    trace, _, step = _trace(tmp_path)
    trace.ops = []  # a Trainer runs the model: no device op at the user's lines
    batch = dataclasses.replace(_copy("to", 16, 1_000_000, 9_000_000, step, "HtoD"), sync=False)
    logged = _copy("item", 4, 2_000_000, 9_000_000, step)  # the loss, every 4th step
    trace.copies = [batch, batch, logged]
    assert split_sync(trace).steps == 16


def test_a_read_made_by_a_model_under_the_trainer_is_not_the_trainers_loss_check(tmp_path):
    """transformers' masking_utils reads `padding_mask.all()` inside the model the Trainer
    runs: no Trainer setting removes it (explain --verify on a config-built DistilBERT)."""
    trace, _, step = _trace(tmp_path)
    site = "/env/lib/python3.11/site-packages/transformers/"
    mask = Site(site + "masking_utils.py", 354, "padding_mask_function")
    loop = Site(site + "trainer.py", 2500, "_inner_training_loop")
    trace.copies = [_copy("bool", 20, 2_000_000, 9_000_000, mask, "DtoH", [mask, loop, step])]
    assert [s.rule for s in suggest(trace, explain(trace), cwd=str(tmp_path))] == []
