"""Communication cost of synchronising gradients: parameter server, ring, tree and butterfly all-reduce.

Two views of the same schemes, derived here rather than quoted:

* **bytes**: what each worker sends per iteration, what the busiest node (the server, for a parameter
  server) moves, and the total over an epoch. With N workers, M bytes of gradients and K mini-batches per
  worker per epoch, the totals are 2MNK for a parameter server and 2M(N-1)K for the ring;
* **time**, with the latency-bandwidth (alpha-beta) model: a message of b bytes takes alpha + b * beta.
  ``fit_link`` estimates alpha and beta from measured point-to-point times, so predictions are calibrated
  on the machine that makes them.

Every node is assumed full-duplex (it can send one message and receive another at the same time).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from helpers.core import plots
from helpers.core.report import Report, column, format_bytes, format_seconds

SCHEMES = ("parameter server", "ring", "tree", "butterfly")


def _check(scheme: str, workers: int) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; choose from {SCHEMES}")
    if workers < 1:
        raise ValueError(f"need at least one worker, got {workers}")


def rounds(scheme: str, workers: int) -> int:
    """Sequential message rounds one all-reduce takes (what alpha, the latency, is paid for)."""
    _check(scheme, workers)
    if workers == 1 and scheme != "parameter server":
        return 0  # nothing to exchange; a lone worker still talks to its server
    log = math.ceil(math.log2(workers))
    return {"parameter server": 2, "ring": 2 * (workers - 1), "tree": 2 * log, "butterfly": log}[scheme]


def bytes_per_round(scheme: str, message_bytes: float, workers: int) -> float:
    """Bytes on the critical path of one round: a ring moves one 1/N chunk, the others the whole message,
    and a parameter server's link carries all N workers' messages one after another."""
    _check(scheme, workers)
    return {"parameter server": workers * message_bytes, "ring": message_bytes / workers,
            "tree": message_bytes, "butterfly": message_bytes}[scheme]


def critical_path_bytes(scheme: str, message_bytes: float, workers: int) -> float:
    """Bytes that cross one link one after another in an all-reduce (rounds x bytes per round): the time it
    takes wherever bandwidth, not latency, sets the pace is this many bytes x beta, whatever the network."""
    return rounds(scheme, workers) * bytes_per_round(scheme, message_bytes, workers)


def bytes_sent_per_worker(scheme: str, message_bytes: float, workers: int) -> float:
    """Bytes one worker sends per all-reduce (for a parameter server: a worker, not the server)."""
    _check(scheme, workers)
    if workers == 1 and scheme != "parameter server":
        return 0.0
    return {
        "parameter server": message_bytes,  # push the gradient; the server sends back the update
        "ring": 2 * (workers - 1) / workers * message_bytes,  # N-1 chunks out in each of two phases
        "tree": 2 * (workers - 1) / workers * message_bytes,  # on average: every non-root sends M up and M down
        "butterfly": math.ceil(math.log2(workers)) * message_bytes,  # the whole message in every round
    }[scheme]


def server_bytes_sent(message_bytes: float, workers: int) -> float:
    """Bytes a parameter server sends per all-reduce: the sum to each of its ``workers`` (it receives as many)."""
    return workers * message_bytes


def busiest_node_bytes(scheme: str, message_bytes: float, workers: int) -> float:
    """Bytes sent plus received by the most loaded node per all-reduce: it sets the pace."""
    _check(scheme, workers)
    if workers == 1 and scheme != "parameter server":
        return 0.0
    log = math.ceil(math.log2(workers))
    return {
        "parameter server": 2 * workers * message_bytes,  # the server: N gradients in, N updates out
        "ring": 2 * bytes_sent_per_worker("ring", message_bytes, workers),  # every node alike: as much in as out
        "tree": 2 * log * message_bytes,  # the root of a binomial tree: M from each of log N children, M back to each
        "butterfly": 2 * log * message_bytes,  # every node: M out and M in, each of log N rounds
    }[scheme]


def total_bytes_per_iteration(scheme: str, message_bytes: float, workers: int) -> float:
    """Bytes sent by all nodes together for one all-reduce (the server included)."""
    _check(scheme, workers)
    if scheme == "parameter server":
        return 2 * workers * message_bytes  # N pushes to the server, N pulls from it
    return workers * bytes_sent_per_worker(scheme, message_bytes, workers)


def epoch_bytes(scheme: str, message_bytes: float, workers: int, batches_per_worker: int) -> float:
    """Total bytes sent in one epoch: ``batches_per_worker`` all-reduces (PS: 2MNK, ring: 2M(N-1)K)."""
    return batches_per_worker * total_bytes_per_iteration(scheme, message_bytes, workers)


@dataclass(frozen=True)
class Link:
    """The alpha-beta model of a link: ``alpha`` seconds of latency per message, ``beta`` seconds per byte."""

    alpha: float
    beta: float
    source: str = "assumed"

    @property
    def bandwidth(self) -> float:
        """Bytes per second (1 / beta)."""
        return 1 / self.beta

    def message_time(self, message_bytes: float) -> float:
        return self.alpha + message_bytes * self.beta


def all_reduce_time(scheme: str, message_bytes: float, workers: int, link: Link) -> float:
    """Modelled seconds for one all-reduce: rounds x alpha + critical-path bytes x beta."""
    return rounds(scheme, workers) * link.alpha + critical_path_bytes(scheme, message_bytes, workers) * link.beta


def model_error(measured: float, modelled: float) -> float:
    """How far a model missed a measurement, as a factor: measured / modelled (1.0: exact; 2.0: the run took twice as long)."""
    return measured / modelled if modelled > 0 else float("inf")


def within(error: float, tolerance: float) -> bool:
    """Whether a ``model_error`` lies within a factor ``tolerance`` either way (2.0: from half to twice the model)."""
    return 1 / tolerance <= error <= tolerance


def fit_link(message_bytes: Sequence[float], seconds: Sequence[float], source: str = "fitted") -> Link:
    """Least-squares alpha and beta from measured one-way message times (both kept positive)."""
    x, y = np.asarray(message_bytes, float), np.asarray(seconds, float)
    if len(x) < 2 or np.ptp(x) == 0:
        raise ValueError("fit_link needs times for at least two different message sizes")
    beta, alpha = np.polyfit(x, y, 1, w=1 / y)  # relative weights: small messages count as much as large ones
    beta = max(beta, 1e-15)
    alpha = max(alpha, 0.0)
    return Link(float(alpha), float(beta), source)


# ---------------------------------------------------------------- reports


@dataclass
class SchemeCost:
    scheme: str = column("scheme")
    workers: int = column("N")
    message_bytes: float
    sent_per_worker: float = column("sent per worker", format_bytes)
    busiest_node: float = column("busiest node in+out", format_bytes)
    epoch_total: float = column("total per epoch", format_bytes)
    rounds: int = column("rounds")
    critical_path: float = column("bytes in sequence", format_bytes)
    seconds: float | None = column("time (model)", format_seconds, optional=True)  # shown only when a link was given
    source: str


class CommCosts(Report):
    """Per scheme and number of workers: bytes per worker, at the busiest node, per epoch, and modelled time."""

    title = "Gradient synchronisation: communication cost by scheme"

    def __init__(self, rows, link: Link | None, batches_per_worker: int, notes=()):
        super().__init__(rows, notes)
        self.link, self.batches_per_worker = link, batches_per_worker

    def plot(self, ax=None, metric: str = "busiest_node"):
        """One line per scheme against N: ``busiest_node`` bytes (default), ``epoch_total``, ``critical_path`` or ``seconds``."""
        labels = {"busiest_node": "bytes in+out at the busiest node", "epoch_total": "bytes per epoch, all nodes", "seconds": "seconds per all-reduce (model)",
                  "critical_path": "bytes in sequence on one link"}
        series = {}
        for scheme in SCHEMES:
            rows = [r for r in self.rows if r.scheme == scheme]
            if rows:
                series[scheme] = ([r.workers for r in rows], [getattr(r, metric) for r in rows])
        message = format_bytes(self.rows[0].message_bytes)
        return plots.line_chart(series, ax, styles={"butterfly": "--"}, title=f"{labels[metric]}, {message} of gradients",
                                xlabel="workers N (log scale)", ylabel=labels[metric] + " (log scale)", logx=True, logy=True)


def comm_costs(message_bytes: float, workers: Sequence[int] = (2, 4, 8, 16, 32, 64), batches_per_worker: int = 100,
               link: Link | None = None, schemes: Sequence[str] = SCHEMES) -> CommCosts:
    """Tabulate every scheme's cost for a gradient of ``message_bytes`` over ``workers``; times need a ``link``."""
    rows = [
        SchemeCost(s, n, message_bytes, bytes_sent_per_worker(s, message_bytes, n), busiest_node_bytes(s, message_bytes, n),
                   epoch_bytes(s, message_bytes, n, batches_per_worker), rounds(s, n), critical_path_bytes(s, message_bytes, n),
                   all_reduce_time(s, message_bytes, n, link) if link else None, link.source if link else "")
        for s in schemes for n in workers
    ]
    notes = [f"K = {batches_per_worker} mini-batches per worker per epoch.",
             "bytes in sequence: what crosses one link one message after another; where bandwidth sets the pace, the time is this x beta.",
             "Every figure here is the model's, computed from N, M and K: counts of bytes and rounds, not measurements."]
    if link:
        notes.append(f"Times from the alpha-beta model ({link.source}): alpha = {format_seconds(link.alpha)}, "
                     f"bandwidth = {link.bandwidth / 1e9:.2f} GB/s. These are predictions, not runs.")
    return CommCosts(rows, link, batches_per_worker, notes)
