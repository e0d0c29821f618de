"""GPU decoding of image folders, the parts that need no GPU: where libnvjpeg is found for nvImageCodec,
when the place 'device_decode' is a candidate (and the errors of decoder='nvimgcodec'), the table that
gathers GPU-decoded crops into the packed batch, the source's file bytes and crop geometry, and the
tuner keeping GPU decoding only where it measures faster."""
import io
import json

import numpy as np
import pytest
from PIL import Image

from dmath.gpu import nvimgcodec
from dmath.ops import gpu_decode, resize
from dmath.planning.host_stages import Tuner
from dnn.data import augment
from dnn.data.decode import FolderSource
from dnn.data.image_folder import _gpu_decoding, _places, scan
from dnn.errors import ConfigError

from _images import make_folder


# ---- finding libnvjpeg ------------------------------------------------------------------------------
def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_nvjpeg_of_the_installed_nvimgcodec_is_found_under_the_nvidia_packages(tmp_path):
    site, other = tmp_path / "site", tmp_path / "other"
    cu13 = _touch(site / "nvidia" / "cu13" / "lib" / "libnvjpeg.so.13")
    cu12 = _touch(other / "nvidia" / "nvjpeg" / "lib" / "libnvjpeg.so.12")
    _touch(other / "nvidia" / "nvjpeg" / "lib" / "libnvjpeg.so.12.4.0")       # (the first of a major is kept)
    _touch(site / "nvidia" / "cu13" / "lib" / "libnvjpeg2k.so.0")             # (another library)
    _touch(site / "nvidia" / "cu13" / "include" / "nvjpeg.h")
    paths = [site, other]
    assert nvimgcodec.nvimgcodec_cuda_major(paths) is None
    # the wheel's CUDA major decides: nvImageCodec opens libnvjpeg.so.<major> and no other
    (site / "nvidia_nvimgcodec_cu13-0.9.0.20.dist-info").mkdir()
    assert nvimgcodec.nvimgcodec_cuda_major(paths) == 13
    assert nvimgcodec.nvjpeg_libraries(paths, 13) == [str(cu13)]
    assert nvimgcodec.nvjpeg_libraries(paths, 12) == [str(cu12)]
    assert nvimgcodec.nvjpeg_libraries(paths, 11) == []
    # unknown major: one file per major, in order
    assert nvimgcodec.nvjpeg_libraries(paths) == [str(cu12), str(cu13)]
    assert nvimgcodec.nvjpeg_libraries([tmp_path / "missing"]) == []


def test_preloading_passes_over_a_file_that_does_not_load(tmp_path):
    _touch(tmp_path / "nvidia" / "nvjpeg" / "lib" / "libnvjpeg.so.12")      # an empty file: not a library
    assert nvimgcodec.preload_nvjpeg([tmp_path, tmp_path / "missing", ""]) == []


def test_nvimgcodecs_parser_takes_rgb_and_grey_jpeg_files_only():
    mod = nvimgcodec.module()
    if mod is None:
        pytest.skip(nvimgcodec._state["why"])
    a = np.random.default_rng(0).integers(0, 256, size=(37, 53, 3)).astype(np.uint8)

    def encoded(mode, fmt):
        out = io.BytesIO()
        Image.fromarray(a).convert(mode).save(out, format=fmt)
        return out.getvalue()
    assert nvimgcodec.parse(mod, encoded("RGB", "JPEG"))[1:] == (53, 37)
    assert nvimgcodec.parse(mod, encoded("L", "JPEG"))[1:] == (53, 37)
    assert nvimgcodec.parse(mod, nvimgcodec._PROBE)[1:] == (16, 16)
    for data in (encoded("CMYK", "JPEG"), encoded("RGB", "PNG"), b"\xff\xd8" + bytes(40) + b"\xff\xd9", b""):
        assert nvimgcodec.parse(mod, data) is None


# ---- when the GPU decodes ---------------------------------------------------------------------------
def _status(ok, why="nvImageCodec 0.9 on GPU 0"):
    calls = []

    def status():
        calls.append(1)
        return ok, why
    return status, calls


@pytest.mark.parametrize("decoder,normalize_on,resize_on,gpu,ok,expect,asked", [
    ("auto", "auto", "auto", True, True, True, True),
    ("auto", "auto", "device", True, True, True, True),
    ("auto", "device", "auto", True, False, False, True),          # not installed: why says what to install
    ("auto", "auto", "host", True, True, False, False),            # the default resize_on keeps Pillow's pixels
    ("auto", "host", "auto", True, True, False, False),
    ("auto", "auto", "auto", False, True, False, False),           # the CPU backend
    ("pillow", "auto", "auto", True, True, False, False),
    ("simplejpeg", "auto", "auto", True, True, False, False),
    ("nvimgcodec", "auto", "host", True, True, "only", True),      # an explicit decoder wins over resize_on
    ("nvimgcodec", "device", "auto", True, True, "only", True)])
def test_gpu_decoding_is_a_candidate_where_it_can_run_and_the_resize_may_follow(decoder, normalize_on, resize_on,
                                                                                gpu, ok, expect, asked):
    status, calls = _status(ok, "the reason" if not ok else "nvImageCodec 0.9 on GPU 0")
    got, why = _gpu_decoding(decoder, normalize_on, resize_on, gpu, status)
    assert got == expect and bool(calls) == asked and why
    if not ok and asked:
        assert why == "the reason"
    places = _places(normalize_on, resize_on, gpu, got)
    assert ("device_decode" in places) == bool(got)
    if got == "only":
        assert places == ("device_decode",)


