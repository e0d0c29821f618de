"""The control-channel command encoding: round trips and frame sizes."""
import numpy as np
import pytest

from dmath.comm.control import FRAME
from dmath.errors import DMathError
from dmath.layout import BlockCyclic, Partial, RowBlock, Tiles
from dmath.runtime import Meta, protocol


@pytest.mark.parametrize("kind", [protocol.EXEC, protocol.REGISTER, protocol.SHUTDOWN, protocol.FREE,
                                  protocol.REPLAY])
def test_round_trip(kind):
    signature = ("remap", ((0, 0),), (Meta(RowBlock(), (7, 5), "float32"),),
                 (Meta(Tiles((0, 3, 7), (0, 5), [[0], [1]]), (7, 5), "float16"),))
    handles = [1, 2, 2 ** 31 - 1]
    scalars = [0.5, -1e300, float("inf"), 3.0]
    frees = [7, 8, 9]
    sig = signature if kind == protocol.REGISTER else None
    message, total = protocol.encode(kind, 42, handles, scalars, frees, sig)
    assert len(message) == total
    assert protocol.total_length(np.frombuffer(message[:FRAME].ljust(FRAME, b"\0"), np.uint8)) == total
    k, sig_id, h, s, f, got = protocol.decode(message)
    assert (k, sig_id, h, s, f) == (kind, 42, handles, scalars, frees)
    assert got == sig
    if sig is not None:
        # layouts survive the trip as equal, hashable values
        assert got[3][0].layout == signature[3][0].layout
        assert hash(got[2][0].layout) == hash(RowBlock())


@pytest.mark.parametrize("kind", [protocol.EXEC, protocol.REGISTER])
def test_the_careful_flag_rides_in_the_kind_byte(kind):
    """A careful command's frame is the same size as the plain one; decoding keeps the flag and
    still reads the signature of a REGISTER."""
    sig = ("gemm", (), (), ()) if kind == protocol.REGISTER else None
    plain, plain_total = protocol.encode(kind, 9, [1, 2, 3], [0.5], [4], sig)
    careful, total = protocol.encode(kind | protocol.CAREFUL, 9, [1, 2, 3], [0.5], [4], sig)
    assert total == plain_total and careful[1:] == plain[1:]
    k, sig_id, h, s, f, got = protocol.decode(careful)
    assert k == kind | protocol.CAREFUL and k & ~protocol.CAREFUL == kind
    assert (sig_id, h, s, f, got) == (9, [1, 2, 3], [0.5], [4], sig)
    assert protocol.CAREFUL > max(protocol.EXEC, protocol.REGISTER, protocol.SHUTDOWN, protocol.FREE,
                                  protocol.REPLAY, protocol.DEFINE, protocol.OOM_CHECK)


def test_decode_ignores_trailing_bytes():
    message, total = protocol.encode(protocol.EXEC, 3, [1, 2, 3])
    k, sig_id, h, s, f, sig = protocol.decode(message + b"\0" * 20)
    assert (k, sig_id, h, s, f, sig) == (protocol.EXEC, 3, [1, 2, 3], [], [], None)


def test_cached_binary_op_fits_one_frame():
    """A cached binary op (two inputs, one output), even with a few handles to free, is one frame."""
    for frees in ([], [5], [5, 6, 7, 8]):
        message, total = protocol.encode(protocol.EXEC, 123456, [10, 11, 12], [], frees)
        assert total <= FRAME, (frees, total)
    # with a scalar operand too (M * s)
    _, total = protocol.encode(protocol.EXEC, 9, [10, 12], [2.5], [11])
    assert total <= FRAME


def test_register_carries_the_signature():
    sig = ("ewise", ("add", (("full", 0), ("full", 1)), None),
           (Meta(BlockCyclic((2, 3)), (9, 9), "float64"), Meta(Partial((0, 2)), (9, 9), "float64")),
           (Meta(RowBlock(), (9, 9), "float64"),))
    message, total = protocol.encode(protocol.REGISTER, 1, [1, 2, 3], [], [], sig)
    assert total > FRAME                       # signatures travel once, in a longer message
    assert protocol.decode(message)[5] == sig
    assert protocol.decode(protocol.encode(protocol.EXEC, 1, [1, 2, 3])[0])[5] is None


