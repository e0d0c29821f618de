"""The compact command encoding sent on the control channel.

A message is a 12-byte header, then int32 handle numbers, float64 scalars,
int32 handles to free and, for a first send only, the command signature.
After its first send a signature travels as its integer ID alone, so a cached
binary operation is 24 bytes of payload in one frame.

Limits. The header counts handles, scalars and frees in one byte each, so a
message carries at most MAX_OPERANDS (255) of each: `encode` refuses more
with a DMathError (an operation over more matrices splits itself into
several commands, as `dmath.nn.all_finite` does; frees are sent 255 at a
time). Handle numbers are positive int32 values, at most HANDLE_MAX: the
master hands out numbers of freed matrices again once it has used them all
(handles.py), so they stay int32 and a cached binary operation
its 24 bytes: 64-bit handles would have made it 36, and would have pushed a
command of seven or more handles (a fused optimizer step) past the 64-byte
frame into a second broadcast.

Recorded plans: a DEFINE message (its `sig_id` field holds the plan ID)
carries a whole program, the recorded steps each encoded as an EXEC message
and the frees after the last step as FREE messages, concatenated; a REPLAY
message is the header alone (12 bytes, plus any pending frees). A negative
entry -k among the frees drops plan k; -(SIGNATURE_DROP + s) drops the
registered signature s (dispatch.py, "Bounded signatures").

OOM_CHECK (the header alone) asks every worker whether it is out of the last
command after a refused allocation (oom.py).

BATCH carries several messages in one (dispatch.py, "Queued commands"): its
header (`sig_id` holds their count), then the messages concatenated, each
whole with its own header: the commands the master queued, in order, then
the message whose sending flushed them (any kind). A worker runs them in
order as if they had come one by one.

DRAIN (the header alone) asks every worker to say, once it has run
everything before it, that it has (the master waits for it at every
shutdown, after a flush: a failure in a queued command, or in the last
command sent, is then seen before the workers are told to exit).

CAREFUL, or-ed into the kind byte of an EXEC or REGISTER message, makes the
command careful (its collectives agree first: comm/agreement.py, oom.py).
A flag in a byte that is sent anyway: the frame, its size and the cached
command's single struct pack stay what they are.
"""
import functools
import pickle
import struct
from typing import NamedTuple

from ..errors import DMathError

EXEC, REGISTER, SHUTDOWN, FREE, REPLAY, DEFINE, OOM_CHECK, BATCH, DRAIN = 1, 2, 3, 4, 5, 6, 7, 8, 9
#: a flag on the kind of a command message (EXEC, REGISTER): run it as a careful command
CAREFUL = 0x80
EXEC_CAREFUL = EXEC | CAREFUL
HEADER = struct.Struct("<BBBBII")   # kind, n_handles, n_scalars, n_frees, sig_id, total_len
#: the most handles (inputs and outputs together), scalars or frees one message carries: each count
#: is one byte of the header
MAX_OPERANDS = 255
MAX_FREES = MAX_OPERANDS
#: among the frees, -(SIGNATURE_DROP + s) drops signature s, -k (k below it) plan k; signature IDs
#: stay below it (int32 on the wire)
SIGNATURE_DROP = 2 ** 30
#: the largest handle number (int32 on the wire, where a negative free -k drops plan k)
HANDLE_MAX = 2 ** 31 - 1


class Step(NamedTuple):
    """One recorded command: its signature ID, handles (inputs then outputs), scalars, frees before it."""
    sig_id: int
    handles: tuple
    scalars: tuple
    frees: tuple


class Program(NamedTuple):
    """A recorded plan as every rank stores it: the steps, then the handles freed after the last one."""
    steps: tuple
    tail: tuple


def encode_program(program):
    """The bytes of a Program: every step as an EXEC message, the tail as FREE messages."""
    parts = [encode(EXEC, s.sig_id, s.handles, s.scalars, s.frees)[0] for s in program.steps]
    tail = list(program.tail)
    for k in range(0, len(tail), MAX_FREES):
        parts.append(encode(FREE, frees=tail[k:k + MAX_FREES])[0])
    return b"".join(parts)


def decode_program(blob):
    steps, tail, o = [], [], 0
    while o < len(blob):
        n = total_length(blob[o:o + HEADER.size])
        kind, sig_id, handles, scalars, frees, _ = decode(blob[o:o + n])
        if kind == EXEC:
            steps.append(Step(sig_id, tuple(handles), tuple(scalars), tuple(frees)))
        else:
            tail.extend(frees)
        o += n
    return Program(tuple(steps), tuple(tail))


