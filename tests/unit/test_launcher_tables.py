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


def test_table_blocks_give_each_array_blocks_in_proportion_within_the_limit():
    per = 256 * launcher.TABLE_PER_THREAD
    firsts, total = launcher.table_blocks([0, 1, per, per + 1, 10 * per], 256)
    assert firsts == [0, 1, 2, 3, 5] and total == 15           # at least one block each, ceil(n / per)
    # past the limit the largest shares are cut to one cap: every array keeps at least one block
    firsts, total = launcher.table_blocks([100 * per, 3 * per, 1, 50 * per], 256, limit=40)
    shares = [b - a for a, b in zip(firsts, firsts[1:] + [total])]
    assert total <= 40 and shares == [18, 3, 1, 18]
    for sizes in ([38_000_000, 4096, 16_000_000, 4096, 4_000_000, 1000], [1] * 192, [2 ** 33, 5]):
        firsts, total = launcher.table_blocks(sizes, 256)
        shares = [b - a for a, b in zip(firsts, firsts[1:] + [total])]
        assert total <= launcher.MAX_BLOCKS and min(shares) >= 1 and firsts[0] == 0
    with pytest.raises(ValueError):
        launcher.table_blocks([1] * 5, 256, limit=4)


def test_table_launch_appends_each_entrys_first_block_and_splits_full_tables():
    launches = []
    run = object.__new__(launcher.Launcher)         # no GPU: its slots, and a launch that records its grid
    run.slots = [(ctypes.c_uint64 * launcher.TABLE_WORDS)(), ctypes.c_int32()]
    run.threads, run.ptr, run.argv_ptr = 256, 0, 0
    run._stream = lambda: type("S", (), {"ptr": 0})()
    run._launch = lambda ptr, gx, gy, *rest: launches.append((gx, gy, list(run.slots[0]), run.slots[1].value))
    per = 256 * launcher.TABLE_PER_THREAD
    run.table([[11, 3 * per], [12, 1], [13, per + 1]])
    gx, gy, words, count = launches[0]
    assert (gx, gy, count) == (6, 1, 3) and words[:9] == [11, 3 * per, 0, 12, 1, 3, 13, per + 1, 4]
    launches.clear()
    run.table([[k, 1] for k in range(200)])            # 3 words an entry: 128 a table
    assert [(gx, count) for gx, _, _, count in launches] == [(128, 128), (72, 72)]
    assert launches[1][2][:6] == [128, 1, 0, 129, 1, 1]
    run.table([])
    assert len(launches) == 2
