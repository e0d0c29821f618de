"""ImageFolder's files, the parts that need no workers: the folder scan refuses symlink loops and
folders reached twice and leaves out what is not a regular file, and the decoder scales 16-bit images
to 8 bits (not clipped), refuses pixel formats it cannot map to RGB, and refuses a FIFO at once instead
of blocking on it."""
import os

import numpy as np
import pytest
from PIL import Image

from dnn.data import DataError
from dnn.data.decode import decode_rgb
from dnn.data.image_folder import scan


def _images(folder, n=2, value=0):
    os.makedirs(folder, exist_ok=True)
    for i in range(n):
        Image.new("RGB", (4, 4), (value + i, 0, 0)).save(os.path.join(folder, f"{i}.png"))


@pytest.fixture
def root(tmp_path):
    for c in ("cat", "dog"):
        _images(tmp_path / "root" / c)
    return tmp_path / "root"


# ---- the scan --------------------------------------------------------------------------------------
@pytest.mark.parametrize("link,target,names", [
    ("cat/loop", ".", "'cat/loop'.*'cat'"),              # the class folder itself
    ("cat/up", "..", "'cat/up'.*the root folder"),        # the root: every class under this one
    ("cat/a/b/top", "../..", "'cat/a/b/top'.*'cat'"),     # an ancestor further up
    ("cat/a/self", ".", "'cat/a/self'.*'cat/a'")])
def test_symlink_loops_are_refused_naming_the_link(root, link, target, names):
    os.makedirs(root / os.path.dirname(link), exist_ok=True)
    os.symlink(target, root / link)
    with pytest.raises(DataError, match=f"{names}.*a folder that contains it"):
        scan(str(root))


@pytest.mark.parametrize("links", [
    {"cat/dogs": "../dog"},                                        # into another class: two labels
    {"cat/x": "../../extra", "cat/y": "../../extra"},              # one folder outside, twice
    {"cat/x": "../../extra", "dog/x": "../../extra"},
    {"kitten": "cat"}])                                            # a class that is another class
def test_a_folder_reached_twice_is_refused(root, links):
    _images(root.parent / "extra")
    for link, target in links.items():
        os.symlink(target, root / link)
    with pytest.raises(DataError, match="are one folder .* would be read twice"):
        scan(str(root))


def test_links_to_other_folders_are_followed_once(root):
    """torchvision follows links to folders; one outside the class that is no ancestor still is."""
    _images(root.parent / "extra", value=10)
    _images(root.parent / "extra2" / "deeper", value=20)
    os.symlink("../../extra", root / "cat" / "more")
    os.symlink("../../extra2/deeper", root / "dog" / "deep")
    os.symlink("0.png", root / "dog" / "same.png")                 # a link to a file is a sample
    classes, files, labels, others = scan(str(root))
    assert classes == ["cat", "dog"] and others == []
    assert list(zip(files, labels)) == [
        ("cat/0.png", 0), ("cat/1.png", 0), ("cat/more/0.png", 0), ("cat/more/1.png", 0),
        ("dog/0.png", 1), ("dog/1.png", 1), ("dog/same.png", 1), ("dog/deep/0.png", 1), ("dog/deep/1.png", 1)]


def test_the_order_stays_torchvisions(root):
    """Folders in the sorted order of their paths ('cat/a b' before 'cat/a/x', as sorted(os.walk) has
    them), the files of each sorted."""
    for sub in ("a", "a b", "a/x", "b"):
        _images(root / "cat" / sub, n=1)
    _, files, _, _ = scan(str(root))
    expect = []
    for dirpath, _, names in sorted(os.walk(root / "cat")):
        expect += [os.path.relpath(os.path.join(dirpath, n), root) for n in sorted(names)]
    assert files[:len(expect)] == expect and files[2:5] == ["cat/a/0.png", "cat/a b/0.png", "cat/a/x/0.png"]


def test_what_is_not_a_regular_file_is_no_sample(root):
    """A FIFO named like an image (its reader would block forever), a broken link: not samples, listed
    with the other files that are not images."""
    os.mkfifo(root / "cat" / "x.jpg")
    os.symlink("nowhere.png", root / "dog" / "broken.png")
    (root / "dog" / "notes.txt").write_text("x")
    _, files, _, others = scan(str(root))
    assert files == ["cat/0.png", "cat/1.png", "dog/0.png", "dog/1.png"]
    assert others == ["cat/x.jpg", "dog/broken.png", "dog/notes.txt"]


