"""Each GPU lesson's effect, judged from the figures its lecture measured (``lesson_figures``) on the machine that ran it.

A lesson is judged where its lecture ran on a GPU; elsewhere its row reads n/a with the reason. The rules that the
benchmarks also apply (the roofline, the Triton kernels, launch overhead) are the benchmarks' own functions, called on
the lecture's rows. Where an effect does not show, a lesson whose lecture prints a sentence computed from the same
measurement (``STATEMENTS``: the figure it hands back holds that sentence, with the measured speed-up in it) reads
"stated": its text says what this GPU measured instead of promising the effect.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from helpers.core.report import Report
from helpers.hardware.kernels import KernelPoint
from helpers.hardware.roofline import RooflinePoint
from helpers.training.launch_overhead import GRAPH, LaunchVariant
from tests.bench import Target
from tests.bench.bench_kernels import _speedup, kernel_targets, roofline_targets

L1 = "01-gpu-architecture-and-benchmarking.ipynb"
L1B = "03-gpu-programming-model.ipynb"
HARDWARE = "02-hardware-ecosystem.ipynb"
L5A = "05a-mixed-precision-and-data-pipelines.ipynb"
L5B = "05b-profiling-and-compilation.ipynb"
L8C = "08c-flash-attention.ipynb"
LEARNED = 0.5  # held-out accuracy a trained LeNet must reach on the GPU: five times chance on ten digits


@dataclass
class LessonRow:
    lesson: str
    lecture: str
    measured: float | None
    required: str
    status: str  # "pass", "fail", "stated" (the effect did not show, and the lecture's computed text says so), or "n/a"
    statement: str | None = None  # the lecture's sentence about it, where the status is "stated"


def _report(row_type, records: list[dict]) -> Report:
    """A lecture's report rebuilt from its JSON records, so that the benchmarks' rules can read it."""
    names = {f.name for f in dataclasses.fields(row_type) if f.init}
    return Report([row_type(**{k: v for k, v in r.items() if k in names}) for r in records])


def _amp(f: dict) -> list[Target]:
    return [Target.at_least("AMP training step vs fp32, compute-bound layers", f["amp_speedup_compute_bound"], 2.0, "x")]


def _bucketing(f: dict) -> list[Target]:
    whole, bucketed = f["padding"][0], f["padding"][-1]
    return [Target.at_least(f"epoch speed-up, {bucketed['strategy']} vs {whole['strategy']}",
                            whole["epoch_seconds"] / bucketed["epoch_seconds"], 2.0, "x")]


def _best_convolution(f: dict) -> tuple[str, dict]:
    """The convolution on which autotuning did best (forward + backward): its name and figures."""
    return max(f["cudnn_speedup"].items(), key=lambda item: item[1]["forward_backward"])


def _cudnn(f: dict) -> list[Target]:
    name, best = _best_convolution(f)
    return [Target.at_least(f"cudnn.benchmark, forward + backward, best of the convolutions ({name})", best["forward_backward"], 1.05, "x")]


def _roofline(f: dict) -> list[Target]:
    return roofline_targets(_report(RooflinePoint, f["roofline"]))


def _training(f: dict) -> list[Target]:
    speeds = f["training_samples_per_second"]
    return [Target.at_least("held-out accuracy of LeNet trained on the GPU", f["held_out_accuracy"]["GPU"], LEARNED),
            Target.at_least("GPU vs CPU training, samples/s", speeds["GPU"] / speeds["CPU"], 1.0, "x")]


def _triton(f: dict) -> list[Target]:
    return kernel_targets(_report(KernelPoint, f["gpu_kernel_timings"]), gpu=True)


def _graphs(f: dict) -> list[Target]:
    return [_speedup("CUDA graph replay vs eager, tiny-op chain", _report(LaunchVariant, f["launch"]).find(variant=GRAPH), 2.0)]


def _flash(f: dict) -> list[Target]:
    rows = {(r["method"], r["n"]): r for r in f["triton_sweep"]}
    n = max(length for _, length in rows)
    mine, plain = rows[("Triton (this kernel)", n)], rows[("plain", n)]
    return [Target.at_least(f"Triton FlashAttention vs plain attention, float16, n = {n:,}, time", plain["seconds"] / mine["seconds"], 1.5, "x"),
            Target.at_most(f"Triton FlashAttention's peak memory as a share of plain attention's, n = {n:,}", mine["peak_bytes"] / plain["peak_bytes"], 0.25)]


# rule -> the sentences its lecture printed about the measurement, as handed back in its figures
STATEMENTS: dict[str, Callable[[dict], list[str]]] = {
    "cudnn": lambda f: [_best_convolution(f)[1]["verdict"]],
    "amp": lambda f: [f["amp_sentence"]],
    "bucketing": lambda f: [f["bucketing_sentence"]],
}

JUDGES: dict[str, list[Callable[[dict], list[Target]]]] = {
    L1: [_cudnn, _roofline],
    L1B: [_triton],
    HARDWARE: [_training],
    L5A: [_amp, _bucketing],
    L5B: [_graphs],
    L8C: [_flash],
}


def _statement(rule: str, figures: dict, target: Target) -> str | None:
    """The lecture's sentence that reports this measurement (its speed-up to two decimals), if it printed one."""
    try:
        sentences = STATEMENTS[rule](figures) if rule in STATEMENTS else []
    except KeyError:
        return None
    measured = f"{target.measured:.2f}x"
    return next((s for s in sentences if measured in s), None)  # the sentence names the very figure judged


def judge(figures: dict[str, dict | None], gpu: bool) -> list[LessonRow]:
    """A row per GPU lesson: measured against required where its lecture ran on a GPU and handed back its figures."""
    rows = []
    for lecture, judges in JUDGES.items():
        found = figures.get(lecture)
        for rule in judges:
            name = rule.__name__.lstrip("_")
            if found is None:
                rows.append(LessonRow(name, lecture, None, "", "n/a" if lecture not in figures else "fail"))
                continue
            try:
                targets = rule(found)
            except (KeyError, LookupError, ZeroDivisionError, TypeError) as missing:
                if not gpu:  # a CPU run hands back no GPU figures
                    rows.append(LessonRow(f"{name} (no GPU here)", lecture, None, "", "n/a"))
                    continue
                rows.append(LessonRow(f"{name}: its figures are missing or malformed ({type(missing).__name__}: {missing})", lecture, None, "", "fail"))
                continue
            for t in targets:
                if not gpu:
                    rows.append(LessonRow(f"{t.what} (no GPU here)", lecture, t.measured, t.required, "n/a"))
                    continue
                statement = _statement(name, found, t) if t.status == "fail" else None
                rows.append(LessonRow(t.what, lecture, t.measured, t.required, "stated" if statement else t.status, statement))
    return rows
