"""`make bench`: the runner prints tables and writes JSON; a bad benchmark name is a clear error."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_quick_benchmarks_write_json_and_print_tables(tmp_path):
    result = run_bench("--quick", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    for name in ("matmul", "transfer"):
        payload = json.loads((tmp_path / f"{name}.json").read_text())
        assert payload["reports"] and payload["reports"][0]["rows"]
        assert all(t["status"] in ("pass", "n/a") for t in payload["targets"])
    assert "GFLOP/s" in result.stdout and "targets" in result.stdout


def test_unknown_benchmark_is_named_in_the_error(tmp_path):
    result = run_bench("--only", "nonsense", "--out", str(tmp_path))
    assert result.returncode == 2
    assert "nonsense" in result.stderr and "matmul" in result.stderr
