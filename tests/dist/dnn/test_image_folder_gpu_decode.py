"""dnn.data.ImageFolder with JPEG files decoded on the GPU (decoder='nvimgcodec', the place 'device_decode').

Everywhere: the option's errors and explain()'s reason on the CPU backend, and the place's host stage
(file bytes, the crops' gather table, the files the GPU does not take decoded on the host, skipped
files) driven by a stand-in decoder (Pillow) so that its batches must equal the device resize's.
On a GPU with nvImageCodec: batches within the IDCT's rounding of Pillow's (the same crops), PNG and
CMYK files exactly Pillow's, corrupt files skipped as on the host, the tuner trying GPU decoding, the
gather kernel, and training through fit.
"""
import io
import json
import os
import warnings

import numpy as np
import pytest
from PIL import Image

import dmath
import dnn
from dmath.gpu import nvimgcodec
from dmath.ops import gpu_decode, host_batches, resize
from dmath.ops.nn.batch import permutation_values
from dnn import layers as L
from dnn.data import augment
from dnn.data.decode import FolderSource
from dnn.errors import ConfigError

from _images import make_folder

GPU = dmath.device() == "gpu"
GPU_DECODE = host_batches.gpu_decode_status()
needs_gpu_decode = pytest.mark.skipif(not GPU_DECODE[0], reason=f"no GPU decoding here: {GPU_DECODE[1]}")
#: one grey level after the normalisation
GREY = 1 / 255 / min(augment.IMAGENET_STD)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Smooth images (JPEG, PNG, grey and palette PNG), a greyscale JPEG and a CMYK JPEG."""
    r = make_folder(tmp_path_factory.mktemp("gpu_folder"), per_class=12, smooth=True)
    a = np.asarray(Image.open(r / "ant" / "img01.jpg").convert("RGB"))
    Image.fromarray(a).convert("L").save(r / "bee" / "img01g.jpg", quality=90)
    Image.fromarray(a).convert("CMYK").save(r / "cow" / "img01c.jpg", quality=90)
    return r


@pytest.fixture(scope="module")
def bad_root(tmp_path_factory):
    """The folder with a corrupt JPEG, a truncated JPEG and a text file named .png."""
    r = make_folder(tmp_path_factory.mktemp("gpu_bad"), per_class=8, seed=1, smooth=True)
    (r / "ant" / "img00x.jpg").write_bytes(os.urandom(500))
    good = (r / "bee" / "img01.jpg").read_bytes()
    (r / "bee" / "img01x.jpg").write_bytes(good[:len(good) // 2])
    (r / "cow" / "img02x.png").write_text("not an image")
    return r


def batch(folder, rows, training, *, key=(4,), epoch=1, seed=3, dtype="float64"):
    """Rows 0 .. rows - 1 of the epoch's order, decoded by the workers."""
    feed = folder.feed()
    feed.start_epoch(key, epoch)
    out = dmath.zeros((rows, folder.features), dtype=dtype, layout=dmath.RowBlock())
    feed.batch_x(out, training, seed)
    return out.to_numpy()


def gpu_rows(folder, key=(4,)):
    """Which rows of the epoch's order are files the GPU decodes (RGB or grey JPEG, whole)."""
    order = permutation_values(len(folder), key).astype(int)
    names = [folder.files[i] for i in order]
    return np.array([n.endswith(".jpg") and not n.endswith(("c.jpg", "x.jpg")) for n in names])


# ---- everywhere -----------------------------------------------------------------------------------
@pytest.mark.skipif(GPU, reason="the CPU backend's error")
def test_decoder_nvimgcodec_on_the_cpu_backend_is_a_config_error(root):
    with pytest.raises(ConfigError, match="GPU backend"):
        dnn.data.ImageFolder(root, decoder="nvimgcodec")
    dmath.zeros((2, 2)).to_numpy()          # the runtime stays usable


