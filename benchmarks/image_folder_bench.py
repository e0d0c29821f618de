"""Training from a folder of JPEG files: dnn.data.ImageFolder's pipeline against torchvision's, and
training from the folder against training from resident arrays.

    python benchmarks/image_folder_bench.py OUTDIR [--workers 1,2,3,4] [--images 2000] [--device cpu|gpu]
        [--root DIR] [--torch-python PYTHON] [--train] [--model resnet50|cnn] [--dtype float16]

Writes OUTDIR/image_folder_<device>_<date>.json. The folder is generated
first (no network needed): --images JPEG files of ImageNet-like sizes (about
500 x 375, varied aspect ratios, smooth content with noise, quality 90) in
10 class folders, under --root (default: a cache directory under /tmp,
reused when it holds the same images).

pipeline (always): images/s of the training transform (RandomResizedCrop
224, flip, normalisation) delivered as batches, at each worker count P:
  dmath       mpiexec -n P: ImageFolder's batches (each worker decodes its
              share), decoding threads tuned; with threads=1 (one decoding
              thread per process: the same processes as the peer); on GPUs
              also with resize_on='device' (the host decodes and crops, the
              GPU resizes) and with decoder='nvimgcodec' (the GPU decodes the
              JPEG files through nvImageCodec, crops and resizes them; the host
              only reads the files), each in a job of its own (an error, e.g.
              nvImageCodec not installed, is recorded in the row)
  torchvision DataLoader(ImageFolder, the same transforms, num_workers=P
              or --tv-workers, batches of the same global size; pin_memory
              and .cuda() on a GPU), run by --torch-python (a separate
              environment is fine)
  nvjpeg      (GPU only) torchvision.io.decode_jpeg on the GPU, then the
              crop, flip and normalisation on the GPU, one process
train (--train): samples/s of Model.fit from the folder against fit from
the same images decoded once and resident on the workers (a Dataset), in
--dtype, with --model (dnn.models.resnet50 when dnn has it, else a plain
CNN stand-in), at each P (on GPUs with the resize on the host and, in
another job, on the device); --train-configs names the configurations
trained (CONFIGS: e.g. tuned,gpu_decode, or tuned_all, where the tuner
chooses among every place, GPU decoding included).
Every figure is a ratio against its peer measured in the same run. Each
side runs a whole epoch first (the tuning, the peer's worker processes
starting), then one timed epoch; with --repeats R the two sides run in
turn R times and the best of each is kept (on a shared machine).

On GPUs, P is the number of GPUs (one worker each): give the peer the
cores dmath's tuned threads may use, e.g. on one H200 with 16 cores
    python benchmarks/image_folder_bench.py OUT --device gpu --workers 1 --images 20000 --tv-workers 16 --train
and on 4 GPUs --workers 4 --tv-workers 64 (the DataLoader's processes feed
one process; dmath's 4 workers each decode their share).
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CLASSES = 10
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# ---- the folder --------------------------------------------------------------------------------
def _write_image(job):
    path, seed = job
    from PIL import Image
    rng = np.random.default_rng(seed)
    ratio = rng.choice([4 / 3, 3 / 4, 1.0, 16 / 9, 3 / 2])
    w = int(np.clip(rng.normal(480, 90), 200, 900))
    h = int(np.clip(w / ratio, 150, 900))
    # smooth content (a coarse random field, upsampled) plus fine noise: JPEG sizes like photos'
    coarse = rng.integers(0, 256, size=(max(2, h // 24), max(2, w // 24), 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(coarse).resize((w, h), Image.BILINEAR), dtype=np.int16)
    img = np.clip(img + rng.integers(-12, 13, size=img.shape), 0, 255).astype(np.uint8)
    Image.fromarray(img).save(path, quality=90)


def jpeg_files(root):
    """Every JPEG file under root (any depth), sorted: the probes' way of listing a folder."""
    out = []
    for d, _, names in os.walk(root):
        out += [os.path.join(d, n) for n in names if n.lower().endswith((".jpg", ".jpeg"))]
    return sorted(out)


