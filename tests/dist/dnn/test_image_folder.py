"""dnn.data.ImageFolder at every worker count: classes, labels and order as torchvision's ImageFolder,
batches decoded by the workers equal to a Pillow/NumPy reference (evaluation transform, and the
training transform for the draws a sample's (seed, stream) fixes), the same batches at any worker
count, thread count and normalisation place, corrupt files skipped, and training through fit,
evaluate, predict, asynchronous SGD and search."""
import os
import warnings

import numpy as np
import pytest
from PIL import Image

import dmath
import dnn
from dmath.ops import host_batches
from dmath.ops.nn.batch import permutation_values
from dnn import layers as L
from dnn.data import augment, decode
from dnn.data.errors import DataError
from dnn.errors import ConfigError

from _images import CLASSES, make_folder, negate_even

P = dmath.num_workers()
MEAN, STD = np.array(augment.IMAGENET_MEAN), np.array(augment.IMAGENET_STD)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return make_folder(tmp_path_factory.mktemp("folder"))


@pytest.fixture(scope="module")
def bad_root(tmp_path_factory):
    """The folder with a corrupt JPEG, a truncated JPEG, a text file named .png and a notes.txt."""
    r = make_folder(tmp_path_factory.mktemp("bad"), per_class=8, seed=1)
    (r / "ant" / "img00x.jpg").write_bytes(os.urandom(500))
    good = (r / "bee" / "img01.jpg").read_bytes()
    (r / "bee" / "img01x.jpg").write_bytes(good[:len(good) // 2])
    (r / "cow" / "img02x.png").write_text("not an image")
    (r / "cow" / "notes.txt").write_text("a README among the images")
    return r


# ---- references ----------------------------------------------------------------------------
def normalised(pixels):
    """(H, W, 3) uint8 -> the flat (3*H*W,) float64 row of (v / 255 - mean) / std in CHW order."""
    return ((pixels.astype(np.float64) / 255 - MEAN) / STD).transpose(2, 0, 1).reshape(-1)


def rgb(path):
    return Image.open(path).convert("RGB")


def ref_eval(path, size, resize):
    img = rgb(path)
    w, h = img.size
    nw, nh = (resize, int(resize * h / w)) if w <= h else (int(resize * w / h), resize)
    img = img.resize((nw, nh), Image.BILINEAR)
    top, left = int(round((nh - size) / 2)), int(round((nw - size) / 2))
    return normalised(np.asarray(img)[top:top + size, left:left + size])


def ref_train(path, size, seed, stream):
    img = rgb(path)
    box, mirrored = augment.train_draws(img.size[0], img.size[1], augment.sample_generator(seed, stream),
                                        (0.08, 1.0), (3 / 4, 4 / 3), True)
    left, top, right, bottom = box
    a = np.asarray(img)[top:bottom, left:right]
    a = np.asarray(Image.fromarray(a).resize((size, size), Image.BILINEAR))
    return normalised(a[:, ::-1] if mirrored else a)


def batch(folder, rows, training, *, key=None, epoch=0, seed=0, dtype="float64", skip=0):
    """Rows `rows` of the epoch's order, decoded by the workers (RowBlock over all of them)."""
    feed = folder.feed()
    feed.start_epoch(key, epoch, skip=skip)
    out = dmath.zeros((rows, folder.features), dtype=dtype, layout=dmath.RowBlock())
    feed.batch_x(out, training, seed)
    got = out.to_numpy()
    return got, feed


# ---- the folder ------------------------------------------------------------------------------
def test_classes_labels_and_order_follow_torchvision(root):
    f = dnn.data.ImageFolder(root, image_size=12)
    assert f.classes == list(CLASSES) and f.class_to_idx == {c: k for k, c in enumerate(CLASSES)}
    assert len(f) == 60 and f.features == 3 * 12 * 12
    expect = []
    for k, c in enumerate(CLASSES):
        for dirpath, dirnames, names in sorted(os.walk(root / c)):
            dirnames.sort()
            expect += [(os.path.relpath(os.path.join(dirpath, n), root), k) for n in sorted(names)]
    assert list(zip(f.files, f.targets)) == expect
    assert f.y.to_numpy().reshape(-1).tolist() == f.targets
    assert f.ignored == []


def test_eval_batches_equal_pillow_reference_at_any_worker_count(root):
    f = dnn.data.ImageFolder(root, image_size=12, train=False)
    got, _ = batch(f, 60, False)
    ref = np.stack([ref_eval(root / p, 12, 14) for p in f.files])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_training_batches_follow_the_fixed_draws_of_each_sample(root):
    f = dnn.data.ImageFolder(root, image_size=10)
    n = len(f)
    key, epoch, seed = (5, 1), 2, 11
    got, _ = batch(f, 24, True, key=key, epoch=epoch, seed=seed, skip=6)
    order = permutation_values(n, key).astype(int)
    # row i is sample order[6 + i], the (epoch * n + 6 + i)-th sample drawn
    ref = np.stack([ref_train(root / f.files[order[6 + i]], 10, seed, epoch * n + 6 + i) for i in range(24)])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("threads,place", [(1, "device"), (3, "host"), (2, "auto")])
def test_threads_and_the_normalisation_place_change_no_value(root, threads, place):
    base = dnn.data.ImageFolder(root, image_size=10, threads=1, normalize_on="device")
    other = dnn.data.ImageFolder(root, image_size=10, threads=threads, normalize_on=place)
    assert other.places == {"device": ("device",), "host": ("host",), "auto": ("device", "host")}[place]
    for dtype in ("float32", "float16"):
        a, _ = batch(base, 30, True, key=(3,), seed=2, dtype=dtype)
        b, _ = batch(other, 30, True, key=(3,), seed=2, dtype=dtype)
        np.testing.assert_array_equal(a, b)


def two_pass(img, w, h):
    """Pillow's bilinear resize to (w, h) as upstream Pillow computes it: the rows first (rounded to
    uint8), then the columns; each single-axis resize is Pillow's own."""
    return img.resize((w, img.size[1]), Image.BILINEAR).resize((w, h), Image.BILINEAR)


def ref_device(path, size, train, seed=0, stream=0):
    """The device resize's batch row of one file: Pillow's two passes in upstream order."""
    img = rgb(path)
    if train:
        box, mirrored = augment.train_draws(img.size[0], img.size[1], augment.sample_generator(seed, stream),
                                            (0.08, 1.0), (3 / 4, 4 / 3), True)
        a = np.asarray(two_pass(img.crop(box), size, size))
        return normalised(a[:, ::-1] if mirrored else a)
    w, h = augment.resize_shorter(img.size[0], img.size[1], int(round(size / 0.875)))
    left, top, right, bottom = augment.center_crop_box(w, h, (size, size))
    return normalised(np.asarray(two_pass(img, w, h))[top:bottom, left:right])


#: one grey level after the normalisation
GREY = 1 / 255 / min(augment.IMAGENET_STD)


@pytest.mark.parametrize("train", [True, False])
def test_device_resize_gives_pillows_pixels(root, train):
    host = dnn.data.ImageFolder(root, image_size=10, train=train, resize_on="host")
    dev = dnn.data.ImageFolder(root, image_size=10, train=train, resize_on="device")
    auto = dnn.data.ImageFolder(root, image_size=10, train=train, resize_on="auto")
    gpu = dmath.device() == "gpu"
    # (on a GPU with nvImageCodec, resize_on='auto' lets the tuner try GPU decoding too)
    on_gpu = ("device_resize",) + (("device_decode",) if host_batches.gpu_decode_status()[0] else ())
    # (resize_on='device' lets GPU decoding be tried too: both resize on the device)
    assert dev.places == (on_gpu if gpu else ("device_resize",))
    assert auto.places == ("device", "host") + (on_gpu if gpu else ())
    got, _ = batch(dev, 30, train, key=(4,), epoch=1, seed=3)
    order = permutation_values(len(dev), (4,)).astype(int)
    ref = np.stack([ref_device(root / dev.files[order[i]], 10, train, 3, len(dev) + i) for i in range(30)])
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    # the host's Pillow may resample the columns first (a build that picks the cheaper order): one grey level
    for dtype in ("float64", "float32", "float16"):
        a, _ = batch(host, 30, train, key=(4,), epoch=1, seed=3, dtype=dtype)
        b, _ = batch(dev, 30, train, key=(4,), epoch=1, seed=3, dtype=dtype)
        assert np.abs(a.astype(np.float64) - b).max() <= GREY * 1.01
    assert {p["place"] for rep in dev.stats() for p in rep["pipelines"]} == {"device_resize"}


def test_resize_equals_pillow_on_random_images():
    """dmath.ops.resize's NumPy reference equals Pillow's own resampling (the rows, then the columns)
    of random images, enlarging and shrinking, and a mirrored crop of it."""
    from dmath.ops import resize
    rng = np.random.default_rng(0)
    for (h, w), (fh, fw) in (((37, 53), (10, 12)), ((10, 7), (37, 30)), ((64, 64), (64, 64)), ((5, 3), (2, 9)),
                             ((300, 451), (224, 224)), ((375, 500), (256, 341)), ((40, 12), (2, 4))):
        pix = rng.integers(0, 256, size=(h, w, 3)).astype(np.uint8)
        ref = np.asarray(two_pass(Image.fromarray(pix), fw, fh))
        np.testing.assert_array_equal(resize.resize_one(pix, fh, fw, 0, 0, fh, fw, False), ref)
        oy, ox = fh // 3, fw // 4
        np.testing.assert_array_equal(resize.resize_one(pix, fh, fw, oy, ox, fh - oy, fw - ox, True),
                                      ref[oy:, ox:][:, ::-1])
        # and within one grey level of this Pillow's resize in one call (whatever order it takes)
        one = np.asarray(Image.fromarray(pix).resize((fw, fh), Image.BILINEAR)).astype(int)
        assert np.abs(one - ref).max() <= 1


@pytest.mark.skipif(dmath.device() != "gpu", reason="the CUDA resize kernel needs a GPU")
def test_cuda_resize_kernel_equals_numpy():
    import cupy
    from dmath.ops import resize
    rng = np.random.default_rng(1)
    shapes = [(31, 17), (224, 300), (8, 8), (500, 375)]
    imgs = [rng.integers(0, 256, size=(h, w, 3)).astype(np.uint8) for h, w in shapes]
    packed = np.concatenate([i.reshape(-1) for i in imgs])
    offs = np.concatenate([[0], np.cumsum([i.size for i in imgs])[:-1]])
    geom = np.array([[o, h, w, 12, 12, 0, 0, k % 2] for k, (o, (h, w)) in enumerate(zip(offs, shapes))] +
                    [[offs[3], 500, 375, 14, 18, 1, 2, 0]], dtype=np.int64)
    mean = np.array(MEAN * 255, dtype=np.float32).reshape(1, 3, 1, 1)
    inv = (1 / (np.array(STD) * 255)).astype(np.float32).reshape(1, 3, 1, 1)
    for dtype in (np.float32, np.float16):
        ref = resize.resize_batch(np, packed, geom, np.empty((5, 3, 12, 12), dtype), mean, inv)
        got = resize.resize_batch(cupy, cupy.asarray(packed), cupy.asarray(geom), cupy.empty((5, 3, 12, 12), dtype),
                                  cupy.asarray(mean), cupy.asarray(inv))
        np.testing.assert_array_equal(cupy.asnumpy(got), ref)
    assert not np.all(ref == ref[0])


@pytest.fixture(scope="module")
def colour_root(tmp_path_factory):
    """The folder with a greyscale JPEG and a CMYK JPEG among its RGB ones."""
    r = make_folder(tmp_path_factory.mktemp("colours"), per_class=8, seed=2)
    a = np.asarray(Image.open(r / "ant" / "img01.jpg").convert("RGB"))
    Image.fromarray(a).convert("L").save(r / "bee" / "img01g.jpg", quality=90)
    Image.fromarray(a).convert("CMYK").save(r / "cow" / "img01c.jpg", quality=90)
    return r


@pytest.mark.skipif(decode.simplejpeg is None, reason="simplejpeg is not installed")
def test_simplejpeg_and_pillow_decode_the_same_pixels(root, bad_root, colour_root):
    """Every decoder gives Pillow's pixels: a CMYK JPEG, which simplejpeg converts to RGB by another
    formula (a grey level off), is Pillow's whatever the decoder."""
    cmyk = colour_root / "cow" / "img01c.jpg"
    want = np.asarray(Image.open(cmyk).convert("RGB"))
    for decoder in ("auto", "simplejpeg", "pillow"):
        np.testing.assert_array_equal(np.asarray(decode.decode_rgb(str(cmyk), decoder)), want)
    for r, train in ((root, True), (root, False), (bad_root, False), (colour_root, True)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            a, _ = batch(dnn.data.ImageFolder(r, image_size=10, train=train, decoder="pillow"), 24, train, key=(2,))
            b, _ = batch(dnn.data.ImageFolder(r, image_size=10, train=train, decoder="simplejpeg"), 24, train,
                         key=(2,))
        np.testing.assert_array_equal(a, b)


def test_read_ahead_batches_equal_cold_ones(root):
    """Consecutive batches (the later ones read ahead while the caller runs) equal batches taken
    alone at the same position."""
    f = dnn.data.ImageFolder(root, image_size=8, threads=2)
    feed = f.feed()
    feed.start_epoch((9,), 1)
    out = dmath.zeros((12, f.features), dtype="float64", layout=dmath.RowBlock())
    seen = []
    for _ in range(4):
        feed.batch_x(out, True, 4)
        seen.append(out.to_numpy())
        feed.advance(12)
    for k in range(4):
        cold, _ = batch(dnn.data.ImageFolder(f.root, image_size=8), 12, True, key=(9,), epoch=1, seed=4, skip=12 * k)
        np.testing.assert_array_equal(seen[k], cold)
    text = f.explain()
    assert "threads" in text and "skipped files: 0" in text
    pipes = [p for rep in f.stats() for p in rep["pipelines"]]
    # every batch after the first was read ahead
    assert pipes and all(p["batches"] == 4 and p["read_ahead"] == 3 for p in pipes)
    # evaluation batches too (no draw counter moves with them)
    feed = f.feed()
    feed.start_epoch(None, 0)
    for k in range(5):
        feed.batch_x(out, False, 0)
        ref = [ref_eval(os.path.join(f.root, p), 8, 9) for p in f.files[12 * k:12 * k + 12]]
        np.testing.assert_allclose(out.to_numpy(), ref, rtol=1e-12, atol=1e-12)
        feed.advance(12)
    evals = [p for rep in f.stats() for p in rep["pipelines"] if not p["random"]]
    assert evals and all(p["batches"] == 5 and p["read_ahead"] == 4 for p in evals)


@pytest.mark.parametrize("depth", [2, 3])
def test_deeper_read_ahead_gives_the_same_batches(root, depth):
    """DMATH_READ_AHEAD batches read ahead at once, each in its own buffer (with 3: 3 threads and 4
    buffers in turn): the same batches as 1 (the default), through an epoch's end (the guesses past it
    dropped) and a second epoch; the host stage's parts are reported."""
    from dmath.ops.base import dispatch

    def epochs(f):
        feed = f.feed()
        out = dmath.zeros((8, f.features), dtype="float64", layout=dmath.RowBlock())
        seen = []
        for epoch in (1, 2):
            feed.start_epoch((9,), epoch)
            for _ in range(len(f) // 8):
                feed.batch_x(out, True, 4)
                seen.append(out.to_numpy())
                feed.advance(8)
        return seen
    before = dmath.settings.current.read_ahead
    want = epochs(dnn.data.ImageFolder(root, image_size=8, threads=2))
    dispatch("test_read_ahead", scalars=[depth])
    try:
        f = dnn.data.ImageFolder(root, image_size=8, threads=2)
        got = epochs(f)
    finally:
        dispatch("test_read_ahead", scalars=[before])
    assert len(got) == len(want) >= 4
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    pipes = [p for rep in f.stats() for p in rep["pipelines"]]
    steps = len(f) // 8
    # all but each epoch's first batch read ahead
    assert pipes and all(p["batches"] == 2 * steps and p["read_ahead"] == 2 * steps - 2 for p in pipes)
    assert all(isinstance(p["stage_ms_per_batch"], dict) for p in pipes)


def test_batch_transform_runs_on_each_workers_samples(root):
    plain = dnn.data.ImageFolder(root, image_size=8)
    ext = dnn.data.ImageFolder(root, image_size=8, batch_transform=negate_even)
    a, _ = batch(plain, 21, True, key=(1,), epoch=3, seed=5)
    b, _ = batch(ext, 21, True, key=(1,), epoch=3, seed=5)
    sign = np.where((3 * 60 + np.arange(21)) % 2 == 0, -1.0, 1.0)[:, None]
    np.testing.assert_array_equal(b, a * sign)
    # evaluation batches are not extended
    np.testing.assert_array_equal(batch(plain, 9, False)[0], batch(ext, 9, False)[0])


def test_corrupt_truncated_and_non_image_files_are_skipped_and_counted(bad_root):
    with pytest.warns(RuntimeWarning, match="notes.txt"):
        f = dnn.data.ImageFolder(bad_root, image_size=8, train=False)
    assert f.ignored == ["cow/notes.txt"]
    bad = {"ant/img00x.jpg", "bee/img01x.jpg", "cow/img02x.png"}
    assert bad <= set(f.files)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got, _ = batch(f, len(f), False)
    assert set(f.skipped()) == bad
    # the reasons name no memory address (Pillow's message named the BytesIO it read: new at every run)
    assert not any("0x" in why for why in f.skipped().values()), f.skipped()
    for i, p in enumerate(f.files):
        j = i
        while f.files[j] in bad:        # the next file of the class takes its place
            j += 1
        assert f.targets[j] == f.targets[i]
        np.testing.assert_allclose(got[i], ref_eval(bad_root / f.files[j], 8, 9), rtol=1e-12, atol=1e-12)
    assert "skipped files: 3" in f.explain()


def test_a_file_repaired_after_it_was_skipped_is_read_again(tmp_path):
    """A worker that found a file undecodable tried it again only in a new process: a file repaired
    during training stayed skipped on that worker (a hostile-use probe). A changed file is read again."""
    r = make_folder(tmp_path / "repair", per_class=4, seed=3)
    good = r / "ant" / "img01.jpg"
    broken = r / "ant" / "img00x.jpg"
    broken.write_bytes(os.urandom(300))
    f = dnn.data.ImageFolder(r, image_size=8, train=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        batch(f, len(f), False)
    assert set(f.skipped()) == {"ant/img00x.jpg"}
    broken.write_bytes(good.read_bytes())      # repaired (another size: a changed file)
    got, _ = batch(f, len(f), False, epoch=1)
    assert f.skipped() == {}
    i = f.files.index("ant/img00x.jpg")
    np.testing.assert_allclose(got[i], ref_eval(good, 8, 9), rtol=1e-12, atol=1e-12)
    # the GPU decoder's source (encoded()) hands a repaired JPEG to the GPU again
    import json
    src = decode.FolderSource(json.dumps(dict(
        root=str(r), files=["ant/img00x.jpg"], labels=[0], image_size=[8, 8], resize_size=9,
        crop_scale=[0.08, 1.0], crop_ratio=[0.75, 4 / 3], flip=True, on_error="skip")).encode())
    broken.write_bytes(os.urandom(300))
    assert src.encoded(0) is None
    with pytest.warns(RuntimeWarning, match="skipped"), pytest.raises(DataError, match="no file of class 0"):
        src._decoded(0)
    assert src.encoded(0) is None and 0 in src.bad
    broken.write_bytes(good.read_bytes())
    assert src.encoded(0) == good.read_bytes() and not src.bad
    # a worker given no rows says so (it read 'rows 0..-1')
    g = dnn.data.ImageFolder(r, image_size=8, train=False)
    batch(g, 2, False)
    text = g.explain()
    assert "..-1" not in text
    if dmath.num_workers() > 2:
        assert "no rows" in text, text


def test_on_error_raise_refuses_non_images_on_the_master(bad_root):
    with pytest.raises(DataError, match="notes.txt"):
        dnn.data.ImageFolder(bad_root, on_error="raise")
    dmath.zeros((2, 2)).to_numpy()          # the runtime stays usable


@pytest.mark.parametrize("kwargs,match", [
    (dict(image_size=0), "image_size"), (dict(image_size=(3, 4, 5)), "image_size"),
    (dict(on_error="ignore"), "on_error"), (dict(threads=-1), "threads"), (dict(normalize_on="gpu"), "normalize_on"),
    (dict(crop_scale=(0.5, 2)), "crop_scale"), (dict(crop_ratio=(2, 1)), "crop_ratio"), (dict(std=(1, 0, 1)), "std"),
    (dict(mean=(1, 2)), "mean"), (dict(decoder="turbo"), "decoder"), (dict(resize_size=8), "resize_size"),
    (dict(resize_size=(9, 9)), "resize_size"),
    (dict(train="yes"), "train"), (dict(resize_on="gpu"), "resize_on"),
    (dict(resize_on="device", normalize_on="host"), "contradicts"),
    (dict(batch_transform=lambda x, s, xp: x), "module-level"), (dict(batch_transform="nowhere:fn"), "imported")])
def test_bad_arguments_raise_config_errors(root, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        dnn.data.ImageFolder(root, **kwargs)


def test_folders_without_images_raise_data_errors(tmp_path):
    with pytest.raises(DataError, match="cannot list"):
        dnn.data.ImageFolder(tmp_path / "missing")
    with pytest.raises(DataError, match="no class folders"):
        dnn.data.ImageFolder(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    Image.new("RGB", (4, 4)).save(tmp_path / "a" / "x.png")
    with pytest.raises(DataError, match=r"\['b'\]"):
        dnn.data.ImageFolder(tmp_path)


def test_symlink_loops_and_folders_reached_twice_are_refused(tmp_path):
    """A loop (cat/loop -> cat: every image of the class ~40 times; cat/up -> the root: the other classes'
    images labelled cat) and a folder reached twice are refused on the master, naming the links."""
    for c in ("cat", "dog"):
        os.makedirs(tmp_path / c)
        for i in range(2):
            Image.new("RGB", (8, 8), (i * 50, 0, 0)).save(tmp_path / c / f"{i}.png")
    for link, target, words in (("loop", ".", r"'cat/loop'.*leads to 'cat'"),
                                ("up", "..", r"'cat/up'.*leads to the root folder"),
                                ("dogs", "../dog", r"'cat/dogs' and 'dog' .* are one folder")):
        os.symlink(target, tmp_path / "cat" / link)
        with pytest.raises(DataError, match=words):
            dnn.data.ImageFolder(tmp_path, image_size=8, train=False)
        os.remove(tmp_path / "cat" / link)
    f = dnn.data.ImageFolder(tmp_path, image_size=8, train=False)
    assert f.files == ["cat/0.png", "cat/1.png", "dog/0.png", "dog/1.png"] and f.targets == [0, 0, 1, 1]
    dmath.zeros((2, 2)).to_numpy()          # the runtime stays usable


def test_a_fifo_named_like_an_image_is_no_sample(tmp_path):
    """A FIFO named x.jpg in a class folder: left out up front (a warning) or refused (on_error='raise');
    one that takes an image's place after the scan is skipped as an undecodable file, never waited on."""
    for c in ("cat", "dog"):
        os.makedirs(tmp_path / c)
        for i in range(2):
            Image.new("RGB", (8, 8), (200, 50 * i, 0)).save(tmp_path / c / f"{i}.png")
    os.mkfifo(tmp_path / "cat" / "x.jpg")
    with pytest.warns(RuntimeWarning, match=r"1 path\(s\) named like images are not regular files .*'cat/x.jpg'"):
        f = dnn.data.ImageFolder(tmp_path, image_size=8, train=False)
    assert f.files == ["cat/0.png", "cat/1.png", "dog/0.png", "dog/1.png"] and f.ignored == ["cat/x.jpg"]
    with pytest.raises(DataError, match="cat/x.jpg"):
        dnn.data.ImageFolder(tmp_path, image_size=8, train=False, on_error="raise")
    os.remove(tmp_path / "cat" / "x.jpg")
    f = dnn.data.ImageFolder(tmp_path, image_size=8, train=False)
    os.remove(tmp_path / "cat" / "1.png")
    os.mkfifo(tmp_path / "cat" / "1.png")                # (after the scan: the workers meet it)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)       # (the worker that met it warns)
        got, _ = batch(f, 4, False)
    assert list(f.skipped()) == ["cat/1.png"] and "not a regular file" in f.skipped()["cat/1.png"]
    np.testing.assert_array_equal(got[1], got[0])         # the next image of its class took its place


def test_16_bit_png_gives_the_pixels_of_its_8_bit_twin(tmp_path):
    """A 16-bit grayscale PNG is scaled to 8 bits (value >> 8), not clipped to white; a float image in
    an image's name is skipped as undecodable and counted."""
    os.makedirs(tmp_path / "a")
    g = np.linspace(0, 65535, 32 * 32).reshape(32, 32).astype(np.uint16)
    Image.fromarray(g).save(tmp_path / "a" / "grad16.png")
    Image.fromarray((g >> 8).astype(np.uint8)).save(tmp_path / "a" / "grad8.png")
    Image.fromarray(g.astype(np.float32) / 65535).save(tmp_path / "a" / "zfloat.png", format="TIFF")
    f = dnn.data.ImageFolder(tmp_path, image_size=32, resize_size=32, train=False, mean=0, std=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)       # (the worker that met it warns)
        got, _ = batch(f, 3, False)
    assert f.files == ["a/grad16.png", "a/grad8.png", "a/zfloat.png"]
    np.testing.assert_array_equal(got[0], got[1])
    np.testing.assert_allclose(got[1].reshape(3, 32, 32)[0] * 255, g >> 8, atol=1e-9)
    assert list(f.skipped()) == ["a/zfloat.png"] and "floating-point pixels" in f.skipped()["a/zfloat.png"]


def test_random_resized_crop_draws_stay_in_range():
    areas, ratios, flips = [], [], 0
    for s in range(3000):
        rng = augment.sample_generator(3, s)
        (l, t, r, b), m = augment.train_draws(300, 200, rng, (0.08, 1.0), (3 / 4, 4 / 3), True)
        assert 0 <= l < r <= 300 and 0 <= t < b <= 200
        areas.append((r - l) * (b - t) / 60000)
        ratios.append((r - l) / (b - t))
        flips += m
    # rounding to whole pixels moves the share and the ratio a little past the bounds
    assert 0.07 < min(areas) and max(areas) <= 1 and 0.7 < min(ratios) and max(ratios) < 1.4
    # the shares cover the range (a 3:2 image fits at most 0.89 at ratio 4/3; boxes that do not fit are
    # drawn again, so large shares are rarer than uniform)
    assert min(areas) < 0.1 and max(areas) > 0.85 and 0.3 < np.mean(areas) < 0.54 and 1300 < flips < 1700
    # the same (seed, stream) draws the same; a thin image falls back to its central box within the ratios
    assert augment.train_draws(50, 40, augment.sample_generator(1, 2), (0.08, 1), (3 / 4, 4 / 3), True) == \
        augment.train_draws(50, 40, augment.sample_generator(1, 2), (0.08, 1), (3 / 4, 4 / 3), True)
    assert augment.random_resized_crop_box(400, 10, augment.sample_generator(0, 0)) == (193, 0, 206, 10)


# ---- training -------------------------------------------------------------------------------
def small_cnn(dtype="float64", lr=0.05):
    return dnn.Sequential([L.Input((3, 12, 12)), L.Conv2D(4, 3, padding="same"), L.Activation("relu"),
                           L.Pool2D(2), L.Flatten(), L.Dense(3), L.Output("softmax")],
                          optimizer=dnn.optim.SGD(lr=lr, momentum=0.9), dtype=dtype)


def test_fit_evaluate_predict_from_a_folder(root):
    dmath.random.seed(3)
    model = small_cnn()
    train = dnn.data.ImageFolder(root, image_size=12, crop_scale=(0.5, 1.0))
    val = dnn.data.ImageFolder(root, image_size=12, train=False)
    hist = model.fit(train, batch_size=10, epochs=6, validation_data=val, verbose=0).history
    assert hist["loss"][-1] < hist["loss"][0]
    assert hist["val_accuracy"][-1] > 0.8            # class k is brighter in channel k
    ev = model.evaluate(val)
    assert ev["loss"] == pytest.approx(hist["val_loss"][-1], rel=1e-12)
    # predict on the folder equals predict on its decoded evaluation batch as an array
    x = np.stack([ref_eval(root / p, 12, 14) for p in val.files]).reshape(-1, 3, 12, 12)
    np.testing.assert_allclose(model.predict(val), model.predict(x), rtol=1e-9, atol=1e-12)


def test_validation_split_of_a_folder_evaluates_without_augmentation(root):
    dmath.random.seed(1)
    model = small_cnn()
    f = dnn.data.ImageFolder(root, image_size=12)
    first, last = f.split(0.25)
    assert (len(first), len(last), first.train, last.train) == (45, 15, True, False)
    hist = model.fit(f, batch_size=15, epochs=1, validation_split=0.25, verbose=0).history
    assert np.isfinite(hist["val_loss"][0])
    assert model.evaluate(last)["loss"] == pytest.approx(hist["val_loss"][0], rel=1e-12)


@pytest.mark.skipif(P < 2, reason="asynchronous SGD needs two workers")
def test_asynchronous_sgd_from_a_folder(root):
    dmath.random.seed(2)
    model = small_cnn(lr=0.02)
    hist = model.fit(dnn.data.ImageFolder(root, image_size=12), batch_size=6, epochs=2, asynchronous=True,
                     verbose=0).history
    assert all(np.isfinite(hist["loss"]))


def test_search_over_a_folder(root):
    train = dnn.data.ImageFolder(root, image_size=12)
    val = dnn.data.ImageFolder(root, image_size=12, train=False)
    results = dnn.search.grid(lambda p: small_cnn(lr=p["lr"]), {"lr": [0.05, 1e-5]}, train, epochs=3,
                              batch_size=10, validation_data=val, verbose=0)
    assert [r["params"]["lr"] for r in results] == [0.05, 1e-5]