def test_explain_says_where_images_are_decoded_and_why_not_on_the_gpu(root):
    f = dnn.data.ImageFolder(root, image_size=8)
    batch(f, 12, True)
    text = f.explain()
    assert "GPU decoding: not a candidate" in text
    assert ("resize_on='host'" if GPU else "the CPU backend") in text
    assert "decode, crop and resize on the host threads" in text
    text = dnn.data.ImageFolder(root, image_size=8, decoder="pillow", resize_on="auto").explain()
    assert "not a candidate (decoder='pillow' decodes on the host)" in text


class PillowDecoder:
    """A stand-in for nvimgcodec.BatchDecoder on the host: nvImageCodec's own parser reads the headers
    where the module imports (it needs no GPU), else Pillow; Pillow decodes, and the files in `refuse`
    come back as None (as the GPU decoder's failures do)."""

    def __init__(self, refuse=()):
        self.refuse = set(refuse)
        self.calls = []            # the `after` of every decode call

    def parse(self, data):
        mod = nvimgcodec.module()
        if mod is not None:
            parsed = nvimgcodec.parse(mod, data)
            return None if parsed is None else (data, parsed[1], parsed[2])
        try:
            img = Image.open(io.BytesIO(data))
        except Exception:
            return None
        if img.format != "JPEG" or img.mode not in ("RGB", "L"):
            return None
        return data, img.size[0], img.size[1]

    def decode(self, streams, after=None):
        self.calls.append(after)
        out = []
        for data in streams:
            try:
                out.append(None if data in self.refuse else np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
            except OSError:
                out.append(None)
        return out, None

    @staticmethod
    def view(img):
        return None if img is None else (id(img), img.shape[1] * 3, img.shape[0], img.shape[1])


@pytest.mark.parametrize("train,decode_order", [(True, "overlap"), (False, "overlap"), (True, "serial")])
def test_host_stage_with_a_stand_in_decoder_gives_the_device_resizes_batch(bad_root, monkeypatch, train,
                                                                           decode_order):
    """The place's host stage on this process (rank 0's own pipeline), with Pillow standing in for the
    GPU: the packed host regions, the gathered crops and the geometry table resize to the batch of the
    place 'device_resize' exactly, with corrupt files skipped the same way and a file the decoder
    refuses decoded on the host. DMATH_GPU_DECODE_ORDER=serial: the host stage only reads; `finish`
    (the device stage's first act) decodes, ordered after the step's stream, to the same batch."""
    monkeypatch.setattr(dmath.settings.current, "gpu_decode_order", decode_order)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        dev = dnn.data.ImageFolder(bad_root, image_size=10, train=train, resize_on="device", decoder="pillow")
        n = len(dev)
        want = batch(dev, n, train)
        refused = (bad_root / "cow" / "img01.jpg").read_bytes()
        fake = PillowDecoder(refuse=[refused])
        monkeypatch.setattr(nvimgcodec, "batch_decoder", lambda threads=0: (fake, None))
        src = FolderSource(json.dumps({
            "root": dev.root, "files": dev.files, "labels": dev.targets, "image_size": [10, 10],
            "resize_size": dev.resize_size, "crop_scale": list(dev.crop_scale), "crop_ratio": list(dev.crop_ratio),
            "flip": True, "on_error": "skip", "batch_transform": None, "decoder": "nvimgcodec"}).encode())
        mean = tuple(255.0 * v for v in dev.pixel_mean)
        std = tuple(255.0 * v for v in dev.pixel_std)
        static = host_batches.BatchArgs(image=(3, 10, 10), random=train, mean=mean, std=std, threads=2,
                                        places=("device_decode",))
        pipe = host_batches.Pipeline(src, static, n, "float64")
        staged = host_batches._Staged(None, "device_decode", None)
        staged.copied = [None, None, None]
        order = permutation_values(n, (4,)).astype(np.int64)
        try:
            gpu_decode.host_stage(pipe, staged, order, n + np.arange(n, dtype=np.int64), 3)
            if decode_order == "serial":
                assert fake.calls == [] and staged.pending is not None and staged.gather is None
                gpu_decode.finish(pipe, staged, after="the step's stream")
                assert fake.calls == ["the step's stream"]
            else:
                assert fake.calls == [None]
            assert staged.pending is None
        finally:
            pipe.pool.shutdown()
    # the device stage, as the GPU runs it: host regions copied, crops gathered, one resize
    packed = np.zeros(staged.total, dtype=np.uint8)
    packed[:staged.host_total] = staged.array[:staged.host_total]
    by_address = {id(img): img for img in staged.images if img is not None}
    gpu_decode.gather_reference([by_address[a] for a in staged.gather[:, 0]], staged.gather, packed)
    got = np.empty((n, 3, 10, 10))
    resize.resize_batch(np, packed, staged.geom, got, np.asarray(mean).reshape(1, 3, 1, 1),
                        (1 / np.asarray(std)).reshape(1, 3, 1, 1))
    np.testing.assert_allclose(got.reshape(n, -1), want, rtol=1e-12, atol=1e-12)
    # every whole JPEG but the refused one went to the (stand-in) GPU decoder
    names = [dev.files[i] for i in order]
    jpeg = sum(1 for f in names if f.endswith(".jpg") and not f.endswith("x.jpg") and f != "cow/img01.jpg")
    assert pipe.decoded == {"gpu": jpeg, "host": n - jpeg} and len(staged.gather) == jpeg
    # the host stage's parts, timed for explain()
    assert set(staged.stages) == {"read", "decode", "assemble"} and min(staged.stages.values()) >= 0
    assert set(src.report()["skipped"]) == {"ant/img00x.jpg", "bee/img01x.jpg", "cow/img02x.png"}


# ---- on a GPU with nvImageCodec -------------------------------------------------------------------
def _compare(a, b, exact_rows):
    """Rows `exact_rows` equal; the others within the decoders' IDCT rounding (in grey levels)."""
    np.testing.assert_allclose(a[exact_rows], b[exact_rows], rtol=1e-12, atol=1e-12)
    diff = np.abs(a[~exact_rows] - b[~exact_rows]) / GREY
    assert diff.max() <= 8 and diff.mean() < 1, (diff.max(), diff.mean())


@pytest.fixture(params=["overlap", "serial"])
def decode_order(request):
    """Every rank decodes in this order (DMATH_GPU_DECODE_ORDER) during the test; the setting's value
    (the master's: every rank read the same environment) after it."""
    from dmath.ops.base import dispatch
    orders = ("overlap", "serial")
    before = dmath.settings.current.gpu_decode_order
    dispatch("test_gpu_decode_order", scalars=[orders.index(request.param)])
    yield request.param
    dispatch("test_gpu_decode_order", scalars=[orders.index(before)])


@needs_gpu_decode
@pytest.mark.parametrize("train", [True, False])
def test_gpu_decoded_batches_are_pillows_within_the_idct_rounding(root, train, decode_order):
    host = dnn.data.ImageFolder(root, image_size=10, train=train, resize_on="device", decoder="pillow")
    gpu = dnn.data.ImageFolder(root, image_size=10, train=train, decoder="nvimgcodec")
    assert gpu.places == ("device_decode",) and gpu.gpu_decoding[0] == "only"
    n = len(gpu)
    on_gpu = gpu_rows(gpu)
    for dtype in ("float64", "float32"):
        _compare(batch(gpu, n, train, dtype=dtype), batch(host, n, train, dtype=dtype), ~on_gpu)
    pipes = [p for rep in gpu.stats() for p in rep["pipelines"]]
    assert {p["place"] for p in pipes} == {"device_decode"}
    done = [sum(p["decoded_on"][k] for p in pipes) for k in ("gpu", "host")]
    # PNG and CMYK files on the host, JPEG files on the GPU (unless it refuses one: then on the host)
    assert done[0] + done[1] == 2 * n and done[0] >= int(on_gpu.sum())
    assert "decode JPEG files on the GPU" in gpu.explain()


@needs_gpu_decode
def test_gpu_decoding_skips_corrupt_files_as_the_host_does(bad_root):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        host = dnn.data.ImageFolder(bad_root, image_size=8, train=False, resize_on="device", decoder="pillow")
        gpu = dnn.data.ImageFolder(bad_root, image_size=8, train=False, decoder="nvimgcodec")
        n = len(gpu)
        a, b = batch(gpu, n, False), batch(host, n, False)
    _compare(a, b, ~gpu_rows(gpu))
    assert set(gpu.skipped()) == set(host.skipped()) == {"ant/img00x.jpg", "bee/img01x.jpg", "cow/img02x.png"}
    assert "skipped files: 3" in gpu.explain()


@needs_gpu_decode
def test_auto_tries_gpu_decoding_and_explains_the_measured_choice(root):
    f = dnn.data.ImageFolder(root, image_size=10, resize_on="auto")
    assert f.places == ("device", "host", "device_resize", "device_decode") and f.gpu_decoding[0] is True
    feed = f.feed()
    out = dmath.zeros((6, f.features), dtype="float32", layout=dmath.RowBlock())
    for epoch in range(8):            # 4 places x 4 read-ahead batches, and the first of each epoch
        feed.start_epoch((epoch,), epoch)
        for _ in range(len(f) // 6):
            feed.batch_x(out, True, 1)
            feed.advance(6)
    assert np.isfinite(out.to_numpy()).all()
    text = f.explain()
    assert "GPU decoding: a candidate" in text and "device_decode:" in text
    assert all(p["place"] in f.places for rep in f.stats() for p in rep["pipelines"])


@needs_gpu_decode
def test_cuda_gather_kernel_equals_numpy():
    import cupy
    rng = np.random.default_rng(2)
    host, views, dev = [], [], []
    for h, w, pad in ((31, 17, 5), (224, 300, 0), (8, 8, 13), (50, 37, 1)):
        big = rng.integers(0, 256, size=(h, w + pad, 3)).astype(np.uint8)
        d = cupy.asarray(big)[:, :w]              # rows with a pitch wider than the image, as decoders pad
        host.append(big[:, :w])
        dev.append(d)
        views.append((d.data.ptr, d.strides[0], h, w))
    boxes = [(2, 3, 15, 30), (0, 0, 300, 224), (7, 7, 8, 8), (5, 9, 36, 50)]
    table, end = gpu_decode.gather_table(views, boxes, 40)
    packed = cupy.zeros(end + 9, dtype=cupy.uint8)
    gpu_decode.gather(packed, cupy.asarray(table), 40, end)
    ref = gpu_decode.gather_reference(host, table, np.zeros(end + 9, dtype=np.uint8))
    np.testing.assert_array_equal(cupy.asnumpy(packed), ref)
    assert ref[40:end].any()


@needs_gpu_decode
def test_fit_from_gpu_decoded_folder(root):
    dmath.random.seed(3)
    model = dnn.Sequential([L.Input((3, 12, 12)), L.Conv2D(4, 3, padding="same"), L.Activation("relu"),
                            L.Pool2D(2), L.Flatten(), L.Dense(3), L.Output("softmax")],
                           optimizer=dnn.optim.SGD(lr=0.05, momentum=0.9), dtype="float32")
    train = dnn.data.ImageFolder(root, image_size=12, decoder="nvimgcodec")
    hist = model.fit(train, batch_size=12, epochs=2, verbose=0).history
    assert all(np.isfinite(hist["loss"]))
    pipes = [p for rep in train.stats() for p in rep["pipelines"]]
    assert pipes and all(p["place"] == "device_decode" for p in pipes)
    assert sum(p["decoded_on"]["gpu"] for p in pipes) > 0
