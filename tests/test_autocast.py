"""torch.autocast("cuda") on the simulated GPU follows CUDA's policy, with results equal to a
host run that casts as CUDA's policy says, and leaves the host's own autocast as it was."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from memcpy_doctor.tracer import Tracer
from triggers_util import run_case


def test_cuda_policy_on_the_simulated_device(tmp_path):
    result, _ = run_case(tmp_path, """
        import torch
        import torch.nn.functional as F
        torch.manual_seed(0)
        lin = torch.nn.Linear(8, 4).cuda()
        x = torch.randn(5, 8, device="cuda")
        host = torch.randn(3, 3)
        with torch.autocast("cuda", dtype=torch.float16):
            out = lin(x)
            soft = out.softmax(-1)
            total = out.sum()
            exp = out.exp()
            both = torch.addcmul(out, out.float(), out)
            on_host = host @ host
            try:
                F.binary_cross_entropy(torch.sigmoid(out), torch.ones_like(out))
                refused = False
            except RuntimeError as e:
                refused = "unsafe to autocast" in str(e)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            bf = lin(x)
        loss = soft.sum() + total
        loss.backward()
        want = F.linear(x.cpu().half(), lin.weight.detach().cpu().half(),
                        lin.bias.detach().cpu().half())
        RESULT = {
            "dtypes": [str(t.dtype) for t in (out, soft, total, exp, both, on_host, bf)],
            "refused": refused,
            "equal": torch.equal(out.cpu(), want),
            "grad": str(lin.weight.grad.dtype),
            "host_autocast_after_the_block": torch.is_autocast_enabled("cpu"),
        }
        import json, pathlib
        pathlib.Path(__file__).with_suffix(".json").write_text(json.dumps(RESULT))
    """)
    assert result.exception is None, result.exception
    got = json.loads((tmp_path / "case.json").read_text())
    assert got["dtypes"] == ["torch.float16", "torch.float32", "torch.float32",
                             "torch.float32", "torch.float32", "torch.float32",
                             "torch.bfloat16"]
    assert got["refused"] and got["equal"] and got["grad"] == "torch.float32"
    assert got["host_autocast_after_the_block"] is False


def test_host_autocast_is_itself_again_after_a_run():
    with Tracer(device="sim"):
        with torch.autocast("cuda", dtype=torch.float16):
            torch.mm(torch.ones(2, 2, device="cuda"), torch.ones(2, 2, device="cuda"))
    assert not torch.is_autocast_enabled("cpu")
    a = torch.ones(2, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.mm(a, a).dtype == torch.bfloat16  # the host's own policy again
        assert F.softmax(a, -1).dtype == torch.float32
        assert torch.cat([a, a.bfloat16()]).dtype == torch.float32  # the host promotes cat