def test_max_frees_fit_the_header():
    message, total = protocol.encode(protocol.EXEC, 1, [], [], list(range(protocol.MAX_FREES)))
    assert protocol.decode(message)[4] == list(range(protocol.MAX_FREES))


def test_the_most_operands_fit_the_header():
    n = protocol.MAX_OPERANDS
    handles, scalars = list(range(1, n + 1)), [float(k) for k in range(n)]
    for message, _ in (protocol.encode(protocol.EXEC, 1, handles, scalars, handles),
                       protocol.encode(protocol.REGISTER, 1, handles, scalars, handles, ("op", (), (), ()))):
        assert protocol.decode(message)[2:5] == (handles, scalars, handles)


@pytest.mark.parametrize("where", ["handles", "scalars", "frees"])
@pytest.mark.parametrize("kind", [protocol.EXEC, protocol.REGISTER])
def test_a_count_past_its_header_byte_is_a_dmath_error(kind, where):
    """Refused with a DMathError that names the count, never a bare struct.error, also when the
    counts alias a cached message's key (256 handles and no scalar packs as 0 and 1 would)."""
    protocol.encode(protocol.EXEC, 1, [], [0.5], [])          # (0, 1, 0) cached
    args = {"handles": [], "scalars": [], "frees": []}
    args[where] = [1.0 if where == "scalars" else 1] * (protocol.MAX_OPERANDS + 1)
    sig = ("op", (), (), ()) if kind == protocol.REGISTER else None
    with pytest.raises(DMathError, match=f"{protocol.MAX_OPERANDS + 1} .* at most {protocol.MAX_OPERANDS}"):
        protocol.encode(kind, 1, args["handles"], args["scalars"], args["frees"], sig)
    # the refusal left no struct behind under an aliased key
    message, _ = protocol.encode(protocol.EXEC, 1, [], [0.5], [])
    assert protocol.decode(message)[2:5] == ([], [0.5], [])


def test_a_handle_number_past_int32_is_a_dmath_error():
    protocol.encode(protocol.EXEC, 1, [protocol.HANDLE_MAX, 1, 2])
    with pytest.raises(DMathError, match="outside 1..2147483647"):
        protocol.encode(protocol.EXEC, 1, [protocol.HANDLE_MAX + 1, 1, 2])


def test_a_batch_carries_whole_messages_in_order():
    """BATCH: the queued commands, then the message that sent them (any kind, a REGISTER too)."""
    sig = ("ewise", ("add", (("full", 0), ("full", 1)), None), (), ())
    parts = [protocol.encode(protocol.EXEC, 3, [1, 2, 3], [0.5], [9]),
             protocol.encode(protocol.EXEC, 4, [3, 4], [], []),
             protocol.encode(protocol.REGISTER | protocol.CAREFUL, 5, [4, 5], [], [3], sig)]
    message, total = protocol.batch([m for m, _ in parts], sum(t for _, t in parts))
    assert len(message) == total == protocol.HEADER.size + sum(t for _, t in parts)
    assert protocol.total_length(message) == total
    kind, count, h, s, f, inner = protocol.decode(message)
    assert (kind, count, h, s, f) == (protocol.BATCH, 3, [], [], [])
    assert inner == [protocol.decode(m) for m, _ in parts]
    assert inner[2][0] == protocol.REGISTER | protocol.CAREFUL and inner[2][5] == sig


def test_a_batch_of_cached_commands_is_small():
    """Sixteen cached binary operations (the default most a message carries) in under 600 bytes."""
    parts = [protocol.encode(protocol.EXEC, 7, [10 + k, 11 + k, 12 + k], [], [k])[0] for k in range(16)]
    _, total = protocol.batch(parts, sum(map(len, parts)))
    assert total < 600
