"""The host-batch pipeline's tuner: where its stages run and how many decoding threads, chosen from
measured stage times (a pure rule, tested on simulated times: tests/unit/test_host_batch_tuner.py).
"""


class Tuner:
    """Chooses the decoding threads and the normalisation's place from measured stage times.

    Per batch it is told the host stage's seconds (decoding, on the
    background threads), the stall (how long the step waited for it) and
    the device stage's host seconds. Given several places, it first runs
    WINDOW batches with each and keeps the one whose step-side time (stall +
    device stage) was lowest. Threads (when tuned) then climb by one while
    the step stalls on the host stage and a thread more shortens the stall,
    and drop by one while nothing stalls (the cores go to the step), each
    direction stopping at the first change that did not help.
    """
    WINDOW = 4
    #: a stall below this share of the step's time counts as none
    QUIET = 0.05

    def __init__(self, threads, places, max_threads):
        self.fixed_threads = threads > 0
        self.threads = threads if threads > 0 else max(1, min(max_threads, 2))
        self.max_threads = max(self.threads, max_threads)
        self.places = tuple(places)
        self.trials = {} if len(self.places) > 1 else None      # place -> its step-side seconds a batch
        self.place = self.places[0]
        self.window = []
        self.frozen_up = self.frozen_down = self.fixed_threads
        self.trying = None           # (previous threads, previous mean critical) of a change on trial
        self.log = []
        self.totals = {"batches": 0, "samples": 0, "read_ahead": 0, "host_s": 0.0, "stall_s": 0.0, "device_s": 0.0,
                       "step_s": 0.0}
        self.stages = {}             # a place's own parts of the host stage -> seconds in all

    def record(self, m, host_s, stall_s, device_s, step_s, ahead=True, stages=None):
        """One batch's measurements; ahead: whether it was read ahead (a batch decoded on demand, at
        an epoch's start or a new batch size, stalls by its whole host stage and teaches nothing);
        stages: the host stage's parts (name -> seconds), reported only."""
        for name, secs in (stages or {}).items():
            self.stages[name] = self.stages.get(name, 0.0) + secs
        tot = self.totals
        tot["batches"] += 1
        tot["samples"] += m
        tot["read_ahead"] += bool(ahead)
        tot["host_s"] += host_s
        tot["stall_s"] += stall_s
        tot["device_s"] += device_s
        tot["step_s"] += step_s
        if not ahead:
            return
        self.window.append((stall_s + device_s, stall_s, step_s))
        if len(self.window) < self.WINDOW:
            return
        crit = sum(w[0] for w in self.window) / len(self.window)
        stall = sum(w[1] for w in self.window) / len(self.window)
        step = max(sum(w[2] for w in self.window) / len(self.window), 1e-9)
        self.window = []
        if self.trials is not None:
            self.trials[self.place] = crit
            left = [p for p in self.places if p not in self.trials]
            if left:
                self.place = left[0]
            else:
                self.place = min(self.trials, key=self.trials.get)
                times = ", ".join(f"{p}: {1e3 * v:.2f} ms" for p, v in self.trials.items())
                self.log.append(f"place {self.place!r} ({times} a batch on the step's side)")
                self.trials = None
            return
        self._threads(crit, stall / step)

    def _threads(self, crit, stalled):
        if self.trying is not None:
            before, crit_before = self.trying
            self.trying = None
            if crit > 0.95 * crit_before and self.threads > before:
                self.log.append(f"{self.threads} threads did not shorten the stall: back to {before}")
                self.threads, self.frozen_up = before, True
                return
            if self.threads < before and stalled > self.QUIET:
                self.log.append(f"{self.threads} threads stalled the step: back to {before}")
                self.threads, self.frozen_down = before, True
                return
            self.log.append(f"{self.threads} threads kept")
        if stalled > self.QUIET and not self.frozen_up and self.threads < self.max_threads:
            self.trying = (self.threads, crit)
            self.threads += 1
        elif stalled <= self.QUIET and not self.frozen_down and self.threads > 1:
            self.trying = (self.threads, crit)
            self.threads -= 1

    def summary(self):
        """What was chosen and measured (per batch: the host stage, the step's wait, the device
        stage's host time, the step between calls) and the decisions taken, as a dict."""
        tot = self.totals
        n = max(tot["batches"], 1)
        return {"threads": self.threads, "max_threads": self.max_threads, "threads_tuned": not self.fixed_threads,
                "place": self.place, "place_tuned": len(self.places) > 1,
                "batches": tot["batches"], "samples": tot["samples"], "read_ahead": tot["read_ahead"],
                "host_ms_per_batch": 1e3 * tot["host_s"] / n, "stall_ms_per_batch": 1e3 * tot["stall_s"] / n,
                "device_ms_per_batch": 1e3 * tot["device_s"] / n, "step_ms_per_batch": 1e3 * tot["step_s"] / n,
                "stage_ms_per_batch": {k: 1e3 * v / n for k, v in self.stages.items()},
                "decisions": list(self.log)}
