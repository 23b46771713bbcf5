"""helpers.hardware.workingset: cache sizes, the training working set, and the epoch-time estimate against hidden size."""
from __future__ import annotations

import math
import shutil
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers.core.models import BasicFCModel, LeNet  # noqa: E402
from helpers.hardware.workingset import cpu_caches, estimate_training_for, training_working_set_bytes  # noqa: E402


@pytest.mark.skipif(not sys.platform.startswith("linux") or not shutil.which("lscpu"), reason="reads Linux's /sys; lscpu cross-checks it")
def test_cache_sizes_agree_with_lscpu():
    caches = {c.name: c.bytes for c in cpu_caches()}
    listing = subprocess.run(["lscpu", "-C=NAME,ONE-SIZE", "-B"], capture_output=True, text=True).stdout.splitlines()[1:]
    expected = {name: int(size) for name, size in (line.split() for line in listing if line.strip()) if name != "L1i"}
    assert caches == expected
    assert list(caches.values()) == sorted(caches.values())


def test_working_set_of_the_mlp_is_one_sgd_steps_peak():
    hidden, batch = 100, 8
    parameters = 4 * (784 * hidden + hidden + hidden * 10 + 10)
    floor = 2 * parameters + 4 * batch * 784  # weights and their gradients, and the input, coexist at the end of backward
    everything = floor + 4 * (batch * hidden * 2 + batch * 10)  # plus every layer output (fc1, relu, fc2) at once
    working_set = training_working_set_bytes(BasicFCModel(hidden), torch.randn(batch, 1, 28, 28))
    assert floor <= working_set <= everything


def test_estimate_training_for_extrapolates_measured_steps():
    sweep = estimate_training_for(hidden_sizes=(16, 64, 256), epochs=10, batch_size=8, dataset_size=1000, min_run_time=0.01, progress=False)
    assert [r.hidden for r in sweep.rows] == [16, 64, 256] and sweep.steps_per_epoch == math.ceil(1000 / 8)
    sets = [r.working_set_bytes for r in sweep.rows]
    assert sets == sorted(sets) and len(set(sets)) == 3
    for r in sweep.rows:
        assert r.step_s > 0 and r.epoch_s == pytest.approx(r.step_s * 125) and r.estimate_s == pytest.approx(10 * r.epoch_s)
        assert r.ns_per_parameter == pytest.approx(r.step_s / r.parameters * 1e9)
        assert r.fits_in == next(level.name for level in sweep.levels if r.working_set_bytes <= level.bytes)
        if sys.platform.startswith("linux") and not torch.cuda.is_available():  # counted with getrusage; not on a GPU
            assert r.page_faults_per_step is not None, "page faults are counted for every CPU step"
    # The last level is the device's main memory (RAM on a CPU, GPU memory on a GPU), the largest of all.
    assert sweep.levels[-1].bytes == max(level.bytes for level in sweep.levels)
    assert sweep.ram_hidden > 1_000_000  # a MLP filling main memory is far beyond any size run
    assert any("not run" in note for note in sweep.notes)
    left, right = sweep.plot()
    assert left.lines and len(right.lines) >= 2
    assert "10 epochs" in str(sweep)


def test_one_hidden_size_is_enough():
    sweep = estimate_training_for(hidden_sizes=(32,), epochs=2, batch_size=4, dataset_size=8, min_run_time=0.01, progress=False)
    assert len(sweep.rows) == 1 and sweep.ram_hidden > 32 and sweep.rows[0].estimate_s == pytest.approx(4 * sweep.rows[0].step_s)


# In an interpreter of its own: how a long-lived process (this one, after hundreds of tests) gets its memory from
# glibc depends on what it allocated and freed before, and is not what the counter is about.
FAULTS_OF_FRESH_MEMORY = """
import torch
from helpers.hardware.workingset import page_faults_per_call
print(page_faults_per_call(lambda: torch.ones(64 * 2**20 // 4).sum()), page_faults_per_call(lambda: None))
"""


def test_page_faults_are_counted_for_fresh_memory():
    if not sys.platform.startswith("linux"):
        pytest.skip("counts glibc's behaviour: large allocations are mapped afresh and handed back")
    counted = subprocess.run([sys.executable, "-c", FAULTS_OF_FRESH_MEMORY], capture_output=True, text=True, check=True)
    fresh, nothing = map(float, counted.stdout.split())  # 64 MiB: mapped, touched, handed back, each call
    assert fresh >= 0.9 * 64 * 2**20 / 4096 and nothing < 100


def test_a_model_without_a_hidden_size_is_explained():
    with pytest.raises(TypeError, match="does not take a hidden size"):
        estimate_training_for(LeNet, hidden_sizes=(8,), progress=False)


def test_working_set_steps_are_judged_at_each_boundary_against_the_noise():
    # the audited run: time per parameter fell across L3 -> RAM and rose only where fresh pages began; no boundary "rose"
    from helpers.hardware.workingset import MemoryLevel, SizePoint, WorkingSetSweep

    sizes = ((256, 1.58, "L3", 4.08, 0), (1024, 6.27, "L3", 2.48, 0), (4096, 24.99, "L3", 4.84, 0),
             (8192, 49.96, "RAM", 4.41, 0), (12288, 74.93, "RAM", 7.25, 9409), (16384, 99.9, "RAM", 7.84, 12545))
    rows = [SizePoint(h, 1000, int(mib * 2**20), fits, 0.01, ns, faults, 1.0, 1.0, {}, 1.1) for h, mib, fits, ns, faults in sizes]
    levels = [MemoryLevel("L3", 32 * 2**20), MemoryLevel("RAM", 2**34)]
    sweep = WorkingSetSweep(rows, model_name="m", levels=levels, device=torch.device("cpu"), epochs=1, batch_size=8,
                            steps_per_epoch=10, threads=1)
    assert [verdict for *_, verdict in sweep.steps()] == ["fell", "rose", "tie", "rose", "tie"]
    verdict = sweep.notes[-2]
    assert verdict.startswith("No level boundary raised the time per parameter") and "fresh pages" in verdict
    rows[3].ns_per_parameter = 9.0  # a clear rise across L3 -> RAM is read as one
    assert "outgrew L3 (hidden 4,096 -> 8,192)" in WorkingSetSweep(rows, model_name="m", levels=levels, device=torch.device("cpu"), epochs=1,
                                                                   batch_size=8, steps_per_epoch=10, threads=1).notes[-2]