# ---- decoding ------------------------------------------------------------------------------------
GRADIENT = np.linspace(0, 65535, 16 * 16).reshape(16, 16).astype(np.uint16)


def test_16_bit_grayscale_png_is_scaled_not_clipped(tmp_path):
    """A 16-bit PNG (Pillow's mode I;16) gives the pixels of its high bytes, as Pillow gives 16-bit colour
    PNGs: the same as the 8-bit image (convert('RGB') clipped every value above 255 to white)."""
    Image.fromarray(GRADIENT).save(tmp_path / "g16.png")
    Image.fromarray((GRADIENT >> 8).astype(np.uint8)).save(tmp_path / "g8.png")
    assert Image.open(tmp_path / "g16.png").mode == "I;16"
    got = np.asarray(decode_rgb(str(tmp_path / "g16.png")))
    want = np.asarray(decode_rgb(str(tmp_path / "g8.png")))
    assert got.shape == (16, 16, 3) and got.dtype == np.uint8
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[..., 1], GRADIENT >> 8)


def test_32_bit_integer_images_are_read_as_16_bit_when_they_fit(tmp_path):
    """Mode 'I' (32-bit integers: a TIFF, or an older Pillow's 16-bit PNG) within 0..65535 is 16-bit;
    values outside it have no 8-bit meaning: refused."""
    Image.fromarray(GRADIENT.astype(np.int32)).save(tmp_path / "i.tif")
    assert Image.open(tmp_path / "i.tif").mode == "I"
    np.testing.assert_array_equal(np.asarray(decode_rgb(str(tmp_path / "i.tif")))[..., 0], GRADIENT >> 8)
    for bad in (GRADIENT.astype(np.int32) * 2, GRADIENT.astype(np.int32) - 1):
        Image.fromarray(bad).save(tmp_path / "bad.tif")
        with pytest.raises(DataError, match="32-bit integer pixels.*outside 0..65535"):
            decode_rgb(str(tmp_path / "bad.tif"))


def test_float_images_are_refused(tmp_path):
    """Mode 'F' (32-bit floats, e.g. a TIFF named .png): no convention says what 0.0 and 1.0 (or 255) are."""
    Image.fromarray(np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)).save(tmp_path / "f.tif")
    with pytest.raises(DataError, match="floating-point pixels .*mode 'F'.* not supported"):
        decode_rgb(str(tmp_path / "f.tif"))


@pytest.mark.timeout(30, method="signal")      # (a hang fails the test, not the run)
def test_a_fifo_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "x.jpg")
    with pytest.raises(OSError, match="not a regular file"):
        decode_rgb(str(tmp_path / "x.jpg"))


# ---- the reader ------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [0, 1, 65536, 3 << 20])
def test_read_regular_returns_the_whole_file(tmp_path, size):
    from dmath.ops.files import read_regular
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    assert read_regular(str(tmp_path / "f")) == data


def test_read_regular_refuses_a_fifo_and_a_folder_at_once(tmp_path):
    from dmath.ops.files import NotRegularFile, read_regular
    os.mkfifo(tmp_path / "p.jpg")
    for path in (tmp_path / "p.jpg", tmp_path):
        with pytest.raises(NotRegularFile, match="not a regular file"):
            read_regular(str(path))


def test_read_regular_reads_to_the_end_of_a_file_grown_since_its_size_was_taken(tmp_path, monkeypatch):
    """fstat said 10 bytes, the file holds 25 by the read: all 25 come back (a short first read is
    read on the same way)."""
    from dmath.ops import files
    (tmp_path / "f").write_bytes(b"x" * 25)
    real = os.fstat

    class Small:
        def __init__(self, st):
            self.st_mode, self.st_size = st.st_mode, 10
    monkeypatch.setattr(files.os, "fstat", lambda fd: Small(real(fd)))
    assert files.read_regular(str(tmp_path / "f")) == b"x" * 25


def test_an_empty_file_is_named_so_and_a_huge_one_is_not_read(tmp_path, monkeypatch):
    from dnn.data import decode
    (tmp_path / "e.jpg").write_bytes(b"")
    with pytest.raises(ValueError, match="e.jpg: an empty file"):
        decode_rgb(str(tmp_path / "e.jpg"))
    monkeypatch.setattr(decode, "IMAGE_FILE_BYTES", 1000)
    with open(tmp_path / "big.jpg", "wb") as f:
        f.truncate(1001)                 # (sparse: nothing is written, a read would return 1001 zeros)
    with pytest.raises(OSError, match="1,001 bytes, more than the 1,000"):
        decode_rgb(str(tmp_path / "big.jpg"))

