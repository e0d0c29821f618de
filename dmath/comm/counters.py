"""Per-process traffic counters, reported by dmath.stats()."""

KEYS = ("data_bytes_sent", "data_bytes_recv", "data_msgs_sent", "data_msgs_recv",
        "control_msgs", "control_bytes",
        # careful commands this rank ran, and the agreements it joined in them (agreement.py)
        "careful_commands", "agreements",
        # batches of a host-held source (a mapped file, host memory) that the read-ahead had gathered
        # already, and those gathered when asked (ops/nn/batch.py)
        "read_ahead_hits", "read_ahead_misses")

counters = dict.fromkeys(KEYS, 0)


def reset():
    for k in KEYS:
        counters[k] = 0


def count_send(nbytes, msgs=1):
    counters["data_bytes_sent"] += int(nbytes)
    counters["data_msgs_sent"] += int(msgs)


def count_recv(nbytes, msgs=1):
    counters["data_bytes_recv"] += int(nbytes)
    counters["data_msgs_recv"] += int(msgs)


def count_control(nbytes):
    """One control message of `nbytes` (an int)."""
    counters["control_msgs"] += 1
    counters["control_bytes"] += nbytes
