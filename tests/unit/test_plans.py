"""Recorded plans without workers: the recorder's handle bookkeeping and the program encoding."""
import numpy as np

from dmath.comm.control import FRAME
from dmath.layout import RowBlock
from dmath.runtime import Meta, protocol
from dmath.runtime.plans import Recorder

M = Meta(RowBlock(), (4, 4), "float64")


def _record(commands, pending=()):
    """Feed (sig_id, input handles, outputs, new handles, scalars, frees, returned) to a Recorder."""
    rec = Recorder()
    for sig, ins, outs, new, sc, frees, ret in commands:
        rec.command(sig, [(h, M) for h in ins], outs, new, sc, frees, ret)
    return rec, rec.finish(list(pending))


def test_handles_are_classified():
    # 1, 2 exist before the block; 10 garbage from before it; 3, 4, 5, 6 are made inside
    rec, program = _record([
        (7, [1, 2], [3], [3], [], [10], False),      # t3 = x1 + x2   (frees the old garbage 10)
        (8, [3], [4], [4], [2.0], [], False),        # t4 = t3 * 2
        (9, [4, 1], [5], [5], [], [3], False),       # t5 = t4 - x1   (t3 was released: freed here)
        (5, [1], [1], [], [0.5], [], False),         # x1 *= 0.5      (in place: no new handle)
        (6, [5], [], [], [], [], True),              # s = t5.sum()   (a value for the master)
        (7, [5, 2], [6], [6], [], [], False),        # t6 = t5 + x2
    ], pending=[4, 11])                              # t4 released at the end; 11 is old garbage
    assert list(rec.inputs) == [1, 2]
    assert rec.created == {3, 4, 5, 6}
    assert rec.live == {5, 6}                        # the outputs
    assert program.tail == (4,)
    assert [s.frees for s in program.steps] == [(), (), (3,), (), (), ()]   # only the plan's own
    assert program.steps[3].handles == (1, 1)        # an in-place output repeats its input
    assert program.steps[1].scalars == (2.0,)
    assert rec.returns == [False, False, False, False, True, False]
    assert not rec.freed_inputs


def test_inputs_freed_during_the_block_are_noticed():
    rec, _ = _record([
        (1, [1], [2], [2], [1.0], [], False),        # y = x + 1
        (1, [2], [3], [3], [1.0], [1], False),       # x released and freed with the next command
    ])
    assert rec.freed_inputs == {1}
    rec, _ = _record([(1, [1], [2], [2], [1.0], [], False)], pending=[1])
    assert rec.freed_inputs == {1}


def test_program_round_trip():
    program = protocol.Program(
        steps=(protocol.Step(3, (1, 2, 5), (), ()), protocol.Step(4, (5, 6), (0.25, -1e300), (7, 8)),
               protocol.Step(2 ** 31 - 1, (), (), ())),
        tail=tuple(range(100, 700)))                 # longer than one message's frees
    message, total = protocol.encode(protocol.DEFINE, 9, frees=[-3, 11], program=program)
    assert total == len(message)
    kind, plan_id, handles, scalars, frees, got = protocol.decode(message)
    assert (kind, plan_id, handles, scalars, frees) == (protocol.DEFINE, 9, [], [], [-3, 11])
    assert got == program


def test_replay_frame_is_tiny():
    message, total = protocol.encode(protocol.REPLAY, 123456)
    assert total == protocol.HEADER.size <= FRAME
    assert protocol.decode(message)[:2] == (protocol.REPLAY, 123456)
    frame = np.frombuffer(message.ljust(FRAME, b"\0"), np.uint8)
    assert protocol.total_length(frame) == total
    # a few pending frees still fit the frame
    assert protocol.encode(protocol.REPLAY, 1, frees=list(range(13)))[1] <= FRAME
