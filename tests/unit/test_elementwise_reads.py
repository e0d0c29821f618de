"""The GPU one-launch elementwise loop's operand plan (`elementwise_cuda.reads`), without a GPU:
which local piece and which byte offset each worker reads, and when the loop must not be used."""
from dmath.layout import BlockCyclic, ColBlock, Replicated, RowBlock, distribution
from dmath.ops.elementwise_cuda import form, reads, vector_source, vector_width


def _reads(pattern, inputs, result, nworkers, rank):
    """`reads` for the result piece of worker `rank`: inputs are (layout, shape, dtype)."""
    in_dists = [distribution(lay, shape, nworkers) for lay, shape, _ in inputs]
    (piece,) = distribution(result[0], result[1], nworkers).pieces[rank]
    return reads(pattern, in_dists, [d for _, _, d in inputs], piece, rank)


def test_a_replicated_column_is_read_from_the_pieces_first_row():
    # (11, 6) RowBlock over 2 workers: rows 0-5 and 6-10; the (11, 1) column is Replicated
    pattern = (("full", 0), ("col", 1), ("scalar", 0))
    inputs = [(RowBlock(), (11, 6), "float32"), (Replicated(), (11, 1), "float32")]
    for rank, first_row in ((0, 0), (1, 6)):
        operands, plan = _reads(pattern, inputs, (RowBlock(), (11, 6)), 2, rank)
        assert operands == (("float32", "full"), ("float32", "col"), None)
        assert plan[1] == (True, 1, (0, first_row * 4, (4, 4)))   # a (11, 1) piece's strides
        assert plan[2] == (False, 0, None)


def test_a_replicated_row_is_read_from_the_pieces_first_column():
    # (4, 9) ColBlock over 3 workers: worker 2 holds columns 6-8 of the float64 (1, 9) row
    pattern = (("row", 0), ("full", 1))
    inputs = [(Replicated(), (1, 9), "float64"), (ColBlock(), (4, 9), "float16")]
    operands, plan = _reads(pattern, inputs, (ColBlock(), (4, 9)), 3, 2)
    assert operands == (("float64", "row"), ("float16", "full"))
    assert plan[0] == (True, 0, (0, 6 * 8, (9 * 8, 8)))
    assert plan[1] == (True, 1, (0, 0, (3 * 2, 2)))     # worker 2's (4, 3) float16 piece


def test_a_column_split_as_the_rows_are_is_read_from_its_own_start():
    pattern = (("full", 0), ("col", 1))
    inputs = [(RowBlock(), (11, 6), "float32"), (RowBlock(), (11, 1), "float32")]
    operands, plan = _reads(pattern, inputs, (RowBlock(), (11, 6)), 2, 1)
    assert plan[1] == (True, 1, (0, 0, (4, 4)))         # worker 1's own piece holds rows 6-10


def test_scattered_positions_refuse_the_one_launch_loop():
    # cyclic rows: worker 0's one piece holds rows 0, 2, 4, ... of the result, which are not one
    # run of the Replicated column; the generic kernel reads them
    cyclic = BlockCyclic((1, 3), grid=(2, 1))
    pattern = (("full", 0), ("col", 1))
    inputs = [(cyclic, (12, 3), "float32"), (Replicated(), (12, 1), "float32")]
    assert _reads(pattern, inputs, (cyclic, (12, 3)), 2, 0) is None
    one = BlockCyclic((1, 3), grid=(1, 1))
    assert _reads(pattern, [(one, (12, 3), "float32"), inputs[1]], (one, (12, 3)), 1, 0) is not None
    # a column not held where the result piece is (the master replicates it first) is refused too
    inputs[1] = (BlockCyclic((1, 1), grid=(2, 1)), (12, 1), "float32")
    assert _reads(pattern, inputs, (RowBlock(), (12, 3)), 2, 0) is None


def test_forms_follow_the_shapes():
    assert form((4, 5), (4, 5)) == "full"
    assert form((1, 5), (4, 5)) == "row"
    assert form((4, 1), (4, 5)) == "col"
    assert form((1, 1), (4, 5)) == "one"


def test_the_vector_loop_takes_whole_operands_of_the_results_dtype_only():
    half, single = ("float16", "full"), ("float32", "full")
    assert vector_width((half, half), "float16") == 8            # 16 bytes a step
    assert vector_width((None, single), "float32") == 4          # a scalar beside a whole piece
    assert vector_width((("float64", "full"),), "float64") == 2
    assert vector_width((half, single), "float32") is None       # mixed dtypes: the scalar loop
    assert vector_width((single, ("float32", "row")), "float32") is None
    assert vector_width((None, None), "float32") is None         # no array at all
    text = vector_source("mul", (half, None), "float16")
    assert "dm_ewisev_mul" in text and "dm_ev<half, 8>" in text
    assert "const C b = b_s;" in text and "reinterpret_cast<const VT*>(a_p)[w]" in text
