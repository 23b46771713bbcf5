"""`make bench`: the runner prints tables and writes JSON; a bad benchmark name is a clear error."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.hardware.kernels import KernelPoint, KernelTimings
from helpers.training.launch_overhead import ARITHMETIC, COMPILED, EAGER, GRAPH, REDUCE_OVERHEAD, LaunchOverhead, LaunchVariant

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """Every benchmark once with --quick (minutes: it serves, grades and trains); the tests below read its output."""
    out = tmp_path_factory.mktemp("bench")
    return run_bench("--quick", "--out", str(out)), out


def test_quick_benchmarks_write_json_and_print_tables(quick_run):
    result, out = quick_run
    assert result.returncode == 0, result.stderr
    from tests.bench.__main__ import discover

    for name in discover():  # every benchmark wrote its report
        payload = json.loads((out / f"{name}.json").read_text())
        assert payload["reports"] or payload["targets"], name
    for name in ("matmul", "transfer", "grading", "reference_grades"):  # the stand-in is graded alike every way
        payload = json.loads((out / f"{name}.json").read_text())
        assert payload["reports"] and payload["reports"][0]["rows"]
        assert all(t["status"] in ("pass", "n/a") for t in payload["targets"])
    assert "GFLOP/s" in result.stdout and "targets" in result.stdout


def test_unknown_benchmark_is_named_in_the_error(tmp_path):
    result = run_bench("--only", "nonsense", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "nonsense" in result.stderr and "matmul" in result.stderr


def test_the_kernels_benchmark_reports_the_gpu_only_targets_as_n_a_on_a_cpu(quick_run):
    result, out = quick_run
    assert result.returncode == 0, result.stderr  # a quick run checks no timings, so nothing it checks depends on the load
    targets = {t["what"]: t for t in json.loads((out / "kernels.json").read_text())["targets"]}
    gpu_only = [what for what in targets if what.startswith(("CUDA graph replay", "torch.compile (reduce-overhead)"))]
    assert len(gpu_only) == 2 and all(targets[what]["status"] == "n/a" and "GPU" in what for what in gpu_only)
    assert targets["Triton kernels that agree with torch.matmul"]["measured"] == 2  # checked in Triton's interpreter


def test_the_plain_cuda_event_loop_refuses_a_cpu_device():
    from tests.bench.bench_matmul import event_loop_gflops

    with pytest.raises(ValueError, match="CUDA events time GPU work only"):
        event_loop_gflops(64, torch.float32, "cpu")


def _launch(rows: dict[str, tuple[float | None, float | None]]):
    """A launch-overhead report with the given (speed-up, set-up seconds) per variant, as a GPU run would fill it."""
    report_rows = [LaunchVariant(name, None if speedup is None else 1e-4 / speedup, None, speedup, setup, 0.0, "measured" if speedup else "n/a here")
                   for name, (speedup, setup) in rows.items()]
    return LaunchOverhead(report_rows, 64, 256, torch.device("cuda"), [])


def test_launch_targets_read_what_a_gpu_run_measures():
    from tests.bench.bench_kernels import launch_targets

    report = _launch({EAGER: (1.0, None), ARITHMETIC: (20.0, None), GRAPH: (8.0, 0.02), COMPILED: (1.2, 12.0), REDUCE_OVERHEAD: (9.0, 41.0)})
    targets = {t.what: t for t in launch_targets(report, compiled=True)}
    assert targets["eager chain: share of each op that is overhead"].measured == pytest.approx(95)
    assert targets["CUDA graph replay vs eager"].status == "pass"
    assert targets["torch.compile (default) vs eager"].status == "fail"  # 1.2x < 1.5x
    assert targets["longest compile of the chain"].measured == 41.0 and targets["longest compile of the chain"].status == "fail"


def test_kernel_targets_compare_at_the_largest_size_both_kernels_ran():
    from tests.bench.bench_kernels import kernel_targets

    def point(kernel, n, gflops):
        return KernelPoint(kernel, n, n, 2 * n**3 / gflops / 1e9, gflops, 0.0, 0.0, "HBM")

    # the rows of a GPU run (the report itself is built for the CPU: naming a CUDA device asks the driver for its name)
    timings = KernelTimings([point("triton naive", 512, 100), point("triton tiled", 512, 900), point("triton tiled", 1024, 1500)],
                            torch.device("cpu"), "torch.matmul (cuBLAS)", None, [], None)
    (target,) = kernel_targets(timings, gpu=True)
    assert "n=512" in target.what and target.measured == pytest.approx(9) and target.status == "pass"
