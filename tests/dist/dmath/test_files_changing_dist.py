"""Files that change or vanish around `dmath.from_file` and `dnn.data.Dataset.from_npy/from_mnist`
(issue 35, item 1), at every worker count.

from_file returns only once every worker has read its pieces (or mapped them), so the file may be
replaced, rewritten or deleted afterwards; a file that is not the version the master checked, or
that changes while the workers read it, raises DMathError on the master and leaves the runtime
usable. Before the fix, from_file returned while the workers were still reading: a replacement
right after it gave a matrix mixing rows of both files, a deleted file a WorkerError, and a
rewrite in place a SIGBUS. (A mapped file that shrinks later: tests/test_failures_files.py.)
"""
import os
import tempfile

import numpy as np
import pytest

import dmath
import dnn
from dmath.ops import files

from _cases import values

P = dmath.num_workers()
LAYOUTS = [dmath.RowBlock(), dmath.Replicated(), dmath.ColBlock(), dmath.BlockCyclic(block=(3, 2))]


def _usable():
    x = values((7, 5), 3)
    np.testing.assert_allclose((dmath.from_numpy(x) * 2.0).to_numpy(), 2 * x, rtol=1e-6)


def _save(path, a):
    """np.save to a new file, then an atomic rename over `path` (how a pipeline publishes a file)."""
    tmp = str(path) + ".new.npy"
    np.save(tmp, a)
    os.replace(tmp, path)


@pytest.mark.parametrize("lay", LAYOUTS, ids=lambda lay: type(lay).__name__)
def test_a_file_replaced_right_after_from_file_returns_is_not_mixed_in(tmp_path, lay):
    path = str(tmp_path / "x.npy")
    for trial in range(8):
        a = np.full((64, 33), float(trial), dtype=np.float32) + np.arange(33, dtype=np.float32)
        _save(path, a)
        m = dmath.from_file(path, layout=lay)
        _save(path, -a - 1)                                   # the next file, at once
        np.testing.assert_array_equal(m.to_numpy(), a)


def test_a_file_rewritten_in_place_right_after_from_file_returns(tmp_path):
    path = str(tmp_path / "x.npy")
    a = values((300, 40), 1).astype(np.float32)
    np.save(path, a)
    m = dmath.from_file(path, layout=dmath.RowBlock())
    with open(path, "r+b") as f:                # truncated, then written again: a mapped reader dies
        f.truncate(0)
        f.flush()
        np.save(f, np.zeros_like(a))
    np.testing.assert_array_equal(m.to_numpy(), a)
    _usable()


def test_a_file_in_a_temporary_directory_outlives_the_block():
    a = values((50, 9), 2)
    with tempfile.TemporaryDirectory() as d:
        np.save(os.path.join(d, "x.npy"), a)
        m = dmath.from_file(os.path.join(d, "x.npy"), dtype="float64", layout=dmath.Replicated())
    np.testing.assert_array_equal(m.to_numpy(), a)
    _usable()


def test_a_mapped_file_replaced_by_a_rename_keeps_the_mapped_version(tmp_path):
    path = str(tmp_path / "x.npy")
    a = values((40, 6), 4).astype(np.float32)
    np.save(path, a)
    m = dmath.from_file(path, layout=dmath.Replicated(), mapped=True)
    _save(path, a[:3] + 1)          # smaller: the mapping still holds the old inode, whole
    np.testing.assert_array_equal(m.to_numpy(), a)
    # (a GPU sums in another order: the last bit may differ)
    np.testing.assert_allclose((m * 1.0).sum(axis=0).to_numpy(), a.sum(axis=0, keepdims=True), rtol=1e-6)


def test_a_mapped_file_rewritten_in_place_is_read_by_every_operation_after(tmp_path):
    """A rewrite in place of the same size is seen on use: also by a product that kept a copy of the
    mapped operand (the replica cache: at 2 workers and more a second X @ M gave the old file)."""
    path = str(tmp_path / "m.npy")
    a = values((8, 8), 6)
    np.save(path, a)
    m = dmath.from_file(path, mapped=True)                  # RowBlock
    x = dmath.from_numpy(np.eye(8), layout=dmath.RowBlock())
    np.testing.assert_allclose((x @ m).to_numpy(), a)
    m.replicate()                                            # a Replicated copy kept on every worker
    b = a + 100.0
    with open(path, "r+b") as f:                             # same size, in place
        f.seek(os.path.getsize(path) - b.nbytes)
        f.write(b.tobytes())
    np.testing.assert_array_equal(m.to_numpy(), b)
    np.testing.assert_allclose((x @ m).to_numpy(), b)
    np.testing.assert_allclose((m.T @ x).to_numpy(), b.T)


