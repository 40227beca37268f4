"""The rows of docs/cuda-sync-points.md: each host wait PyTorch's CUDA code makes, under the
conditions the table gives, at the line that made it, and none where the table says none (on
the simulated GPU, and on a real one where there is one)."""

from __future__ import annotations

import pytest

from triggers_util import check


@pytest.fixture(params=["sim", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request):
    return request.param


def test_fills_read_a_device_value(tmp_path, device):
    check(tmp_path, """
        import torch
        t = torch.arange(6.0, device="cuda")
        v = t[0]
        a = t.masked_fill(t > 2, v)  # expect: DtoH sync masked_fill
        b = t.masked_fill(t > 2, 1.5)
        c = t.masked_fill(t > 2, torch.tensor(1.5))
        t.masked_fill_(t > 4, v)  # expect: DtoH sync masked_fill
        i = torch.tensor([0, 1], device="cuda")  # expect: HtoD sync factory
        t.index_fill_(0, i, v)  # expect: DtoH sync index_fill
        t.index_fill_(0, i, 2.0)
    """, device)


def test_mask_assignment(tmp_path, device):
    check(tmp_path, """
        import torch
        t = torch.arange(6.0, device="cuda")
        t[t > 4] = 0.0
        t[t > 4] = torch.tensor(1.0)
        t[t > 4] = t[0]  # expect: DtoH sync mask
        t[t > 4] = torch.zeros(1, device="cuda")  # expect: DtoH sync mask
        t.index_put_((t > 1,), torch.tensor(2.0), accumulate=True)  # expect: HtoD sync index; DtoH sync mask
        m = t > 2
        s = t.masked_scatter(m, torch.ones(6, device="cuda"))
        t.masked_scatter_(m, torch.ones(6, device="cuda"))
    """, device)


def test_assignments_of_host_scalars(tmp_path, device):
    """A number assigned through an index is a host 0-dim tensor, sent over before the write
    (`copy_to`'s `dst.copy_(src)`, `_index_put_impl_`'s `value.to(self.device())`), except
    where PyTorch fills with it (a row: `fill_`; a mask: `masked_fill_`)."""
    check(tmp_path, """
        import torch
        t = torch.arange(6.0, device="cuda")
        t[0] = 3.0  # expect: HtoD sync copy_
        m = torch.zeros(3, 6, device="cuda")
        m[0] = 2.0
        m[:, 1:3] = 1.0
        idx = torch.tensor([1, 2], device="cuda")  # expect: HtoD sync factory
        t[idx] = 5.0  # expect: HtoD sync index
        t[idx] = torch.ones(2, device="cuda")
        t.index_put_((idx,), torch.tensor(1.0), accumulate=True)  # expect: HtoD sync index
    """, device)


def test_histograms_and_counts(tmp_path, device):
    check(tmp_path, """
        import torch
        t = torch.arange(6.0, device="cuda")
        a = torch.histc(t)  # expect: DtoH sync histc; DtoH sync histc
        b = torch.histc(t, bins=4, min=0, max=6)
        c = torch.histc(t[:0])
        x = torch.arange(4, device="cuda")
        d = torch.bincount(x, minlength=10)  # expect: DtoH sync bincount; DtoH sync bincount
        e = torch.bincount(x.to(torch.uint8))  # expect: DtoH sync bincount
        f = torch.bincount(x[:0])
    """, device)


def test_sampling(tmp_path, device):
    """torch 2.13's multinomial checks its probabilities with `_assert_async`, a device-side
    assert: no read (PyTorch #134818; on this CPU build the profiler shows multinomial ->
    aminmax, bitwise_and, _assert_async twice). Categorical's validation still reads."""
    check(tmp_path, """
        import torch
        torch.manual_seed(0)
        p = torch.rand(2, 5, device="cuda")
        a = torch.multinomial(p, 2)
        b = torch.multinomial(p, 1, replacement=True)
        c = torch.multinomial(p, 3, replacement=True)
        d = torch.distributions.Categorical(probs=p, validate_args=True).sample()  # expect: DtoH sync bool
    """, device)


def test_isin(tmp_path, device):
    check(tmp_path, """
        import torch
        small = torch.arange(5, device="cuda")
        big = torch.arange(1000, device="cuda")
        a = torch.isin(small, big)
        b = torch.isin(big, small)  # expect: DtoH sync isin; DtoH sync isin
        c = torch.isin(big, small, assume_unique=True)
        d = torch.isin(big, 3)
    """, device)


def test_linalg_checks_inside_ops(tmp_path, device):
    check(tmp_path, """
        import torch
        m = torch.eye(3, device="cuda") * 2
        a = torch.linalg.eigh(m)  # expect: DtoH sync linalg_check
        b = torch.linalg.eigvalsh(m)  # expect: DtoH sync linalg_check
        c = torch.linalg.svd(m)  # expect: DtoH sync linalg_check; DtoH sync linalg_check
        d = torch.linalg.cholesky(m)  # expect: DtoH sync linalg_check
        e, info = torch.linalg.cholesky_ex(m)
        f = torch.linalg.pinv(m)  # expect: DtoH sync linalg_check; DtoH sync linalg_check
        g = torch.linalg.pinv(m, hermitian=True)  # expect: DtoH sync linalg_check
        h = torch.linalg.eig(m)  # expect: DtoH sync linalg_check
        i = torch.linalg.det(m)
    """, device)


def test_one_hot(tmp_path, device):
    check(tmp_path, """
        import torch
        import torch.nn.functional as F
        x = torch.tensor([0, 2, 1], device="cuda")  # expect: HtoD sync factory
        a = F.one_hot(x, num_classes=3)
        b = F.one_hot(x)  # expect: DtoH sync item
        assert a.is_cuda and b.shape == (3, 3)
    """, device)


def test_lists_of_device_scalars(tmp_path, device):
    check(tmp_path, """
        import torch
        t = torch.arange(3.0, device="cuda")
        a = torch.tensor([t[0], t[1]])  # expect: DtoH sync factory; DtoH sync factory
        b = torch.stack([t[0], t[1]])
        c = torch.tensor([1.0, 2.0])
        assert a.tolist() == [0.0, 1.0] and not a.is_cuda
    """, device)


def test_ctc_loss_reads_device_lengths(tmp_path, device):
    check(tmp_path, """
        import torch
        import torch.nn.functional as F
        torch.manual_seed(0)
        lp = torch.randn(6, 2, 5, device="cuda").log_softmax(2)
        targets = torch.tensor([[1, 2], [3, 4]], device="cuda")  # expect: HtoD sync factory
        il = torch.full((2,), 6, device="cuda")
        tl = torch.full((2,), 2, device="cuda")
        a = F.ctc_loss(lp, targets, il, tl)  # expect: DtoH sync ctc_loss; DtoH sync ctc_loss
        b = F.ctc_loss(lp, targets, (6, 6), (2, 2))
        c = F.ctc_loss(lp, targets, il.cpu(), tl.cpu())  # expect: DtoH sync cpu; DtoH sync cpu
    """, device)


def test_packed_sequences_keep_lengths_on_the_host(tmp_path, device):
    check(tmp_path, """
        import torch
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
        torch.manual_seed(0)
        x = torch.randn(3, 4, 2, device="cuda")
        lengths = torch.tensor([2, 4, 3])
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)  # expect: HtoD sync to
        rnn = torch.nn.GRU(2, 3, batch_first=True).cuda()  # expect: HtoD sync cuda; HtoD sync cuda; HtoD sync cuda; HtoD sync cuda
        out, h = rnn(packed)
        padded, lens = pad_packed_sequence(out, batch_first=True)  # expect: DtoH sync cpu
        assert not lens.is_cuda and padded.is_cuda and not packed.batch_sizes.is_cuda
        n = lens.tolist()
        m = lens[0] + 1
        k = int(lens.max())
    """, device)


def test_clip_grad_norm_groups_on_the_device(tmp_path, device):
    check(tmp_path, """
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2).cuda()  # expect: HtoD sync cuda; HtoD sync cuda
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        model(torch.randn(8, 4, device="cuda")).sum().backward()
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        assert total.is_cuda
    """, device)


def test_save_and_load(tmp_path, device):
    check(tmp_path, """
        import io
        import torch
        t = torch.arange(4.0, device="cuda")
        buf = io.BytesIO()
        torch.save({"t": t}, buf)  # expect: DtoH sync save
        buf.seek(0)
        a = torch.load(buf, map_location="cuda")  # expect: HtoD sync load
        assert a["t"].is_cuda and a["t"].tolist() == [0.0, 1.0, 2.0, 3.0]  # expect: DtoH sync tolist
        buf.seek(0)
        b = torch.load(buf)  # expect: HtoD sync load
        assert b["t"].is_cuda
        buf.seek(0)
        c = torch.load(buf, map_location="cpu")
        assert not c["t"].is_cuda
    """, device)


def test_transformer_encoder_fast_path_reads_the_mask(tmp_path, device):
    """The mask's alignment check reads it back. Under any torch function mode (the tracer's
    included) PyTorch then leaves the nested-tensor fast path ("some Tensor argument
    has_torch_function"), so its second read, of the rows' sizes, is not made: one copy."""
    check(tmp_path, """
        import torch
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        layer = layer.to(device="cuda")  # expect: HtoD sync to; HtoD sync to; HtoD sync to; HtoD sync to; HtoD sync to; HtoD sync to; HtoD sync to; HtoD sync to; HtoD sync to; HtoD sync to; HtoD sync to; HtoD sync to
        enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
        x = torch.randn(2, 5, 8, device="cuda")
        pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2], device="cuda")  # expect: HtoD sync factory
        with torch.no_grad():
            y = enc(x, src_key_padding_mask=pad)  # expect: DtoH sync nested_mask
    """, device)


def test_factories_with_device_tensor_arguments(tmp_path, device):
    """linspace/logspace read 0-dim tensor ends with item() and build where `device=` says;
    the data factories copy a device tensor to the host only when `device=` names it."""
    check(tmp_path, """
        import warnings
        import torch
        warnings.simplefilter("ignore")  # (torch.tensor(t) suggests t.clone())
        t = torch.arange(4.0, device="cuda")
        a = torch.linspace(t[0], t[3], 5)  # expect: DtoH sync linspace; DtoH sync linspace
        b = torch.linspace(t[0], 3.0, 5, device="cuda")  # expect: DtoH sync linspace
        c = torch.logspace(0.0, t[2], 4, device="cuda")  # expect: DtoH sync logspace
        d = torch.linspace(0.0, 3.0, 5, device="cuda")
        assert not a.is_cuda and b.is_cuda and c.is_cuda and d.is_cuda
        assert a.tolist() == [0.0, 0.75, 1.5, 2.25, 3.0]
        k = torch.signal.windows.kaiser(5, device="cuda")  # expect: HtoD sync factory; DtoH sync linspace; DtoH sync linspace
        e = torch.as_tensor(t)
        f = torch.tensor(t)
        g = t.new_tensor(t)
        h = torch.as_tensor(t, device="cpu")  # expect: DtoH sync factory
        i = torch.tensor(t, device="cpu")  # expect: DtoH sync factory
        j = torch.asarray(t, device="cpu")  # expect: DtoH sync factory
        assert e.is_cuda and f.is_cuda and g.is_cuda and k.is_cuda
        assert not (h.is_cuda or i.is_cuda or j.is_cuda)
    """, device)


def test_random_and_reductions_read_on_the_host(tmp_path, device):
    check(tmp_path, """
        import torch
        torch.manual_seed(0)
        m = torch.zeros(3, device="cuda")
        s = torch.ones(3, device="cuda")
        a = torch.normal(m, s)  # expect: DtoH sync normal; DtoH sync normal
        b = torch.normal(0.0, s)  # expect: DtoH sync normal; DtoH sync normal
        c = torch.normal(m, 1.0)
        o = torch.empty(3, device="cuda")
        torch.normal(m, s, out=o)  # expect: DtoH sync normal
        x = torch.tensor([1.0, float("nan"), 3.0, 2.0], device="cuda")  # expect: HtoD sync factory
        d = x.nanmedian()  # expect: DtoH sync nanmedian
        e = x.median()
        f = x.nanmedian(0)
        g = x[:0].median()  # expect: HtoD sync median
        assert g.is_cuda and d.is_cuda
        data = torch.arange(6.0, device="cuda")
        lengths = torch.tensor([2, 4], device="cuda")  # expect: HtoD sync factory
        h = torch.segment_reduce(data, "sum", lengths=lengths)  # expect: DtoH sync segment_reduce; DtoH sync segment_reduce
        i = torch.segment_reduce(data, "sum", lengths=lengths, unsafe=True)
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        j = torch.segment_reduce(data, "sum", offsets=offsets)
    """, device)


def test_linalg_drivers_check_on_the_host(tmp_path, device):
    check(tmp_path, """
        import warnings
        import torch
        warnings.simplefilter("ignore")  # (torch.cholesky is deprecated)
        torch.manual_seed(0)
        A = torch.randn(5, 3, device="cuda")
        B = torch.randn(5, 2, device="cuda")
        sol = torch.linalg.lstsq(A, B)  # expect: DtoH sync linalg_check
        m = torch.eye(3, device="cuda") * 2
        L = torch.cholesky(m)  # expect: DtoH sync linalg_check
        Q, R = torch.linalg.qr(A)
    """, device)


def test_backward_reads_keep_no_output_alive(tmp_path):
    """A forward op whose backward will read leaves its output with the tracer only until the
    call that made it returns (its autograd node is armed then): a program that drops the
    output frees it."""
    check(tmp_path, """
        import gc, weakref, torch
        x = torch.tensor([1.0, 0.0, 3.0], device="cuda", requires_grad=True)  # expect: HtoD sync factory
        y = x.prod()
        gone = weakref.ref(y)
        del y
        gc.collect()
        assert gone() is None
    """, "sim")


def test_backward_formulas_read_on_the_host(tmp_path, device):
    """The reads of backward formulas that PyTorch skips under a dispatch mode are recorded as
    the program makes them without one, at the backward() line (tracer/backward.py)."""
    check(tmp_path, """
        import torch
        x = torch.tensor([1.0, 0.0, 3.0], device="cuda", requires_grad=True)  # expect: HtoD sync factory
        x.prod().backward()  # expect: DtoH sync prod_backward
        z = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device="cuda", requires_grad=True)  # expect: HtoD sync factory
        p = z.prod(1).sum()
        p.backward()  # expect: DtoH sync prod_backward
        c = z.cumprod(1)
        c.sum().backward()  # expect: DtoH sync cumprod_backward
        z.detach().prod().sum()
        with torch.no_grad():
            n = z.prod()
        m = torch.tensor([True, False, True], device="cuda")  # expect: HtoD sync factory
        v = torch.tensor(2.0, device="cuda", requires_grad=True)  # expect: HtoD sync factory
        y = x.detach().masked_fill(m, v)  # expect: DtoH sync masked_fill
        y.sum().backward()  # expect: DtoH sync masked_fill_backward
        w = x.masked_fill(m, 2.0)
        w.sum().backward()
        s = torch.zeros(3, device="cuda", requires_grad=True)
        src = torch.ones(3, device="cuda", requires_grad=True)
        s.masked_scatter(m, src).sum().backward()  # expect: DtoH sync masked_scatter_backward
        t = torch.rand(3, 3, device="cuda", requires_grad=True)
        t.trace().backward()  # expect: DtoH sync index_fill
        x.max().backward()
        r = z.prod()
        r.backward(retain_graph=True)  # expect: DtoH sync prod_backward
        r.backward()  # expect: DtoH sync prod_backward
        assert x.grad.tolist() == [0.0, 4.0, 1.0]  # expect: DtoH sync tolist
    """, device)


def test_backward_reads_need_no_engine_entry(monkeypatch):
    """On a torch without `torch.autograd._engine_run_backward` nothing is wrapped (pending
    reads are then armed by the next forward op with a rule)."""
    import torch
    from memcpy_doctor.tracer.backward import engine_patches

    assert [name for _, name, _ in engine_patches(lambda: None)] == ["_engine_run_backward"]
    monkeypatch.delattr(torch.autograd, "_engine_run_backward")
    assert engine_patches(lambda: None) == []


def test_nn_init_on_the_device(tmp_path, device):
    """Of torch 2.13's nn.init, trunc_normal_ waits once per sampling round (one here: bounds
    no sample passes), sparse_ sends a host index and value per column, dirac_ an element per
    one it sets; the rest wait for nothing."""
    check(tmp_path, """
        import torch
        from torch import nn
        torch.manual_seed(0)
        w = torch.empty(4, 3, device="cuda")
        nn.init.uniform_(w)
        nn.init.normal_(w)
        nn.init.constant_(w, 0.5)
        nn.init.ones_(w)
        nn.init.zeros_(w)
        nn.init.eye_(w)
        nn.init.xavier_uniform_(w)
        nn.init.xavier_normal_(w)
        nn.init.kaiming_uniform_(w)
        nn.init.kaiming_normal_(w)
        nn.init.orthogonal_(w)
        nn.init.trunc_normal_(w, a=-100.0, b=100.0)  # expect: DtoH sync bool
        nn.init.sparse_(w, 0.5)  # expect: HtoD sync index; HtoD sync index; HtoD sync index; HtoD sync index; HtoD sync index; HtoD sync index
        c = torch.empty(2, 2, 3, device="cuda")
        nn.init.dirac_(c)  # expect: HtoD sync copy_; HtoD sync copy_
        assert w.is_cuda and (w == 0).sum(0).tolist() == [2, 2, 2]  # expect: DtoH sync tolist
    """, device)


@pytest.fixture
def forget_count_big():
    yield
    from memcpy_doctor.tracer import optable
    optable.SYNC_RULES.pop("mdtest::count_big", None)
    optable.forget("mdtest::count_big")


def test_custom_ops_in_the_registry(tmp_path, device, forget_count_big):
    """A user's op declared with register_sync_op, and torchvision's nms (defined here as a
    stand-in where torchvision is not installed, with its CPU kernel's answer)."""
    check(tmp_path, """
        import torch
        import memcpy_doctor
        lib = torch.library.Library("mdtest", "DEF")
        lib.define("count_big(Tensor x) -> Tensor")
        lib.impl("count_big", lambda x: (x > 1).sum().reshape(1), "CompositeExplicitAutograd")
        try:
            import torchvision  # noqa: F401
        except Exception:
            vision = torch.library.Library("torchvision", "DEF")
            vision.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            vision.impl("nms", lambda d, s, t: torch.argsort(s, descending=True),
                        "CompositeExplicitAutograd")
        t = torch.arange(4.0, device="cuda")
        a = torch.ops.mdtest.count_big(t)
        memcpy_doctor.register_sync_op("mdtest::count_big", nbytes=4)
        b = torch.ops.mdtest.count_big(t)  # expect: DtoH sync count_big
        c = torch.ops.mdtest.count_big(t.cpu())  # expect: DtoH sync cpu
        boxes = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1.0]], device="cuda")  # expect: HtoD sync factory
        keep = torch.ops.torchvision.nms(boxes, t[:2], 0.5)  # expect: DtoH sync nms
        assert keep.is_cuda
    """, device)


def test_register_sync_op_rejects_a_bad_declaration():
    from memcpy_doctor import register_sync_op
    with pytest.raises(ValueError, match="namespace"):
        register_sync_op("count_big")
    with pytest.raises(ValueError, match="direction"):
        register_sync_op("mylib::op", direction="DtoD")


def _ops_in_table(text: str, heading: str) -> set[str]:
    """The ops the first cells of the table under `heading` name ("`aten::op`, `other`")."""
    import re

    table = text.split(heading)[1].split("\n## ")[0]
    named = set()
    for row in (line for line in table.splitlines() if line.startswith("| `")):
        first = row.split(" | ")[0]
        named.update(re.findall(r"`((?:aten|torchvision)::\w+)`", first))
        named.update(f"aten::{m}" for m in re.findall(r", `(\w+)`", first.split("(")[0]))
    return named


def test_every_rule_has_a_row():
    """docs/cuda-sync-points.md and SYNC_RULES hold the same ops, its backward table and
    BACKWARD_RULES too, and every test a row names exists."""
    import pathlib
    import re

    import test_sync_points
    import test_triggers
    from memcpy_doctor.tracer.syncpoints import BACKWARD_RULES, SYNC_RULES

    doc = (pathlib.Path(__file__).resolve().parent.parent / "docs" / "cuda-sync-points.md")
    text = doc.read_text(encoding="utf-8")
    assert _ops_in_table(text, "## Ops that copy inside their CUDA code") == set(SYNC_RULES)
    assert _ops_in_table(text, "## Backward formulas that read on the host") == set(
        BACKWARD_RULES)
    modules = {"test_sync_points.py": test_sync_points, "test_triggers.py": test_triggers}
    for file, test in re.findall(r"`(test_\w+\.py)::(test_\w+)`", text):
        assert hasattr(modules[file], test), f"{file}::{test} is named in the doc, not found"
