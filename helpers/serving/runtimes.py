"""Latency of one model in several runtimes, by batch size and thread count: eager PyTorch, ONNX Runtime fp32 and int8."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from helpers.core.device import cpu_threads
from helpers.core.report import Report, column, format_seconds
from helpers.core.timing import timeit

MIN_BLOCKS = 4  # timed blocks below which a reading's IQR says nothing about its spread


@dataclass
class RuntimePoint:
    runtime: str = column("runtime")
    threads: int = column("threads")
    batch: int = column("batch", ",")
    latency: float = column("latency", format_seconds)
    per_input: float = column("per input", format_seconds)
    speedup: float = column("vs eager", ".2f")
    iqr: float | None = column("latency IQR", format_seconds, default=None)  # interquartile range of the timed blocks; None under MIN_BLOCKS
    blocks: int = column("blocks", default=0)  # timed blocks behind the median and IQR


class RuntimeLatency(Report):
    """Median latency per call; ``speedup`` is eager's latency at the same batch and threads over this one's."""

    title = "Latency by runtime, batch size and threads"

    def speedup(self, runtime: str, batch: int, threads: int) -> float:
        return self.find(runtime=runtime, batch=batch, threads=threads).speedup

    def plot(self, ax=None):
        from helpers.core.plots import line_chart

        threads = min(r.threads for r in self.rows)
        series = {}
        for r in self.rows:
            if r.threads == threads:
                xs, ys = series.setdefault(r.runtime, ([], []))
                xs.append(r.batch)
                ys.append(r.per_input * 1e6)
        return line_chart(series, ax, title=f"{self.title} ({threads} thread)", xlabel="batch size",
                          ylabel="time per input (us)", logx=True, logy=True)


def runtime_latency(model: nn.Module, sessions: dict[str, object], pixels: torch.Tensor,
                    batch_sizes: Sequence[int] = (1, 16, 256), threads: Sequence[int] = (1,),
                    min_run_time: float = 0.1) -> RuntimeLatency:
    """Time ``model`` eagerly and each ONNX Runtime session factory in ``sessions`` ({name: f(threads) -> session})."""
    rows = []
    for n_threads in threads:
        runners: dict[str, Callable] = {}
        eager = model.eval()
        runners["eager PyTorch"] = lambda x: eager(x)
        for name, make_session in sessions.items():
            session = make_session(n_threads)
            runners[name] = lambda x, s=session: s.run(None, {"pixels": x.numpy()})
        with torch.inference_mode(), cpu_threads(n_threads):
            eager_latency = {}
            for name, run in runners.items():
                for batch in batch_sizes:
                    x = pixels[:batch]
                    measured = timeit(run, x, min_run_time=min_run_time, num_threads=n_threads)
                    latency = measured.median
                    if name == "eager PyTorch":
                        eager_latency[batch] = latency
                    rows.append(RuntimePoint(name, n_threads, batch, latency, latency / batch, eager_latency[batch] / latency,
                                             measured.iqr if len(measured.times) >= MIN_BLOCKS else None, len(measured.times)))
    return RuntimeLatency(rows, [f"Median of torch.utils.benchmark's timed blocks (at least {min_run_time:g} s of blocks per reading), "
                                 "inference only, the same held-out images for every runtime; latency IQR: the spread of those "
                                 f"blocks, n/a under {MIN_BLOCKS} blocks."])