@pytest.mark.parametrize("normalize_on,gpu,ok,match", [
    ("auto", False, True, "GPU backend"), ("host", True, True, "contradicts"),
    ("auto", True, False, "cannot decode here: pip install")])
def test_decoder_nvimgcodec_where_it_cannot_run_is_a_config_error(normalize_on, gpu, ok, match):
    status, _ = _status(ok, "pip install 'nvidia-nvimgcodec-cu12[nvjpeg]'")
    with pytest.raises(ConfigError, match=match):
        _gpu_decoding("nvimgcodec", normalize_on, "host", gpu, status)


def test_the_tuner_keeps_gpu_decoding_only_where_it_measures_faster():
    places = ("device", "host", "device_decode")
    for cost, best in (({"device": 0.004, "host": 0.006, "device_decode": 0.001}, "device_decode"),
                       ({"device": 0.004, "host": 0.006, "device_decode": 0.009}, "device")):
        t = Tuner(2, places, max_threads=2)
        for _ in range(40):
            t.record(32, 0.1, 0.0, cost[t.place], 0.05)
        assert t.place == best and "device_decode:" in t.log[0]


# ---- the gather of GPU-decoded crops ------------------------------------------------------------------
def test_gather_table_packs_the_crops_after_the_host_regions():
    rng = np.random.default_rng(0)
    imgs = [rng.integers(0, 256, size=(h, w, 3)).astype(np.uint8) for h, w in ((9, 7), (20, 31), (5, 5))]
    boxes = [(1, 2, 6, 9), (0, 0, 31, 20), (2, 1, 3, 4)]           # (left, top, right, bottom)
    views = [(1000 * (k + 1), img.shape[1] * 3 + 16, img.shape[0], img.shape[1]) for k, img in enumerate(imgs)]
    table, end = gpu_decode.gather_table(views, boxes, 100)
    sizes = [(b - t) * (r - l) * 3 for l, t, r, b in boxes]
    assert table.dtype == np.int64 and table.shape == (3, len(gpu_decode.GATHER))
    assert table[:, 6].tolist() == [100, 100 + sizes[0], 100 + sizes[0] + sizes[1]] and end == 100 + sum(sizes)
    assert table[:, 0].tolist() == [1000, 2000, 3000] and table[:, 1].tolist() == [v[1] for v in views]
    packed = gpu_decode.gather_reference(imgs, table, np.zeros(end, dtype=np.uint8))
    for img, (l, t, r, b), off in zip(imgs, boxes, table[:, 6]):
        np.testing.assert_array_equal(packed[off:off + (b - t) * (r - l) * 3].reshape(b - t, r - l, 3),
                                      img[t:b, l:r])
    assert not packed[:100].any()
    assert gpu_decode.gather_table([], [], 7)[1] == 7


# ---- what the source hands over ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = make_folder(tmp_path_factory.mktemp("folder"), per_class=8)
    good = (root / "bee" / "img01.jpg").read_bytes()
    (root / "bee" / "img01t.jpg").write_bytes(good[:len(good) // 2])
    (root / "cow" / "img00x.jpg").write_bytes(b"\xff\xd8" + bytes(40) + b"\xff\xd9")   # SOI ... EOI, no image
    _, files, labels, _ = scan(str(root))
    desc = {"root": str(root), "files": files, "labels": labels, "image_size": [10, 12], "resize_size": 14,
            "crop_scale": [0.08, 1.0], "crop_ratio": [0.75, 4 / 3], "flip": True, "on_error": "skip",
            "batch_transform": None, "decoder": "nvimgcodec"}
    return FolderSource(json.dumps(desc).encode())


def test_only_whole_jpeg_files_are_handed_to_the_gpu(source):
    for i, f in enumerate(source.files):
        data = source.encoded(i)
        whole_jpeg = f.endswith(".jpg") and not f.endswith("t.jpg")
        assert (data is not None) == whole_jpeg, f
        if data is not None:
            assert data == open(f"{source.root}/{f}", "rb").read()


def test_geometry_draws_what_region_crops(source):
    """region() (the host's decoded crop) is the image cropped to geometry()'s box, with the same
    resampling geometry, for training draws and the evaluation transform."""
    for i, f in enumerate(source.files):
        if f.endswith(("t.jpg", "x.jpg")):
            continue
        img = np.asarray(Image.open(f"{source.root}/{f}").convert("RGB"))
        for random, stream in ((True, 3 * i + 1), (False, 0)):
            pix, geom = source.region(i, stream, random, 5)
            (left, top, right, bottom), geom2 = source.geometry(img.shape[1], img.shape[0], stream, random, 5)
            assert geom == geom2
            np.testing.assert_array_equal(pix, img[top:bottom, left:right])
            if random:
                box, mirrored = augment.train_draws(img.shape[1], img.shape[0], augment.sample_generator(5, stream),
                                                    (0.08, 1.0), (0.75, 4 / 3), True)
                assert (box, geom[4]) == ((left, top, right, bottom), mirrored) and geom[:4] == (10, 12, 0, 0)
            else:
                assert (left, top, right, bottom) == (0, 0, img.shape[1], img.shape[0])
                assert min(geom[0], geom[1]) == 14 and geom[2] + 10 <= geom[0] and geom[3] + 12 <= geom[1]
    assert len(resize.GEOM) == 8
