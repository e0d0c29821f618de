"""CPU time per image of the host stage of an ImageFolder's training transform, part by part.

    python benchmarks/probes/host_image_costs.py OUTDIR [--root DIR] [--images 400] [--repeats 3]

One thread, no MPI, no training: for the synthetic JPEG files of benchmarks/image_folder_bench.py
(ImageNet-like sizes, made under --root when missing) it measures the thread CPU time
(time.thread_time, so other processes on the machine do not inflate it) of each part dnn's host
stage runs per training sample: reading the file, decoding it (simplejpeg, and Pillow for
reference: both libjpeg-turbo), drawing the crop, and cropping + resizing + mirroring it
(dnn.data.augment.resized_crop, Pillow's antialiased bilinear resize). The best of --repeats passes
over the files. Where every core is busy, images/s is the cores divided by the per-image CPU time,
so the sum of the parts bounds what any pipeline doing this work can reach on those cores.
Writes OUTDIR/host_image_costs.json.
"""
import argparse
import io
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

import numpy as np  # noqa: E402

import image_folder_bench  # noqa: E402
from dnn.data import augment  # noqa: E402


def per_image_ms(fn, items, repeats):
    """Best over `repeats` passes of the thread CPU milliseconds per item of fn(item)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        for it in items:
            fn(it)
        best = min(best, time.thread_time() - start)
    return 1e3 * best / len(items)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--root", default=None, help="the JPEG folder (default OUTDIR/folder, made when missing)")
    ap.add_argument("--images", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    root = image_folder_bench.make_folder(args.root or os.path.join(args.outdir, "folder"), args.images)
    paths = image_folder_bench.jpeg_files(root)[:args.images]
    import simplejpeg
    from PIL import Image

    datas = [open(p, "rb").read() for p in paths]
    pixels = [simplejpeg.decode_jpeg(d, colorspace="RGB") for d in datas]
    rng = np.random.default_rng(0)
    draws = [augment.train_draws(px.shape[1], px.shape[0], rng, (0.08, 1.0), (3 / 4, 4 / 3), True)
             for px in pixels]
    parts = {
        "read": per_image_ms(lambda p: open(p, "rb").read(), paths, args.repeats),
        "decode_simplejpeg": per_image_ms(lambda d: simplejpeg.decode_jpeg(d, colorspace="RGB"), datas,
                                          args.repeats),
        "decode_pillow": per_image_ms(lambda d: Image.open(io.BytesIO(d)).convert("RGB"), datas, args.repeats),
        "draws": per_image_ms(lambda px: augment.train_draws(px.shape[1], px.shape[0], rng, (0.08, 1.0),
                                                             (3 / 4, 4 / 3), True), pixels, args.repeats),
        "crop_resize_flip": per_image_ms(lambda i: augment.resized_crop(pixels[i], draws[i][0], (224, 224),
                                                                        draws[i][1]),
                                         range(len(pixels)), args.repeats),
    }
    host_stage = parts["read"] + parts["decode_simplejpeg"] + parts["draws"] + parts["crop_resize_flip"]
    result = {"images": len(paths), "mean_pixels": float(np.mean([px.shape[0] * px.shape[1] for px in pixels])),
              "mean_file_bytes": float(np.mean([len(d) for d in datas])), "ms_per_image": parts,
              "host_stage_ms": host_stage, "cpus": len(os.sched_getaffinity(0)),
              "images_per_s_per_core_at_most": 1e3 / host_stage}
    for k, v in parts.items():
        print(f"{k:18s} {v:7.3f} ms/image (thread CPU time)")
    print(f"host stage (read + simplejpeg + draws + crop/resize/flip): {host_stage:.3f} ms/image: at most "
          f"{1e3 / host_stage:,.0f} images/s per busy core")
    with open(os.path.join(args.outdir, "host_image_costs.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
