"""dmath.gpu.launcher's table argument: the pure chunking rule, and the argument block a table fills."""
import ctypes

import pytest

from dmath.gpu import launcher


def test_table_chunks_cover_every_array_within_a_table():
    for count, words in ((0, 2), (1, 4), (96, 4), (97, 4), (500, 5), (384, 1)):
        chunks = launcher.table_chunks(count, words)
        assert sum(hi - lo for lo, hi in chunks) == count
        assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
        assert all((hi - lo) * words <= launcher.TABLE_WORDS for lo, hi in chunks)
    assert launcher.table_chunks(97, 4) == [(0, 96), (96, 97)]


def test_table_struct_matches_the_slot_size():
    assert f"w[{launcher.TABLE_WORDS}]" in launcher.TABLE_STRUCT
    assert ctypes.sizeof(ctypes.c_uint64 * launcher.TABLE_WORDS) == 8 * launcher.TABLE_WORDS <= 4096 - 256


def test_a_table_longer_than_its_slot_is_refused():
    run = object.__new__(launcher.Launcher)         # no GPU: its slots only (rows() refuses before launching)
    run.slots = [(ctypes.c_uint64 * launcher.TABLE_WORDS)()]
    with pytest.raises(ValueError):
        run.rows(1, 1, list(range(launcher.TABLE_WORDS + 1)))
