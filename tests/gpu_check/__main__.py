"""Run the GPU check: ``python -m tests.gpu_check`` (``make gpu-check``); ``--help`` lists what can be narrowed.

Order, so that the lessons' timings are taken with the GPU to themselves: the lectures with GPU lessons (full profile,
one at a time), with beside them only the quick lectures whose work is on the CPU (``BESIDE_THE_LESSONS``, one at a
time, on cores the lessons leave idle); then, side by side, the quick benchmarks (whose timing targets read n/a in a
quick run; ``--bench-processes`` at once), the other lectures (quick profile, ``--jobs`` at a time), the suite and the
memory models. The report is rewritten after every part, so a run cut short still says what it found.
"""
from __future__ import annotations

import argparse
import datetime
import io
import json
import re
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from . import runs
from .report import failures, markdown
from .wheels import LEFT_BEHIND, NEEDS_MODEL, assemble_model

ROOT = runs.ROOT
GPU_LECTURES = ("01-gpu-architecture-and-benchmarking.ipynb", "02-hardware-ecosystem.ipynb", "03-gpu-programming-model.ipynb",
                "05a-mixed-precision-and-data-pipelines.ipynb", "05b-profiling-and-compilation.ipynb")
# quick lectures whose demos run on the CPU (gloo process groups, loaders, processes): they share the machine with the
# GPU lessons without touching their timings
BESIDE_THE_LESSONS = ("02-os-and-distributed-recap.ipynb", "03-data-parallel-training.ipynb", "03b-data-loading-and-elastic-training.ipynb")
NOT_BENCHED = {"reference_grades": "grades assignments with nbgrader", "grading": "grades assignments with nbgrader"}
NEEDS_MODEL_BENCH = "llm"  # SmolLM2's benchmark, run where its wheel's parts arrived
# The suite's modules whose code takes another path on a GPU (or on torch's GPU stack): all of their tests but the
# notebook, grading and browser lanes. The rest of the suite (and torch 2.11 itself) is proved on the CPU.
GPU_PATH = re.compile(r"cuda|gpu|pick_device|nccl|triton|EDL_DEVICE|torch\.compile|profiler")
# every benchmark, quick: make bench QUICK=1 runs beside the suite; SmolLM2's tests compare with transformers on the
# CPU (lecture 8b and the llm benchmark take its GPU path)
NOT_ON_THE_GPU = ["tests/test_bench_suite.py", "tests/test_llm_model.py", "tests/test_llm_engine.py", "tests/test_llm_serving.py"]
OFFLINE = ["--deselect=tests/test_gpu_check.py::test_a_dry_run_on_the_cpu_downloads_installs_runs_and_reports"]  # needs PyPI
# CPU paths inside GPU-path modules that the image's own packages cannot run; CI proves them at the kit's pins
_INTERPRETER = ("Triton's interpreter, the CPU path: CI runs it with the kit's Triton and NumPy; the image's are other versions "
                "(Triton 3.6's interpreter fails inside Triton under NumPy 2.5, helpers.hardware.kernels.interpreter_hint)")
NOT_ON_THE_IMAGE = {"tests/test_kernels.py::test_triton_kernels_agree_with_torch_in_the_interpreter": _INTERPRETER,
                    "tests/test_kernels.py::test_kernels_written_after_triton_for_run_in_process_on_a_cpu": _INTERPRETER}


def gpu_path_tests() -> list[str]:
    """pytest arguments: the modules that mention a GPU path, less the lanes and tests that cannot run on the GPU machine."""
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if GPU_PATH.search(p.read_text()))
    return [*(f for f in files if f not in NOT_ON_THE_GPU), "-m", "not (notebooks or grading or browser)", *OFFLINE,
            *(f"--deselect={test}" for test in NOT_ON_THE_IMAGE)]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", type=Path, default=ROOT / "build/gpu-wheels", help="the wheels make gpu-wheels downloaded")
    parser.add_argument("--model", type=Path, default=ROOT / "build/gpu-model", help="SmolLM2's wheel in parts (make gpu-wheels)")
    parser.add_argument("--site", type=Path, default=ROOT / "build/gpu-site", help="where they are installed")
    parser.add_argument("--out", type=Path, default=ROOT / "build/gpu-check", help="gpu-check.json, gpu-check.md and details.tar.gz")
    parser.add_argument("--work", type=Path, help="executed notebooks and logs (default: OUT/work); packed into details.tar.gz")
    parser.add_argument("--lectures", help="comma-separated parts of notebook names to run (default: every lecture that travels)")
    parser.add_argument("--quick", action="store_true", help="every lecture in its quick profile (a dry run on a CPU)")
    parser.add_argument("--full", help="comma-separated parts of the names of the lectures to run in their full profile (default: "
                                       "those with GPU lessons, GPU_LECTURES)")
    parser.add_argument("--alone", help="of those, the ones to run first, one at a time, with nothing beside them (default: all)")
    parser.add_argument("--tests", nargs=argparse.REMAINDER, help="pytest arguments instead of the GPU-path tests (gpu_path_tests)")
    parser.add_argument("--bench", help="comma-separated benchmarks (default: all but the grading ones); 'none' for none")
    parser.add_argument("--memory-cases", type=int, help="how many memory models (default: all)")
    parser.add_argument("--memory-probe", action="store_true", help="also the TransformerLM probe: estimate and allocator per "
                                                                      "attention backend, fp32 and AMP (memory_models.attention_probe)")
    parser.add_argument("--skip", default="", help="comma-separated parts to leave out: lectures, bench, tests, memory")
    parser.add_argument("--jobs", type=int, default=3, help="quick-profile lectures at a time")
    parser.add_argument("--bench-processes", type=int, default=3, help="benchmark processes side by side")
    parser.add_argument("--test-workers", type=int, default=8, help="pytest-xdist workers for the suite, where it is installed "
                                                                   "(the GPU image has it); 1 runs it in one process")
    parser.add_argument("--lecture-timeout", type=float, default=300, help="seconds one lecture may take")
    parser.add_argument("--budget", type=float, default=540, help="seconds for the whole check; later parts get what is left")
    return parser.parse_args(argv)


