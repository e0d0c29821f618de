"""Liveness of the workers: the master pings while it waits, a thread on every worker answers.

A worker that raises reports it (control.report_failure). A worker that stops
answering cannot: it is frozen (SIGSTOP), stuck in C code that holds the
GIL, or gone without the process manager noticing. So while the master waits
on the workers (every wait polls, see world.poll) it pings them every PING_S
seconds on a communicator of its own, and a daemon thread on each worker
answers with what its main thread is doing. A worker that has answered no
ping of the current wait for `timeout` seconds is hung: the master asks
every rank to write its Python stacks to its standard error and raises
`Hang`, which the runtime turns into a WorkerError naming the rank.

Only the waits count, and only the pings: a worker is silent for as long as
the oldest ping it has not answered has been out. While the master computes
(the user's code, or its own share of a command) it sends no pings, so that
time is never a worker's silence (it was, when silence was counted from the
last answered ping: a long GEMM on the master with DMATH_TIMEOUT_S=1 was
taken for a hung worker).

The other way round: a `Beacon` thread on the master sends a beat every
fraction of the timeout whatever its main thread does, and each worker's
`Responder` notes when it last heard from the master (a ping or a beat). A
master silent for `timeout` seconds (frozen by SIGSTOP, or stuck in code
that holds the GIL) makes the workers write why and abort the job, which
then ends non-zero instead of waiting for it forever.
"""
import faulthandler
import sys
import threading
import time

PING_TAG = 1
PONG_TAG = 2
BEAT_TAG = 3
#: seconds between pings while the master waits
PING_S = 1.0
#: seconds a worker's thread sleeps between looks for a ping
ANSWER_S = 0.05


class Hang(Exception):
    """A worker has not answered for `timeout` seconds; `rank`, `report` (every rank's state)."""

    def __init__(self, rank, report):
        super().__init__(report)
        self.rank, self.report = rank, report


def beat_period(timeout):
    """Seconds between the master's beats: several beats within any `timeout` seconds."""
    return min(PING_S, timeout / 4)


class Beacon:
    """Master: a daemon thread that tells every worker it is alive, every `beat_period` seconds."""

    def __init__(self, world, timeout):
        self.comm, self.size = world.hb, world.size
        self.period = beat_period(timeout)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dmath-beacon", daemon=True)
        self._thread.start()

    def _run(self):
        sends = []
        while not self._stop.wait(self.period):
            sends = [r for r in sends if not r.Test()]
            if len(sends) < 64 * self.size:         # (a worker gone quiet does not pile them up)
                sends += [self.comm.isend(None, dest=r, tag=BEAT_TAG) for r in range(1, self.size)]

    def stop(self):
        """End the thread (at shutdown, before MPI_Finalize)."""
        self._stop.set()
        self._thread.join()


class Responder:
    """Worker: a daemon thread that answers the master's pings with `status()` (a short text) and,
    with a `timeout`, ends the job when the master has sent nothing (ping or beat) for that long."""

    def __init__(self, world, status, timeout=0.0, abort=None):
        self.comm = world.hb
        self.status = status
        self.timeout, self.abort = timeout, abort
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dmath-heartbeat", daemon=True)
        self._thread.start()

    def _run(self):
        comm = self.comm
        sends = []
        heard = time.monotonic()
        while not self._stop.wait(ANSWER_S):
            while comm.Iprobe(source=0, tag=BEAT_TAG):
                comm.recv(source=0, tag=BEAT_TAG)
                heard = time.monotonic()
            while comm.Iprobe(source=0, tag=PING_TAG):
                heard = time.monotonic()
                seq, dump = comm.recv(source=0, tag=PING_TAG)
                if dump:
                    sys.stderr.write(f"dmath: stacks of worker {comm.Get_rank()} (the master found a hung "
                                     f"worker):\n")
                    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                    sys.stderr.flush()
                sends.append(comm.isend((seq, self.status()), dest=0, tag=PONG_TAG))
            sends = [r for r in sends if not r.Test()]
            silent = time.monotonic() - heard
            if self.timeout and silent > self.timeout and not self._stop.is_set():
                self._master_silent(silent)
                return

    def _master_silent(self, silent):
        sys.stderr.write(
            f"dmath worker {self.comm.Get_rank()}: the master has sent nothing for {silent:.0f} s (no "
            f"heartbeat; DMATH_TIMEOUT_S={self.timeout:g}): it is frozen (e.g. SIGSTOP) or stuck in "
            f"code that holds the GIL; ending the job. This worker was {self.status()}.\n")
        sys.stderr.flush()
        self.abort(1)

    def stop(self):
        """End the thread (before MPI_Finalize: it must make no MPI call after that)."""
        self._stop.set()
        self._thread.join()