def test_a_file_the_system_refuses_to_map_raises_and_the_runtime_goes_on(tmp_path, monkeypatch):
    """A copy-on-write mapping of a file larger than the memory a process may commit is refused by
    the kernel (ENOMEM, Linux's default overcommit rule): the worker's OSError killed the runtime.
    Here the master's own mapping is refused (a worker's report takes the same path)."""
    path = str(tmp_path / "big.npy")
    a = values((40, 6), 11)
    np.save(path, a)

    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")
    with monkeypatch.context() as patch:
        patch.setattr(np, "memmap", refuse)
        with pytest.raises(dmath.OutOfMemoryError,
                           match=r"(?s)could not be mapped.*mapped=False.*worker 0: .*big\.npy"):
            dmath.from_file(path, mapped=True)
    np.testing.assert_array_equal(dmath.from_file(path, mapped=True).to_numpy(), a)
    _usable()


def test_from_file_is_refused_inside_a_record_block(tmp_path):
    """A replay would repeat the workers' reads without the master's check of their reports (a file
    changed since left the matrix unwritten, without a word)."""
    path = str(tmp_path / "r.npy")
    np.save(path, values((6, 4), 7))
    with pytest.raises(dmath.PlanError, match="from_file cannot be recorded"):
        with dmath.record():
            dmath.from_file(path)
    np.testing.assert_array_equal(dmath.from_file(path).to_numpy(), values((6, 4), 7))


def test_a_file_that_is_not_the_version_the_master_checked_is_refused(tmp_path, monkeypatch):
    """Every worker compares the file it opens with the master's stamp (same host: device, inode,
    size, mtime): here the master's stamp is made stale, as when the file is replaced between the
    master's check and the workers' reads."""
    path = str(tmp_path / "x.npy")
    np.save(path, values((20, 4), 5))
    checked = files.check_size

    def stale(spec):
        spec = checked(spec)
        return spec._replace(stamp=spec.stamp[:4] + (spec.stamp[4] - 1,))
    monkeypatch.setattr(files, "check_size", stale)
    with pytest.raises(dmath.DMathError, match=r"changed while the workers read it(.|\n)*worker 0: .*replaced"):
        dmath.from_file(path)
    monkeypatch.undo()
    np.testing.assert_array_equal(dmath.from_file(path, dtype="float64").to_numpy(), values((20, 4), 5))
    _usable()


