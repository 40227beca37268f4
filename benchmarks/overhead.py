"""Per-op cost of the tracer on a loop of small ops (64x64 mm, relu, mul, add; one thread).

    python benchmarks/overhead.py [--iters N]

Prints microseconds per op: plain, under a bare forwarding TorchDispatchMode, and under
memcpy-doctor's tracer (simulated GPU) with the ops on the host and on the simulated device.
A first measurement, not the full benchmark suite (see issue 5).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import memcpy_doctor

OPS_PER_ITER = 4


def work(device: str, iters: int) -> torch.Tensor:
    a = torch.randn(64, 64, device=device)
    b = torch.randn(64, 64, device=device)
    for _ in range(iters):
        c = torch.mm(a, b)
        c = torch.relu(c)
        c = c * 0.5
        a = c + b
    return a


class Forwarding(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def timed(device: str, iters: int) -> float:
    t0 = time.perf_counter()
    work(device, iters)
    return (time.perf_counter() - t0) / (iters * OPS_PER_ITER) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=3000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    work("cpu", 200)
    with Forwarding():
        work("cpu", 50)  # the first dispatch mode imports torch._dynamo: not part of the cost
    plain = timed("cpu", args.iters)
    with Forwarding():
        bare = timed("cpu", args.iters)
    with memcpy_doctor.profiler(device="sim"):
        host = timed("cpu", args.iters)
    with memcpy_doctor.profiler(device="sim"):
        sim = timed("cuda", args.iters)
    print(f"ops: {args.iters * OPS_PER_ITER}, torch {torch.__version__}")
    print(f"plain                          {plain:7.1f} us/op")
    print(f"bare forwarding dispatch mode  {bare:7.1f} us/op  (+{bare - plain:.1f})")
    print(f"memcpy-doctor, host ops        {host:7.1f} us/op  (+{host - plain:.1f})")
    print(f"memcpy-doctor, simulated GPU   {sim:7.1f} us/op  (+{sim - plain:.1f})")


if __name__ == "__main__":
    main()