class Pinger:
    """Master: pings the workers while it waits and raises Hang for one silent for `timeout` s."""

    def __init__(self, world, timeout):
        self.comm = world.hb
        self.mpi = world.mpi_module
        self.size = world.size
        self.timeout = timeout
        self.seq = 0
        self.sent_at = {}                      # ping seq -> when it was sent (this wait's unanswered pings)
        self.answered = [0.0] * world.size     # rank -> when the newest ping it answered was sent
        self.state = ["no answer yet"] * world.size
        self.last_tick = -1e300
        self.next_ping = 0.0
        self.wait_start = 0.0
        self.sends = []

    def tick(self):
        """One polling round of a master wait (cheap unless a ping is due)."""
        now = time.monotonic()
        if now - self.last_tick > 2 * PING_S:
            # a new wait (the master was not waiting in between): the clock starts now
            self.wait_start = now
            self.answered = [now] * self.size
            self.sent_at.clear()
            self.next_ping = now + PING_S
        self.last_tick = now
        if now < self.next_ping:
            return
        self.next_ping = now + PING_S
        self._collect()
        silent = [r for r in range(1, self.size) if self._silent_for(r, now) > self.timeout]
        if silent:
            raise Hang(silent[0], self._hang_report(silent, now))
        self._ping(dump=False)

    def _silent_for(self, r, now):
        """How long rank r has left a ping unanswered: since the oldest ping sent after the newest it
        answered (0 when it answered them all). Pings go out only while the master waits, so the
        master's own computing, however long, is never counted."""
        out = [t for t in self.sent_at.values() if t > self.answered[r]]
        return now - min(out) if out else 0.0

    def _ping(self, dump):
        self.seq += 1
        self.sent_at[self.seq] = time.monotonic()
        self.sends = [r for r in self.sends if not r.Test()]
        for r in range(1, self.size):
            self.sends.append(self.comm.isend((self.seq, dump), dest=r, tag=PING_TAG))

    def _collect(self):
        status = self.mpi.Status()
        while self.comm.Iprobe(source=self.mpi.ANY_SOURCE, tag=PONG_TAG, status=status):
            r = status.Get_source()
            seq, state = self.comm.recv(source=r, tag=PONG_TAG)
            sent = self.sent_at.get(seq)
            if sent is not None and sent > self.answered[r]:
                self.answered[r], self.state[r] = sent, state
        # pings every worker has answered matter no more
        done = min(self.answered[1:], default=0.0)
        for seq in [q for q, t in self.sent_at.items() if t <= done]:
            del self.sent_at[seq]

    def _hang_report(self, silent, now):
        """Ask every rank for its stacks, write the master's own; the text of the WorkerError."""
        self._ping(dump=True)
        sys.stderr.write("dmath: stacks of the master (a worker stopped answering):\n")
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        deadline = time.monotonic() + 2 * ANSWER_S + 1.0      # let the live workers write theirs
        while time.monotonic() < deadline:
            time.sleep(0.05)
            self._collect()
        lines = [f"worker {r}: " + ("NO ANSWER for %.0f s" % self._silent_for(r, now) if r in silent
                                    else self.state[r]) for r in range(1, self.size)]
        names = ", ".join(str(r) for r in silent)
        return (f"worker {names} stopped answering: no reply to the master's pings for more than "
                f"{self.timeout:g} s while the master waited {now - self.wait_start:.0f} s for the workers "
                f"(frozen, e.g. SIGSTOP, or stuck in code that never returns). Every rank that could has "
                f"written its Python stacks to its standard error. DMATH_TIMEOUT_S sets the limit.\n"
                + "\n".join(lines))
