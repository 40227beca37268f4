"""Shape -> slice -> crop -> fetch: a PyTorch port of Paddle example 2 (docs/paddle-report.md).

The Paddle original::

    data1 = fluid.layers.fill_constant([1, 3, 8, 8], "float32", 0.5)
    data2 = fluid.layers.fill_constant([1, 3, 5, 5], "float32", 0.5)
    shape = fluid.layers.shape(data2)            # its output lives on the host
    shape = fluid.layers.slice(shape, axes=[0], starts=[0], ends=[4])  # runs on the GPU
    out = fluid.layers.crop_tensor(data1, shape=shape)  # reads its shape on the host
    exe.run(fetch_list=[out])                    # fetch the result back to the host

Paddle places every op on the GPU and copies inputs that live elsewhere; the port does the
same with ``memcpy_doctor.device_guard(device)`` around the loop. Per iteration:

1. ``shape_op`` keeps its output on the host (an int64 [4] tensor), as Paddle's shape op does.
2. ``slice_op`` runs on the device, so the guard copies the host shape there first: a
   synchronous host->device copy.
3. ``crop_tensor`` reads its shape argument on the host with ``.tolist()``: a synchronous
   device->host copy that undoes step 2.
4. The fetch ``out.to("cpu", non_blocking=True)`` is an asynchronous device->host copy,
   followed by ``torch.cuda.synchronize()`` before the result is read.

The fix, as in the Paddle article: run the slice under ``device_guard("cpu")``; both sync
copies go. ``memcpy-doctor explain`` suggests exactly that edit, and ``memcpy-doctor profile
--apply`` shows its effect. On a machine without a GPU (and without memcpy-doctor's simulated
one) everything runs on the host and prints the same result.
"""

import argparse

import torch

from memcpy_doctor import device_guard


def shape_op(x):
    # Paddle's shape op: the output lives on the host.
    return torch.tensor(x.shape, device="cpu")


def slice_op(shape, start, end):
    # Paddle's slice makes a new tensor (not a view) where the op runs.
    return torch.narrow_copy(shape, 0, start, end - start)


def crop_tensor(x, shape):
    # Paddle's crop_tensor reads its shape argument on the host.
    sizes = shape.tolist()
    return x[: sizes[0], : sizes[1], : sizes[2], : sizes[3]]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=10, help="number of iterations (default 10)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="device to run on (default: cuda if available, else cpu)")
    args = parser.parse_args(argv)

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)

    result = None
    with device_guard(device):
        for _ in range(args.iters):
            data1 = torch.full([1, 3, 8, 8], 0.5)
            data2 = torch.full([1, 3, 5, 5], 0.5)
            shape = shape_op(data2)
            shape = slice_op(shape, 0, 4)
            out = crop_tensor(data1, shape)
            result = out.to("cpu", non_blocking=True)
            if device == "cuda":
                torch.cuda.synchronize()
    print(f"crop sum: {float(result.sum()):.4f}")


if __name__ == "__main__":
    main()
