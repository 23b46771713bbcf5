"""The teaching kernels: naive, reordered and blocked CPU loops, the Triton pair, their checks, timings and memory spaces."""
from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest
import torch

from helpers.core.report import format_bytes
from helpers.hardware import gpu_kernel_timings, kernel_matmul, launch_plan, matmul_kernels, memory_levels, memory_spaces, triton_check
from helpers.hardware.kernels import CPU_KERNELS, GPU_KERNELS, KernelPoint, KernelTimings, panel_rows_for, triton_available

ODD_SHAPES = [(37, 45, 29), (1, 7, 1), (65, 130, 17)]  # (m, k, n): no multiple of any block or panel


def operands(m: int, k: int, n: int, dtype=torch.float32):
    generator = torch.Generator().manual_seed(m * 1000 + k * 10 + n)
    return torch.randn(m, k, generator=generator, dtype=dtype), torch.randn(k, n, generator=generator, dtype=dtype)


@pytest.mark.parametrize("kernel", CPU_KERNELS)
@pytest.mark.parametrize("shape", ODD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cpu_kernels_agree_with_torch_on_odd_sizes(kernel, shape):
    a, b = operands(*shape)
    torch.testing.assert_close(kernel_matmul(a, b, kernel), a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("panel_rows", [1, 3, 8, 1000])
def test_blocked_kernel_agrees_whatever_the_panel(panel_rows):
    a, b = operands(23, 50, 31)
    torch.testing.assert_close(kernel_matmul(a, b, "blocked", panel_rows=panel_rows), a @ b, rtol=1e-4, atol=1e-4)


def test_cpu_kernels_take_non_contiguous_inputs():
    a, b = operands(40, 30, 20)
    torch.testing.assert_close(kernel_matmul(b.T, a.T, "reordered"), b.T @ a.T, rtol=1e-4, atol=1e-4)


def test_panel_of_b_fills_at_most_half_of_l2():
    l2 = 1 << 20
    for n in (64, 1000, 4096, 100_000):
        rows = panel_rows_for(n, l2)
        assert rows >= 8
        assert rows == 8 or rows * n * 4 <= l2 // 2 < (rows + 1) * n * 4


@pytest.mark.skipif(not triton_available()[0], reason=f"triton is not importable here: {triton_available()[1]}")
def test_triton_kernels_agree_with_torch_in_the_interpreter():
    check = triton_check(m=17, n=13, k=21, device="cpu")
    assert [r.kernel for r in check.rows] == list(GPU_KERNELS)
    for row in check.rows:
        assert "interpreter" in row.mode
        assert row.agrees is True, f"{row.kernel}: max error {row.max_error}"
        assert 0 <= row.max_error < 1e-3
    assert "speed" in " ".join(check.notes)  # says interpreter runs are not timings


def test_triton_check_rejects_bad_sizes():
    with pytest.raises(ValueError, match="m must be a positive integer"):
        triton_check(m=0)


@pytest.mark.parametrize(
    ("a", "b", "kernel", "error", "message"),
    [
        (torch.ones(3, 4), torch.ones(5, 2), "naive", ValueError, r"cannot multiply \(3, 4\) by \(5, 2\)"),
        (torch.ones(4), torch.ones(4, 2), "blocked", ValueError, "must be a 2-D matrix"),
        (torch.ones(2, 3, 4), torch.ones(4, 2), "reordered", ValueError, "must be a 2-D matrix"),
        (torch.ones(3, 4, dtype=torch.float64), torch.ones(4, 2, dtype=torch.float64), "naive", TypeError, "take torch.float32"),
        (torch.ones(3, 4), torch.ones(4, 2, dtype=torch.float64), "naive", TypeError, "convert both to one dtype"),
        (torch.ones(3, 4, dtype=torch.int32), torch.ones(4, 2, dtype=torch.int32), "triton tiled", TypeError, "Triton kernels take"),
        (torch.ones(3, 4), torch.ones(4, 2), "triton naive", ValueError, "run on a CUDA GPU"),
        (torch.ones(3, 4), torch.ones(4, 2), "strassen", ValueError, "unknown kernel 'strassen'"),
        ([[1.0]], torch.ones(1, 1), "naive", TypeError, "must be a torch.Tensor"),
    ],
)
def test_bad_inputs_get_clear_errors(a, b, kernel, error, message):
    with pytest.raises(error, match=message):
        kernel_matmul(a, b, kernel)


def test_cpu_timings_report_holds_every_kernel_and_the_library():
    report = matmul_kernels([20, 33], device="cpu", rows=9, naive_up_to=20, min_run_time=0.01)
    assert report.threads == 1
    assert [(r.kernel, r.n) for r in report.rows if r.kernel == "naive"] == [("naive", 20)]  # not above naive_up_to
    library = report.find(kernel=report.library, n=33)
    assert library.pct_of_library == pytest.approx(100)
    for row in report.rows:
        assert row.m == 9
        assert row.gflops == pytest.approx(2 * 9 * row.n**2 / row.seconds / 1e9)
        assert row.pct_of_library == pytest.approx(100 * report.find(kernel=report.library, n=row.n).seconds / row.seconds)
        assert row.max_error < 1e-4
        assert row.b_fits_in == next(lv.name for lv in memory_levels(torch.device("cpu")) if row.b_bytes <= lv.bytes)
    text = report.table()
    assert "% of library" in text and "max |error| vs torch" in text and "ONE core" in text
    assert "naive kernel ran only up to n=20" in text and "says nothing about n=33" in text
    ax = report.plot()
    assert [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")] == [*CPU_KERNELS, report.library]
    assert "GFLOP/s" in ax.get_ylabel()


def test_timings_reject_bad_sizes():
    with pytest.raises(ValueError, match="sizes must be positive integers"):
        matmul_kernels([0, 16], device="cpu")
    with pytest.raises(ValueError, match="rows must be a positive integer"):
        matmul_kernels([16], device="cpu", rows=-1)
    with pytest.raises(ValueError, match="rounds must be a positive integer"):
        matmul_kernels([16], device="cpu", rounds=0)


def _timings(seconds: dict[str, dict[int, float]]) -> KernelTimings:
    rows = [KernelPoint(kernel, n, n, s, 2 * n**3 / s / 1e9, 0.0, 0.0, "L3", 4 * n * n) for kernel, by_n in seconds.items() for n, s in by_n.items()]
    return KernelTimings(rows, torch.device("cpu"), "torch.matmul (oneDNN/MKL)", 1, [], None)


def test_conclusions_follow_the_numbers():
    report = _timings({"naive": {64: 8.0}, "reordered": {64: 1.0, 512: 4.0}, "blocked": {64: 1.02, 512: 1.0},
                       "torch.matmul (oneDNN/MKL)": {64: 0.5, 512: 0.5}})
    text = " ".join(report.notes)
    assert "At n=64" in text and "reordered is 8.0x faster than naive" in text
    assert "blocked is 4.0x faster than reordered" in text
    assert "paid off at n = 512" in text and "made no clear difference at n = 64" in text
    slower = _timings({"reordered": {64: 1.0}, "blocked": {64: 2.0}})
    assert "blocked is 2.0x SLOWER than reordered" in " ".join(slower.notes)
    assert "cost time" in " ".join(slower.notes)


def test_gpu_timings_without_a_gpu_say_so_and_time_nothing():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CPU-side path is not taken")
    report = gpu_kernel_timings([64], device="cpu")
    assert report.rows == [] and "No GPU here" in report.notes[0]
    ax = report.plot()
    assert "nothing timed" in ax.texts[0].get_text()


def test_cpu_memory_spaces_sizes_come_from_the_machine():
    spaces = memory_spaces("cpu", measure=False)
    names = [r.level for r in spaces.rows]
    levels = memory_levels(torch.device("cpu"))
    assert spaces.find(level="RAM").size_bytes == psutil.virtual_memory().total
    for level in levels[:-1]:
        assert spaces.find(level=f"{level.name} cache").size_bytes == level.bytes
    assert names[-1] == "RAM" and all(r.measured_gbs is None for r in spaces.rows)
    assert "physical cores" in spaces.notes[0]


def test_cpu_memory_spaces_measure_each_level():
    spaces = memory_spaces("cpu", measure=True)
    measured = [r for r in spaces.rows if "registers" not in r.level]
    assert measured and all(0 < r.slowest_gbs <= r.measured_gbs for r in measured)  # the fastest of three readings, and the slowest
    assert "read GB/s (measured)" in spaces.table() and "slowest reading" in spaces.table()
    caches = memory_levels(torch.device("cpu"))[:-1]
    if len(caches) >= 2:  # the last cache is shared by the chip's cores: probed with 4x the level above it, at most half of it
        assert spaces.find(level=f"{caches[-1].name} cache").how.startswith(f"sum a {format_bytes(min(caches[-1].bytes // 2, 4 * caches[-2].bytes))} buffer")


def test_launch_plans_cover_every_output_and_tiles_read_less():
    plans = launch_plan([100, 256], block_m=32, block_n=16)
    for n in (100, 256):
        naive, tiled = plans.find(kernel="triton naive", n=n), plans.find(kernel="triton tiled", n=n)
        for plan in (naive, tiled):
            assert plan.programs * plan.outputs_per_program >= n * n  # the grid covers C
        assert tiled.loads_from_global < naive.loads_from_global / 10
    larger = launch_plan([256], block_m=64, block_n=64).find(kernel="triton tiled", n=256)
    assert larger.loads_from_global < plans.find(kernel="triton tiled", n=256).loads_from_global
    with pytest.raises(ValueError, match="positive integers"):
        launch_plan([0])


def test_timings_measure_the_kernels_they_are_given():
    """A notebook's own kernels are what gets timed and checked: a wrong one shows its error, and only given names appear."""
    calls = []

    def off_by_one(a, b):
        calls.append(a.shape)
        return a @ b + 1

    report = matmul_kernels([24], device="cpu", rows=5, min_run_time=0.01, rounds=1,
                            kernels={"reordered": lambda a, b: kernel_matmul(a, b, "reordered"), "off by one": off_by_one})
    assert {r.kernel for r in report.rows} == {"reordered", "off by one", report.library}
    assert report.find(kernel="off by one").max_error == pytest.approx(1.0, abs=1e-4)
    assert report.find(kernel="reordered").max_error < 1e-4
    assert calls and calls[0] == (5, 24)


def test_triton_check_of_given_kernels_names_the_fix_when_they_cannot_run_on_a_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    if not triton_available()[0] or torch.cuda.is_available():
        pytest.skip("needs triton and no GPU: the path where compiled kernels meet CPU tensors")

    def compiled_only(a, b):
        raise ValueError("Pointer argument cannot be accessed from Triton (cpu tensor?)")

    with pytest.raises(RuntimeError, match="triton_for"):
        triton_check({"mine": compiled_only}, m=3, n=3, k=3, device="cpu")


@pytest.mark.skipif(not triton_available()[0], reason=f"triton is not importable here: {triton_available()[1]}")
def test_kernels_written_after_triton_for_run_in_process_on_a_cpu(tmp_path):
    """As Lecture 1b does: triton_for switches the interpreter on, then a kernel defined afterwards runs on CPU tensors."""
    script = tmp_path / "cell.py"
    script.write_text(
        "import torch\n"
        "from helpers.hardware import triton_check, triton_for\n"
        "triton, tl = triton_for('cpu')\n"
        "@triton.jit\n"
        "def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):\n"
        "    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    inside = offsets < n\n"
        "    tl.store(y_ptr + offsets, 2 * tl.load(x_ptr + offsets, mask=inside), mask=inside)\n"
        "x = torch.arange(10.0)\n"
        "y = torch.empty(10)\n"
        "double[(3,)](x, y, 10, BLOCK=4)\n"
        "assert torch.equal(y, 2 * x), y\n"
        "from helpers.hardware import triton_kernels\n"
        "check = triton_check({'naive': triton_kernels.naive_matmul, 'tiled': triton_kernels.tiled_matmul}, m=9, n=7, k=5, device='cpu')\n"
        "assert all(r.agrees for r in check.rows) and 'interpreter' in check.rows[0].mode, check\n"
        "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "interpreter" in done.stdout and done.stdout.strip().endswith("ok")


def test_an_interpreter_failure_from_the_installed_versions_says_which_and_what_to_do():
    """The GPU image (Triton 3.6, NumPy 2.5) failed the interpreter with a bare TypeError inside Triton."""
    from helpers.hardware.kernels import interpreter_hint

    hint = interpreter_hint("TypeError: only 0-dimensional arrays can be converted to Python scalars")
    assert hint and "NumPy" in hint and "Triton 3.8" in hint and "numpy<2.5" in hint
    assert interpreter_hint("IndexError: out of range") is None  # a kernel's own bug is not blamed on the versions
