"""The compact command encoding sent on the control channel.

A message is a 12-byte header, then int32 handle numbers, float64 scalars,
int32 handles to free and, for a first send only, the command signature.
After its first send a signature travels as its integer ID alone, so a cached
binary operation is 24 bytes of payload in one frame.
"""
import pickle
import struct

import numpy as np

EXEC, REGISTER, SHUTDOWN, FREE, REPLAY = 1, 2, 3, 4, 5
HEADER = struct.Struct("<BBBBII")   # kind, n_handles, n_scalars, n_frees, sig_id, total_len
MAX_FREES = 255


def encode(kind, sig_id=0, handles=(), scalars=(), frees=(), signature=None):
    blob = pickle.dumps(signature, protocol=pickle.HIGHEST_PROTOCOL) if signature is not None else b""
    body = (np.asarray(handles, dtype="<i4").tobytes() + np.asarray(scalars, dtype="<f8").tobytes()
            + np.asarray(frees, dtype="<i4").tobytes() + blob)
    total = HEADER.size + len(body)
    return HEADER.pack(kind, len(handles), len(scalars), len(frees), sig_id, total) + body, total


def total_length(frame):
    return HEADER.unpack_from(bytes(frame[:HEADER.size]))[5]


def decode(message):
    """(kind, sig_id, handles, scalars, frees, signature or None)."""
    kind, nh, ns, nf, sig_id, total = HEADER.unpack_from(message)
    o = HEADER.size
    handles = np.frombuffer(message, "<i4", nh, o).tolist()
    o += 4 * nh
    scalars = np.frombuffer(message, "<f8", ns, o).tolist()
    o += 8 * ns
    frees = np.frombuffer(message, "<i4", nf, o).tolist()
    o += 4 * nf
    # the signature comes from our own master over MPI, never from a file
    signature = pickle.loads(message[o:total]) if kind == REGISTER else None
    return kind, sig_id, handles, scalars, frees, signature
