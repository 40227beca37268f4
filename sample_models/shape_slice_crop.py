"""Shape -> slice -> crop -> fetch: a PyTorch port of a small Paddle program.

The Paddle original::

    data1 = paddle.full([1, 3, 8, 8], 0.5)
    data2 = paddle.full([1, 3, 5, 5], 0.5)
    shape = paddle.shape(data2)          # output lives on the host
    shape = paddle.slice(shape, ...)     # runs on the device
    out = paddle.crop(data1, shape)      # reads its shape argument on the host
    exe.run(fetch_list=[out])            # fetch the result back to the host

Copies between host and device that this program makes (once per iteration):

1. ``shape = torch.tensor(data2.shape)`` makes a small int64 [4] tensor on the
   HOST (a "shape op"), and no copy yet.
2. ``slice_op`` moves that host tensor to the device with ``.to(device)`` and
   slices [0:4] there: a synchronous host->device copy, made only because the
   slice op happens to run on the device.
3. ``crop_tensor`` needs the sizes as Python ints, so it calls ``.tolist()``
   on the device tensor: a synchronous device->host copy that undoes step 2.
   Steps 2 and 3 together are a pointless round trip; keeping ``shape`` on the
   host (or using ``data2.shape`` directly) would avoid both.
4. The "fetch" ``out.to("cpu", non_blocking=True)`` is an asynchronous
   device->host copy; on CUDA it must be followed by
   ``torch.cuda.synchronize()`` before the result is read.

On a CPU-only machine every ``.to`` is a no-op, so the program still runs and
prints the same result.
"""

import argparse

import torch


def slice_op(shape, device):
    # Host->device copy (synchronous), then the slice runs on the device.
    shape = shape.to(device)
    return shape[0:4]


def crop_tensor(x, shape):
    # Device->host copy (synchronous): the crop needs the sizes on the host.
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
    for _ in range(args.iters):
        data1 = torch.full([1, 3, 8, 8], 0.5, device=device)
        data2 = torch.full([1, 3, 5, 5], 0.5, device=device)
        shape = torch.tensor(data2.shape)
        shape = slice_op(shape, device)
        out = crop_tensor(data1, shape)
        result = out.to("cpu", non_blocking=True)
        if device == "cuda":
            torch.cuda.synchronize()
    print(f"crop sum: {float(result.sum()):.4f}")


if __name__ == "__main__":
    main()