def test_a_file_modified_while_the_master_reads_it_is_refused(tmp_path, monkeypatch):
    """The master (worker 0) rewrites the file in the middle of its own read: it reports it, the
    call raises and the runtime goes on (the other workers' reads are done by then)."""
    path = str(tmp_path / "x.npy")
    a = values((30, 4), 6).astype(np.float32)
    np.save(path, a)
    read = files._read_piece

    def read_then_touch(f, spec, piece, out):
        read(f, spec, piece, out)
        st = os.stat(spec.path)
        os.utime(spec.path, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
    monkeypatch.setattr(files, "_read_piece", read_then_touch)
    with pytest.raises(dmath.DMathError, match=r"worker 0: .*modified while it was read"):
        dmath.from_file(path, layout=dmath.Replicated())
    monkeypatch.undo()
    np.testing.assert_array_equal(dmath.from_file(path, layout=dmath.Replicated()).to_numpy(), a)


def test_a_short_read_is_reported_not_a_crash(tmp_path):
    """The plain reads of the worker kernel meet the end of a truncated file as an error."""
    path = str(tmp_path / "x.bin")
    with open(path, "wb") as f:
        f.write(b"\0" * 10)
    with open(path, "rb") as f, pytest.raises(files.FileChanged, match="ended at 10 bytes"):
        files._pread(f.fileno(), np.empty(16, np.uint8), 0, path)


def test_wide_integer_files_need_an_explicit_dtype(tmp_path):
    path = str(tmp_path / "i.npy")
    big = np.array([[2 ** 40 + 1, 3], [5, -(2 ** 33) - 7]], dtype=np.int64)
    np.save(path, big)
    with pytest.raises(dmath.DMathError, match=r"int64 values, which float32 may round; pass dtype="):
        dmath.from_file(path)
    np.testing.assert_array_equal(dmath.from_file(path, dtype="float64").to_numpy(), big.astype(np.float64))
    np.save(path, np.arange(6, dtype=np.uint16).reshape(2, 3))      # float32 holds every uint16
    np.testing.assert_array_equal(dmath.from_file(path).to_numpy(), np.arange(6).reshape(2, 3))


WIDE = np.finfo(np.longdouble).max > np.finfo(np.float64).max


@pytest.mark.skipif(not WIDE, reason="long double is float64 on this machine")
def test_long_double_files_need_an_explicit_dtype_whose_range_holds_them(tmp_path):
    """A float128 (long double) .npy is wider than every dmath dtype: refused without dtype=, as
    from_numpy refuses such an array (it defaulted to float32, and 1e300 read as inf with only
    NumPy's warning); with dtype= its values are converted, and one beyond the dtype's range is
    refused instead of read as inf."""
    path = str(tmp_path / "ld.npy")
    a = np.array([[1e300, 1.0], [-2.5, 3.0]], dtype=np.longdouble)
    np.save(path, a)
    with pytest.raises(dmath.DTypeError, match=r"float128 .*long double.*pass dtype="):
        dmath.from_file(path)
    np.testing.assert_array_equal(dmath.from_file(path, dtype="float64").to_numpy(), a.astype(np.float64))
    with pytest.raises(dmath.DMathError, match=r"worker \d+: /\S+ld.npy: the value 1e\+300 at row 0, column 0 lies "
                                               r"beyond the range of float32"):
        dmath.from_file(path, dtype="float32")
    a[1, 1] = np.longdouble("1e4000")                       # beyond float64 too
    np.save(path, a)
    with pytest.raises(dmath.DMathError, match=r"1e\+4000.* row 1, column 1 .*float64"):
        dmath.from_file(path, dtype="float64", layout=dmath.Replicated())
    _usable()


def test_a_converting_read_of_many_bands_gives_every_row():
    """A float64 file read as float32 passes through one staging buffer band by band; a row-cyclic
    layout makes every row a band. On a GPU each band's copy to the device is asynchronous, and the
    next band refilled the staging rows before the copy had read them (rows of later bands in
    earlier places, found at 2 GPUs): every row must be the file's."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.npy")
        a = values((3001, 24), 8)
        np.save(path, a)
        got = dmath.from_file(path, dtype="float32", layout=dmath.BlockCyclic(block=(1, 24))).to_numpy()
        np.testing.assert_array_equal(got, a.astype(np.float32))


@pytest.mark.parametrize("lay", LAYOUTS, ids=lambda lay: type(lay).__name__)
def test_a_value_beyond_the_dtypes_range_is_refused_not_read_as_inf(tmp_path, lay):
    """Converting as they are read, the workers refuse a finite value the matrix's dtype cannot hold
    (it would read as inf); the file's own infinities and NaNs are values, read as they are."""
    path = str(tmp_path / "x.npy")
    a = values((9, 7), 4)
    a[2, 3], a[5, 0], a[0, 6] = np.inf, -np.inf, np.nan
    np.save(path, a)
    np.testing.assert_array_equal(dmath.from_file(path, dtype="float32", layout=lay).to_numpy(),
                                  a.astype(np.float32))
    a[7, 5] = -1e39                                         # beyond float32's 3.4e38
    np.save(path, a)
    with pytest.raises(dmath.DMathError, match=r"worker \d+: /\S+x.npy: the value -1e\+39 at row 7, column 5 lies "
                                               r"beyond the range of float32"):
        dmath.from_file(path, dtype="float32", layout=lay)
    with pytest.raises(dmath.DMathError, match=r"row 7, column 5 .*float16"):
        dmath.from_file(path, dtype="float16", layout=lay)
    raw = str(tmp_path / "u.bin")
    np.array([[1, 65504, 65535]], dtype=np.uint16).tofile(raw)     # float16's largest is 65504
    with pytest.raises(dmath.DMathError, match=r"65535 at row 0, column 2 .*float16"):
        dmath.from_file(raw, shape=(1, 3), file_dtype="uint16", dtype="float16", layout=lay)
    np.testing.assert_array_equal(dmath.from_file(raw, shape=(1, 3), file_dtype="uint16", layout=lay).to_numpy(),
                                  [[1, 65504, 65535]])
    _usable()


@pytest.mark.parametrize("placement", ["host", "mapped"])
def test_dataset_from_npy_replaced_right_after(tmp_path, placement):
    path = str(tmp_path / "x.npy")
    for trial in range(4):
        x = np.full((40, 1, 4, 4), float(trial), dtype=np.float32)
        _save(path, x)
        ds = dnn.data.Dataset.from_npy(path, np.arange(40) % 3, placement=placement)
        _save(path, x + 100)
        np.testing.assert_array_equal(ds._store.x.to_numpy(), x.reshape(40, 16))


def test_dataset_from_mnist_files_removed_right_after(tmp_path):
    from dnn.data.idx import write_idx
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(30, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=30, dtype=np.uint8)
    write_idx(str(tmp_path / "t10k-images-idx3-ubyte"), images)
    write_idx(str(tmp_path / "t10k-labels-idx1-ubyte"), labels)
    ds = dnn.data.Dataset.from_mnist(str(tmp_path), split="test")
    for name in os.listdir(tmp_path):
        os.remove(tmp_path / name)
    np.testing.assert_array_equal(ds._store.x.to_numpy(), images.reshape(30, 784).astype(np.float16))
