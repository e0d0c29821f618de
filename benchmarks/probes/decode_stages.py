"""What each part of the GPU-decoding host stage costs, alone, and which nvImageCodec backend decodes.

    python benchmarks/probes/decode_stages.py OUTDIR [--root DIR] [--images 2048] [--batch 256]

One GPU, no training step. ImageFolder's place 'device_decode' does, per batch, on its host threads:
read each file, parse its header (nvImageCodec's CodeStream: the size for the crop's geometry) and
draw the crop (a NumPy generator per sample); then one nvImageCodec call decodes the batch. In a
ResNet-50 epoch on one H100 (session 23) the reading part took ~40 ms a batch of 256 and the
decoding ~28 ms: together more than the step (~59 ms), and running two batches at once
(DMATH_READ_AHEAD=2) did not shorten them. This probe times:

- `stages`: images/s of read, parse, draws and all three, on 1, 4 and 8 threads (a part that does
  not speed up with threads holds the GIL);
- `decoders`: images/s and the files decoded (not refused) of each backend setting: the default
  (hardware engine, then CUDA, then hybrid; libjpeg's fancy upsampling), the same without fancy
  upsampling, the hardware engine alone, the hybrid (CPU Huffman) backend alone;
- `overlap`: reading + parsing one batch on 4 threads while another decodes (what
  DMATH_READ_AHEAD=2 does), against the two one after the other.
Writes OUTDIR/decode_stages.json.
"""
import argparse
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from image_folder_bench import jpeg_files  # noqa: E402


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--root", default="/tmp/decode_stages_imgs")
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()
    import image_folder_bench
    image_folder_bench.make_folder(a.root, a.images)
    files = jpeg_files(a.root)[:a.images]
    import dmath
    from dmath.gpu import nvimgcodec
    from dnn.data import augment
    dmath.init(device="gpu")
    mod = nvimgcodec.module()
    if mod is None:
        raise SystemExit(f"nvImageCodec is not available: {nvimgcodec.status()[1]}")
    out = {"images": len(files), "batch": a.batch, "stages": {}, "decoders": {}}
    blobs = [_read(f) for f in files]             # (warm: the files in the page cache)

    def draws(i, w=500, h=375):
        return augment.train_draws(w, h, augment.sample_generator(0, i), (0.08, 1.0), (3 / 4, 4 / 3), True)

    def whole(i):
        parsed = nvimgcodec.parse(mod, _read(files[i]))
        return parsed and draws(i, parsed[1], parsed[2])
    parts = {"read": lambda i: _read(files[i]), "parse": lambda i: nvimgcodec.parse(mod, blobs[i]),
             "draws": draws, "all": whole}
    for threads in (1, 4, 8):
        with ThreadPoolExecutor(threads) as pool:
            for name, fn in parts.items():
                t = time.perf_counter()
                list(pool.map(fn, range(len(files))))
                out["stages"][f"{name}_t{threads}"] = len(files) / (time.perf_counter() - t)
    print("stages (img/s):", {k: round(v) for k, v in out["stages"].items()}, flush=True)

    streams = [nvimgcodec.parse(mod, b)[0] for b in blobs]
    nb = len(streams) // a.batch
    kinds_all = ("HW_GPU_ONLY", "GPU_ONLY", "HYBRID_CPU_GPU")
    variants = {"default": (kinds_all, nvimgcodec.OPTIONS), "plain_upsampling": (kinds_all, ""),
                # (HW_GPU_ONLY with HYBRID_CPU_GPU alone, without GPU_ONLY, crashed nvImageCodec 0.9 on an
                # H100 in session 23: a segmentation fault at its first batch; not tried here)
                "hw_only": (("HW_GPU_ONLY",), ""),
                "hybrid_only": (("HYBRID_CPU_GPU",), nvimgcodec.OPTIONS)}
    for name, (kinds, options) in variants.items():
        try:
            dec = nvimgcodec.BatchDecoder(mod, 0, os.cpu_count() or 1, kinds=kinds, options=options)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot start here is a finding too
            out["decoders"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        dec.decode(streams[:a.batch])             # (warm-up: the decoder's buffers)
        done, t = 0, time.perf_counter()
        for k in range(nb):
            images, failure = dec.decode(streams[k * a.batch:(k + 1) * a.batch])
            done += sum(img is not None for img in images)
        secs = time.perf_counter() - t
        out["decoders"][name] = {"images_per_s": nb * a.batch / secs, "decoded": done, "tried": nb * a.batch,
                                 "kinds": list(kinds), "options": options}
        print(name, out["decoders"][name], flush=True)
        del dec

    # reading + parsing a batch on 4 threads while another batch decodes (DMATH_READ_AHEAD=2)
    dec, _ = nvimgcodec.batch_decoder(os.cpu_count() or 1)

    def read_batches(pool, count):
        for k in range(count):
            list(pool.map(whole, range(k * a.batch % len(files), k * a.batch % len(files) + a.batch)))

    def decode_batches(count):
        for k in range(count):
            dec.decode(streams[(k % nb) * a.batch:(k % nb + 1) * a.batch])
    with ThreadPoolExecutor(4) as pool:
        t = time.perf_counter()
        read_batches(pool, nb)
        decode_batches(nb)
        serial = time.perf_counter() - t
        t = time.perf_counter()
        th = threading.Thread(target=decode_batches, args=(nb,))
        th.start()
        read_batches(pool, nb)
        th.join()
        both = time.perf_counter() - t
    out["overlap"] = {"serial_images_per_s": nb * a.batch / serial, "overlapped_images_per_s": nb * a.batch / both}
    print("overlap:", out["overlap"], flush=True)
    os.makedirs(a.outdir, exist_ok=True)
    with open(os.path.join(a.outdir, "decode_stages.json"), "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