def make_folder(root, images):
    """`images` synthetic JPEG files in CLASSES class folders under root (kept for the next run)."""
    marker = os.path.join(root, f".complete_{images}")
    if os.path.exists(marker):
        return root
    jobs = []
    for i in range(images):
        d = os.path.join(root, f"class{i % CLASSES:02d}")
        os.makedirs(d, exist_ok=True)
        jobs.append((os.path.join(d, f"img{i:06d}.jpg"), i))
    from multiprocessing import Pool
    with Pool(os.cpu_count()) as pool:
        pool.map(_write_image, jobs, chunksize=16)
    open(marker, "w").close()
    return root


# ---- children -----------------------------------------------------------------------------------
#: the ImageFolder options of each measured configuration
CONFIGS = {"tuned": {}, "threads1": {"threads": 1}, "device_resize": {"resize_on": "device"},
           "gpu_decode": {"decoder": "nvimgcodec"}, "tuned_all": {"resize_on": "auto"}}


def child_dmath(a):
    """One mpiexec job: batches/s of ImageFolder's training batches (rank 0 writes the JSON)."""
    sys.path.insert(0, ROOT)
    import dmath
    import dnn
    dmath.init(device=a.device)
    P = dmath.num_workers()
    out = {}
    for key in a.config.split(","):
        f = dnn.data.ImageFolder(a.root, image_size=a.size, **CONFIGS[key])
        feed = f.feed()
        B = a.batch * P
        x = dmath.zeros((B, f.features), dtype=a.dtype, layout=dmath.RowBlock())
        n_batches = max(3, len(f) // B)
        feed.start_epoch((1,), 0)
        for _ in range(n_batches):              # warm-up, a whole epoch: the places and threads tuned
            feed.batch_x(x, True, 0)
            feed.advance(B)
        x.sum()
        feed.start_epoch((2,), 1)
        t0 = time.perf_counter()
        for _ in range(n_batches):
            feed.batch_x(x, True, 0)
            feed.advance(B)
        float(x[0:1, 0:1].sum())                # every worker done (a read to the master)
        secs = time.perf_counter() - t0
        out[key] = {"images_per_s": n_batches * B / secs, "seconds": secs, "batches": n_batches,
                    "stats": [p for rep in f.stats() for p in rep["pipelines"]]}
    out["P"] = P
    with open(a.json, "w") as fh:
        json.dump(out, fh)


def child_torchvision(a):
    """torchvision's DataLoader with the same transforms and num_workers=P (one process per worker)."""
    import types
    # a CPU torch with a torchvision wheel built for CUDA: its compiled detection ops cannot load, and
    # only their meta registrations would fail; the data pipeline is pure Python
    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))
    import torch
    import torchvision
    from torchvision import datasets, transforms
    gpu = a.device == "gpu"
    t = transforms.Compose([transforms.RandomResizedCrop(a.size), transforms.RandomHorizontalFlip(),
                            transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    ds = datasets.ImageFolder(a.root, transform=t)
    B = a.batch * a.procs
    loader = torch.utils.data.DataLoader(ds, batch_size=B, shuffle=True, num_workers=a.tv_workers or a.procs,
                                         pin_memory=gpu,
                                         persistent_workers=True, prefetch_factor=2, drop_last=True)
    n_batches = max(3, len(ds) // B)
    dtype = getattr(torch, a.dtype)

    def run(k):
        done = 0
        while done < k:
            for xb, yb in loader:
                if gpu:
                    xb = xb.cuda(non_blocking=True).to(dtype)
                done += 1
                if done == k:
                    break
        if gpu:
            torch.cuda.synchronize()
    run(n_batches)                              # warm-up, a whole epoch: every worker process started
    t0 = time.perf_counter()
    run(n_batches)
    secs = time.perf_counter() - t0
    res = {"images_per_s": n_batches * B / secs, "seconds": secs, "batches": n_batches,
           "torch": torch.__version__, "torchvision": torchvision.__version__}
    if gpu and a.procs == 1:
        res["nvjpeg"] = _nvjpeg(a, torch, torchvision, ds)
    with open(a.json, "w") as fh:
        json.dump(res, fh)


def _nvjpeg(a, torch, torchvision, ds):
    """torchvision.io.decode_jpeg on the GPU (nvJPEG, batched) and the same transforms on the GPU."""
    from torchvision.io import decode_jpeg, read_file
    from torchvision.transforms import v2
    t = v2.Compose([v2.RandomResizedCrop(a.size, antialias=True), v2.RandomHorizontalFlip()])
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1) * 255
    paths = [p for p, _ in ds.samples]
    B = a.batch
    n_batches = max(3, len(paths) // B)
    dtype = getattr(torch, a.dtype)

    def batch(k):
        files = [read_file(paths[(k * B + i) % len(paths)]) for i in range(B)]
        imgs = decode_jpeg(files, device="cuda")
        x = torch.stack([t(im) for im in imgs]).to(torch.float32)
        return ((x - mean) / std).to(dtype)
    batch(0)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for k in range(n_batches):
        batch(k)
    torch.cuda.synchronize()
    secs = time.perf_counter() - t0
    return {"images_per_s": n_batches * B / secs, "batches": n_batches}


def child_train(a):
    """fit from the folder against fit from the same images resident on the workers."""
    sys.path.insert(0, ROOT)
    import dmath
    import dnn
    from dnn import layers as L
    from dmath.gpu import nvimgcodec
    if a.decoder_options is not None:
        nvimgcodec.OPTIONS = a.decoder_options
    if a.decoder_kinds:
        nvimgcodec.KINDS = tuple(a.decoder_kinds.split(","))
    dmath.init(device=a.device)
    P = dmath.num_workers()
    folder = dnn.data.ImageFolder(a.root, image_size=a.size, **CONFIGS[a.config])

    def build():
        dmath.random.seed(0)
        if a.model == "resnet50" and hasattr(dnn, "models") and hasattr(dnn.models, "resnet50"):
            return dnn.models.resnet50(num_classes=CLASSES, input_shape=(3, a.size, a.size), dtype=a.dtype,
                                       optimizer=dnn.optim.SGD(lr=0.01, momentum=0.9)), "resnet50"
        return dnn.Sequential([
            L.Input((3, a.size, a.size)), L.Conv2D(32, 7, stride=2, padding=3), L.Activation("relu"),
            L.Pool2D(2), L.Conv2D(64, 3, padding="same"), L.Activation("relu"), L.Pool2D(2),
            L.Conv2D(128, 3, padding="same"), L.Activation("relu"), L.Pool2D(4), L.Flatten(),
            L.Dense(CLASSES), L.Output("softmax")], dtype=a.dtype,
            optimizer=dnn.optim.SGD(lr=0.01, momentum=0.9)), "cnn"
    # the resident peer: the same images decoded once (the evaluation transform: the same size),
    # stored as uint8-exact float16 on the workers, normalised on the device at every step
    from dnn.data.decode import FolderSource
    desc = json.dumps({"root": folder.root, "files": folder.files, "labels": folder.targets,
                       "image_size": [a.size, a.size], "resize_size": folder.resize_size, "crop_scale": [0.08, 1],
                       "crop_ratio": [0.75, 4 / 3], "flip": True, "on_error": "skip"}).encode()
    src = FolderSource(desc)
    pix = np.empty((len(folder), a.size, a.size, 3), dtype=np.uint8)
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        list(pool.map(lambda i: src.sample(i, 0, False, 0, pix[i]), range(len(folder))))
    resident = dnn.data.Dataset(pix.transpose(0, 3, 1, 2), np.asarray(folder.targets),
                                augment=dnn.data.Augment(flip=True), scale=1 / 255, mean=MEAN, std=STD)
    res = {"P": P, "decoder_kinds": list(nvimgcodec.KINDS), "decoder_options": nvimgcodec.OPTIONS,
           "read_ahead": dmath.settings.current.read_ahead}
    B = a.batch * P
    for name in ("resident", "folder"):
        model, kind = build()
        data = resident if name == "resident" else folder
        hist = model.fit(data, batch_size=B, epochs=a.epochs, verbose=0).history
        st = dmath.stats()[0]
        res[name] = {"samples_per_s": hist["samples_per_s"][-1], "all_epochs": hist["samples_per_s"],
                     # the plans held as CUDA graphs (a folder's step: its segments after the batch's host stage)
                     "plan_graphs": st.get("plan_graphs"), "plan_blockers": st.get("plan_blockers")}
        res["model"] = kind
        # the resident run's images, model and recorded steps (their CUDA graphs' memory) go before the
        # folder's run: kept, they left it too little memory at 4 GPUs and global batch 1024
        model = data = resident = None
        gc.collect()
        dmath.memory.clear()
    res["folder_over_resident"] = res["folder"]["samples_per_s"] / res["resident"]["samples_per_s"]
    res["pipeline"] = [p for rep in folder.stats() for p in rep["pipelines"] if p["random"]]
    with open(a.json, "w") as fh:
        json.dump(res, fh)


# ---- the driver ---------------------------------------------------------------------------------
def _mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.access(here, os.X_OK) else "mpiexec"


def _run(cmd, timeout):
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    env.setdefault("HYDRA_LAUNCHER", "fork")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")


def _child(kind, a, P, python=None, config="tuned"):
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    common = ["--child", kind, "--root", a.root, "--batch", str(a.batch), "--size", str(a.size), "--device",
              a.device, "--dtype", a.dtype, "--json", path, "--procs", str(P), "--model", a.model, "--epochs",
              str(a.epochs), "--tv-workers", str(a.tv_workers), "--config", config, a.outdir]
    if a.decoder_options is not None and kind != "torchvision":
        common += ["--decoder-options", a.decoder_options]
    if a.decoder_kinds and kind != "torchvision":
        common += ["--decoder-kinds", a.decoder_kinds]
    if kind == "torchvision":
        _run([python, os.path.abspath(__file__)] + common, a.timeout)
    else:
        cmd = [sys.executable, os.path.abspath(__file__)] + common
        _run(([_mpiexec(), "-n", str(P)] if P > 1 else []) + cmd, a.timeout)
    with open(path) as fh:
        res = json.load(fh)
    os.remove(path)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("--workers", default="1,2,3,4")
    ap.add_argument("--images", type=int, default=2000)
    ap.add_argument("--root", default=None)
    ap.add_argument("--batch", type=int, default=64, help="images per worker per batch")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--torch-python", default=sys.executable)
    ap.add_argument("--tv-workers", type=int, default=0,
                    help="the DataLoader's num_workers (default: P, as many processes as dmath's workers)")
    ap.add_argument("--train", action="store_true")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--repeats", type=int, default=1, help="runs of each side, in turn; the best is kept")
    ap.add_argument("--child", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--config", default="tuned")
    ap.add_argument("--decoder-options", default=None,
                    help="train child: nvImageCodec's decoder options on every rank (dmath.gpu.nvimgcodec.OPTIONS, "
                         "default ':fancy_upsampling=1', libjpeg's chroma upsampling); '' may let the GPU's hardware "
                         "JPEG engine take the files (probes/decode_contention.py's hw_only: 11,982 img/s alone)")
    ap.add_argument("--decoder-kinds", default=None,
                    help="train child: nvImageCodec's backends on every rank, a comma list of BackendKind names "
                         "(dmath.gpu.nvimgcodec.KINDS), e.g. HW_GPU_ONLY: the hardware JPEG engine alone (the files it "
                         "refuses are decoded on the host)")
    ap.add_argument("--train-configs", default=None,
                    help="with --train: the pipeline configurations trained, comma-separated (default: tuned, and "
                         "device_resize on GPUs)")
    a = ap.parse_args()
    if a.dtype is None:
        a.dtype = "float16" if a.device == "gpu" else "float32"
    if a.child:
        {"dmath": child_dmath, "torchvision": child_torchvision, "train": child_train}[a.child](a)
        return
    a.root = a.root or os.path.join(tempfile.gettempdir(), "dmath_image_folder_bench")
    t0 = time.perf_counter()
    make_folder(a.root, a.images)
    result = {"images": a.images, "root": a.root, "device": a.device, "dtype": a.dtype, "batch_per_worker": a.batch,
              "size": a.size, "cpus": len(os.sched_getaffinity(0)), "load_before": os.getloadavg(),
              "generate_s": time.perf_counter() - t0, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
              "pipeline": [], "train": []}
    for P in (int(v) for v in a.workers.split(",")):
        row = {"P": P}
        runs = {"tuned": [], "threads1": [], "torchvision": []}
        # dmath and the peer in turn, --repeats times, the best of each kept: a machine shared with
        # other work slows a run, never speeds it up
        for _ in range(a.repeats):
            d = _child("dmath", a, P, config="tuned,threads1")
            runs["tuned"].append(d["tuned"]["images_per_s"])
            runs["threads1"].append(d["threads1"]["images_per_s"])
            try:
                tv = _child("torchvision", a, P, a.torch_python)
                runs["torchvision"].append(tv["images_per_s"])
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                row["torchvision_error"] = str(exc)[-1500:]
        row["runs"] = runs
        row["dmath_tuned_img_s"] = max(runs["tuned"])
        row["dmath_threads1_img_s"] = max(runs["threads1"])
        row["dmath_tuned_threads"] = sorted({p["threads"] for p in d["tuned"]["stats"]})
        row["dmath_tuned_places"] = sorted({p["place"] for p in d["tuned"]["stats"]})
        if a.device == "gpu":
            # its own job: the device resize's kernel is measured apart from the rest
            try:
                dr = _child("dmath", a, P, config="device_resize")["device_resize"]
                row["dmath_device_resize_img_s"] = dr["images_per_s"]
                row["dmath_device_resize_threads"] = sorted({p["threads"] for p in dr["stats"]})
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                row["dmath_device_resize_error"] = str(exc)[-1500:]
            try:
                gd = _child("dmath", a, P, config="gpu_decode")["gpu_decode"]
                row["dmath_gpu_decode_img_s"] = gd["images_per_s"]
                row["dmath_gpu_decode_threads"] = sorted({p["threads"] for p in gd["stats"]})
                row["dmath_gpu_decode_decoded_on"] = {k: sum(p["decoded_on"][k] for p in gd["stats"])
                                                      for k in ("gpu", "host")}
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                row["dmath_gpu_decode_error"] = str(exc)[-1500:]
        if runs["torchvision"]:
            best = max(runs["torchvision"])
            row["torchvision_img_s"] = best
            row["torchvision_num_workers"] = a.tv_workers or P
            row["torchvision_version"] = tv["torchvision"]
            row["tuned_over_torchvision"] = row["dmath_tuned_img_s"] / best
            row["threads1_over_torchvision"] = row["dmath_threads1_img_s"] / best
            if "nvjpeg" in tv:
                row["nvjpeg_img_s"] = tv["nvjpeg"]["images_per_s"]
                row["tuned_over_nvjpeg"] = row["dmath_tuned_img_s"] / tv["nvjpeg"]["images_per_s"]
        print(json.dumps(row), flush=True)
        result["pipeline"].append(row)
        if a.train:
            configs = a.train_configs.split(",") if a.train_configs else (
                ("tuned",) + (("device_resize",) if a.device == "gpu" else ()))
            for config in configs:
                try:
                    tr = _child("train", a, P, config=config)
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    tr = {"P": P, "error": str(exc)[-1500:]}
                tr["config"] = config
                print(json.dumps({k: v for k, v in tr.items() if k != "pipeline"}), flush=True)
                result["train"].append(tr)
    result["load_after"] = os.getloadavg()
    os.makedirs(a.outdir, exist_ok=True)
    path = os.path.join(a.outdir, f"image_folder_{a.device}_{time.strftime('%Y-%m-%d_%H%M%S')}.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