def _lectures(selection: str | None, model_missing: str | None) -> tuple[list[Path], list[dict]]:
    """The notebooks to run, and a row for each lecture whose packages stay behind (or whose model did not arrive:
    ``model_missing`` says why)."""
    from helpers.course.notebooks import find_notebooks

    every = find_notebooks(ROOT / "lectures")
    if selection:
        parts = [s.strip() for s in selection.split(",") if s.strip()]
        every = [nb for nb in every if any(p in nb.name for p in parts)]
        if not every:
            raise SystemExit(f"--lectures {selection!r} matches no lecture notebook under lectures/")
    behind = {**LEFT_BEHIND, **({name: model_missing for name in NEEDS_MODEL} if model_missing else {})}
    left = [{"notebook": nb.name, "profile": "-", "status": "left behind", "seconds": 0.0, "error": behind[nb.name]}
            for nb in every if nb.name in behind]
    return [nb for nb in every if nb.name not in behind], left


class Check:
    """The report being built, written out after every part."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.out = args, args.out.resolve()
        self.work = (args.work or args.out / "work").resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + args.budget
        self.started = time.monotonic()
        self.report: dict = {"started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                             "command": " ".join(sys.argv), "lectures": [], "lessons": [], "tests": [], "bench": [], "memory": [], "parts": {}}

    def left(self, floor: float = 30.0) -> float:
        return max(floor, self.deadline - time.monotonic())

    def part(self, name: str, seconds: float) -> None:
        self.report["parts"][name] = round(seconds, 1)
        self.write()

    def write(self) -> None:
        self.report["seconds"] = round(time.monotonic() - self.started, 1)
        self.report["failures"] = failures(self.report)
        self.report["ok"] = not self.report["failures"]
        (self.out / "gpu-check.json").write_text(json.dumps(self.report, indent=1, default=str))
        (self.out / "gpu-check.md").write_text(markdown(self.report))


def _timed(function, *args):
    start = time.monotonic()
    result = function(*args)
    return result, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    check = Check(args)
    model, model_missing = assemble_model(args.model, check.work / "model")
    check.report["install"] = runs.install_wheels(args.wheels, args.site, (model,) if model else ())
    check.report["install"]["model"] = model.name if model else model_missing
    check.report["environment"] = env = runs.environment()
    check.write()
    print(f"GPU check on {env['device']} (torch {env['torch']}, CUDA {env['cuda']}, driver {env['driver']}); "
          f"{check.report['install']['wheels']} wheels installed", flush=True)
    gpu = env["gpu"]

    notebooks, left_behind = _lectures(args.lectures, model_missing) if "lectures" not in skip else ([], [])
    check.report["lectures"] += left_behind
    full = [] if args.quick else _matching(notebooks, args.full, GPU_LECTURES)
    alone = _matching(full, args.alone, [nb.name for nb in full])
    quick = [nb for nb in notebooks if nb not in full]
    lecture_out = check.work / "lectures"
    if alone:  # the GPU lessons, one at a time, with only CPU work beside them
        on_the_cpu = [nb for nb in quick if nb.name in BESIDE_THE_LESSONS]
        quick = [nb for nb in quick if nb not in on_the_cpu]
        with ThreadPoolExecutor(max_workers=2) as pool:
            lessons_run = pool.submit(_timed, runs.run_lectures, alone, False, lecture_out, args.lecture_timeout, 1, check.deadline)
            cpu_run = pool.submit(_timed, runs.run_lectures, on_the_cpu, True, lecture_out, args.lecture_timeout, 1, check.deadline)
            for future, name in ((lessons_run, "lectures with GPU lessons (full profile, one at a time)"),
                                 (cpu_run, "quick lectures on the CPU, beside them")):
                rows, seconds = future.result()
                check.report["lectures"] += runs.as_dicts(rows)
                check.part(name, seconds)
    beside = [nb for nb in full if nb not in alone]

    names = _bench_names(args.bench) if "bench" not in skip else []
    check.report["not_benched"] = dict(NOT_BENCHED)
    if model_missing and NEEDS_MODEL_BENCH in names:
        names.remove(NEEDS_MODEL_BENCH)
        check.report["not_benched"][NEEDS_MODEL_BENCH] = model_missing
    with ThreadPoolExecutor(max_workers=5) as pool:  # what compares no timings across processes runs side by side
        started = {}
        if names:
            started[pool.submit(_timed, runs.run_bench, names, True, check.work, check.left(), args.bench_processes)] = "make bench QUICK=1"
        for chosen, is_quick, name in ((beside, False, "lectures in full profile, side by side"), (quick, True, "other lectures (quick profile)")):
            if chosen:
                started[pool.submit(_timed, runs.run_lectures, chosen, is_quick, lecture_out, args.lecture_timeout, args.jobs,
                                    check.deadline)] = name
        if "tests" not in skip:
            started[pool.submit(_timed, _suite, args.tests, check)] = "tests"
        if "memory" not in skip:
            started[pool.submit(_timed, runs.run_memory, args.memory_cases, not gpu, check.work, check.left(),
                                args.memory_probe)] = "memory models"
        for future in as_completed(started):
            found, seconds = future.result()
            name = started[future]
            if name == "make bench QUICK=1":
                check.report["bench"] = runs.as_dicts(found[0])
            elif name == "tests":
                check.report["tests"] = found
            elif name == "memory models":
                check.report["memory"] = found
            else:
                check.report["lectures"] += runs.as_dicts(found)
            check.part(name, seconds)

    from .lessons import judge
    figures = {r["notebook"]: r.get("figures") for r in check.report["lectures"] if r["status"] != "left behind"}
    check.report["lessons"] = runs.as_dicts(judge(figures, gpu))
    check.write()
    _pack_details(check.work, check.out / "details.tar.gz")
    print(markdown(check.report))
    print(f"wrote {check.out / 'gpu-check.json'} and {check.out / 'gpu-check.md'}")
    return 0 if check.report["ok"] else 1


def _matching(notebooks: list[Path], selection: str | None, default) -> list[Path]:
    """The notebooks whose names contain one of the comma-separated parts of ``selection`` (default: of ``default``)."""
    parts = default if selection is None else [p.strip() for p in selection.split(",") if p.strip()]
    return [nb for nb in notebooks if any(p in nb.name for p in parts)]


def _bench_names(selection: str | None) -> list[str]:
    """The benchmarks asked for (default: all but those in NOT_BENCHED)."""
    from tests.bench.__main__ import discover

    every = discover()
    if selection is None:
        return [name for name in every if name not in NOT_BENCHED]
    chosen = [] if selection == "none" else [s.strip() for s in selection.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(every))
    if unknown:
        raise SystemExit(f"--bench: no benchmark named {', '.join(unknown)}; there are {', '.join(every)}")
    return chosen


def _suite(selection: list[str] | None, check: Check) -> list[dict]:
    """The GPU-path tests (``gpu_path_tests``), or the pytest arguments given."""
    workers = ["-n", str(check.args.test_workers), "--dist", "loadfile"] if check.args.test_workers > 1 and _has("xdist") else []
    found, _ = runs.run_tests([*(selection or gpu_path_tests()), *workers], check.work, check.left())
    left_out = [] if selection else [runs.TestRow(test, "not run", 0.0, why) for test, why in NOT_ON_THE_IMAGE.items()]
    return runs.as_dicts([*found, *left_out])


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _pack_details(work: Path, archive_path: Path) -> None:
    """The executed notebooks (text outputs only: charts are most of their bytes), the pytest and benchmark logs, in one
    archive beside the report."""
    with tarfile.open(archive_path, "w:gz") as archive:
        for path in sorted(work.rglob("*")):
            if not path.is_file() or path.suffix not in (".ipynb", ".log", ".xml", ".json"):
                continue
            data = _without_images(path.read_bytes()) if path.suffix == ".ipynb" else path.read_bytes()
            info = tarfile.TarInfo(str(path.relative_to(work)))
            info.size, info.mtime = len(data), int(path.stat().st_mtime)
            archive.addfile(info, io.BytesIO(data))


def _without_images(notebook: bytes) -> bytes:
    nb = json.loads(notebook)
    for cell in nb.get("cells", []):
        for output in cell.get("outputs", []):
            for kind in [k for k in output.get("data", {}) if k.startswith("image/") or k == "text/html"]:
                del output["data"][kind]
    return json.dumps(nb, indent=1).encode()


if __name__ == "__main__":
    sys.exit(main())