def encode(kind, sig_id=0, handles=(), scalars=(), frees=(), signature=None, program=None):
    """(message bytes, total length); `signature` goes with REGISTER, `program` with DEFINE."""
    if signature is not None:
        blob = pickle.dumps(signature, protocol=pickle.HIGHEST_PROTOCOL)
    elif program is not None:
        blob = encode_program(program)
    else:
        return encode_numbers(kind, sig_id, handles, scalars, frees)
    nh, ns, nf = len(handles), len(scalars), len(frees)
    whole = _message(nh, ns, nf)
    total = whole.size + len(blob)
    try:
        return whole.pack(kind, nh, ns, nf, sig_id, total, *handles, *scalars, *frees) + blob, total
    except struct.error as exc:
        raise _refused(handles, scalars, frees, exc) from None


def encode_numbers(kind, sig_id, handles, scalars, frees):
    """`encode` of a message of numbers only (no signature, no program): one struct packs it whole
    (struct, not numpy: a cached command is a few numbers, and this runs once per operation)."""
    nh, ns, nf = len(handles), len(scalars), len(frees)
    whole = _MESSAGES.get(nh | ns << 8 | nf << 16)
    if whole is None:
        whole = _message(nh, ns, nf)
    try:
        return whole.pack(kind, nh, ns, nf, sig_id, whole.size, *handles, *scalars, *frees), whole.size
    except struct.error as exc:
        # (no test on the way in: a count past its byte, under a key another message's struct shares,
        # or a handle past int32 fails the pack itself, so the usual command pays nothing for it)
        raise _refused(handles, scalars, frees, exc) from None


def _refused(handles, scalars, frees, exc):
    """The DMathError that says why a message could not be packed (`exc`: struct's own error)."""
    try:
        _check_counts(len(handles), len(scalars), len(frees))
    except DMathError as refusal:
        return refusal
    bad = [h for h in handles if not 0 < h <= HANDLE_MAX]
    if bad:
        return DMathError(f"a command names handle number {bad[0]}, outside 1..{HANDLE_MAX} (int32 on the wire)")
    return DMathError(f"a command could not be encoded: {exc}")


def _check_counts(nh, ns, nf):
    """Raise DMathError when a count does not fit its byte of the header."""
    for n, what in ((nh, "matrices (inputs and outputs)"), (ns, "scalars"), (nf, "handles to free")):
        if n > MAX_OPERANDS:
            raise DMathError(f"a command carries {n} {what}; one command carries at most {MAX_OPERANDS} "
                             f"(a byte of its header): split the operation into several commands")


#: (nh | ns << 8 | nf << 16) -> `_message(nh, ns, nf)` (each count fits the header's byte)
_MESSAGES = {}


def _message(nh, ns, nf):
    """The struct of a message's header and numbers: nh int32 handles, ns float64 scalars, nf int32 frees."""
    _check_counts(nh, ns, nf)        # (before the key: counts past a byte would share another's)
    key = nh | ns << 8 | nf << 16
    whole = _MESSAGES.get(key)
    if whole is None:
        whole = _MESSAGES[key] = struct.Struct(HEADER.format + _numbers(nh, ns, nf).format[1:])
    return whole


@functools.lru_cache(maxsize=1024)
def _numbers(nh, ns, nf):
    """The struct of a message's numbers: nh int32 handles, ns float64 scalars, nf int32 frees."""
    return struct.Struct(f"<{nh}i{ns}d{nf}i")


def batch(messages, total):
    """(message bytes, total length) of a BATCH of `messages` (bytes, whole messages) whose lengths add
    up to `total`."""
    total += HEADER.size
    return HEADER.pack(BATCH, 0, 0, 0, len(messages), total) + b"".join(messages), total


def decode_batch(blob, count):
    """The `decode` of each of the `count` messages concatenated in `blob`, in order."""
    out, o = [], 0
    for _ in range(count):
        n = HEADER.unpack_from(blob, o)[5]
        out.append(decode(blob[o:o + n]))
        o += n
    return out


def total_length(frame):
    """The total length a message's first bytes (any buffer: bytes, a numpy frame) announce."""
    return HEADER.unpack_from(frame)[5]


def decode(message):
    """(kind, sig_id, handles, scalars, frees, extra): extra is the signature of a REGISTER,
    the Program of a DEFINE, the list of decoded messages of a BATCH, else None. `kind` keeps the CAREFUL flag of a careful command."""
    kind, nh, ns, nf, sig_id, total = HEADER.unpack_from(message)
    numbers = _numbers(nh, ns, nf)
    values = numbers.unpack_from(message, HEADER.size)
    handles, scalars, frees = list(values[:nh]), list(values[nh:nh + ns]), list(values[nh + ns:])
    o = HEADER.size + numbers.size
    if kind & ~CAREFUL == REGISTER:
        # the signature comes from our own master over MPI, never from a file
        return kind, sig_id, handles, scalars, frees, pickle.loads(message[o:total])
    if kind == DEFINE:
        return kind, sig_id, handles, scalars, frees, decode_program(bytes(message[o:total]))
    if kind == BATCH:
        return kind, sig_id, handles, scalars, frees, decode_batch(message[o:total], sig_id)
    return kind, sig_id, handles, scalars, frees, None
