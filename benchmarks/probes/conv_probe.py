"""Time one convolution's forward and weight-gradient passes at a few input channel counts.

    python benchmarks/probes/conv_probe.py [--device gpu] [--channels 3 4 8] [--dtypes float16 float32]

AlexNet's first layer (256 x 3 x 224 x 224, 64 filters of 11 x 11, stride
4, padding 2), channels-last, through dmath.nn at one worker: does a
zero-padded channel count let cuDNN pick a faster kernel than the three
channels of an RGB image? A diagnostic, not a benchmark.
"""
import argparse
import time

import numpy as np

import dmath


def timed(fn, reps):
    fn()
    dmath.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    dmath.synchronize()
    return (time.perf_counter() - t0) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--channels", type=int, nargs="+", default=[3, 4, 8])
    ap.add_argument("--dtypes", nargs="+", default=["float16", "float32"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    dmath.init(device=args.device)
    rng = np.random.default_rng(0)
    n, hw, k, r = args.batch, 224, 64, 11
    for dtype in args.dtypes:
        for c in args.channels:
            x = dmath.from_numpy(rng.random((n, hw * hw * c), dtype=np.float32), dtype=dtype)
            w = dmath.from_numpy(rng.standard_normal((k, c * r * r), dtype=np.float32) * 0.01, dtype=dtype,
                                 layout=dmath.Replicated())
            b = dmath.zeros((1, k), dtype=dtype, layout=dmath.Replicated())
            geo = dict(stride=(4, 4), padding=(2, 2), kernel_hw=(r, r), channels_last=True)
            y = dmath.nn.conv2d(x, w, b, (c, hw, hw), activation="relu", **geo)
            fwd = timed(lambda: dmath.nn.conv2d(x, w, b, (c, hw, hw), activation="relu", **geo), args.reps)
            bwd = timed(lambda: dmath.nn.conv2d_backward(y, x, w, (c, hw, hw), (r, r), (4, 4), (2, 2),
                                                         need_dx=False, channels_last=True), args.reps)
            print(f"{dtype} C={c}: forward {fwd * 1e3:.3f} ms, weight gradient {bwd * 1e3:.3f} ms", flush=True)
            del x, w, b, y


if __name__ == "__main__":
    main()
