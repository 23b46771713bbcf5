"""helpers.core.gpu_workspaces: cuBLAS workspace sizes from torch's configuration, checked without a GPU."""
from __future__ import annotations

import pytest

from helpers.core.gpu_workspaces import KIB, MIB, blas_workspaces, cublas_workspace_bytes, cublaslt_extra_bytes


@pytest.mark.parametrize("capability, expected", [((9, 0), 32 * MIB), ((10, 0), 32 * MIB), ((8, 0), 8 * MIB + 128 * KIB),
                                                  ((7, 5), 8 * MIB + 128 * KIB)])
def test_torch_defaults_per_architecture(capability, expected):
    assert cublas_workspace_bytes(capability, env={}) == expected


@pytest.mark.parametrize("config, expected", [(":4096:8", 32 * MIB), (":16:8", 128 * KIB), (":4096:2:16:8", 8 * MIB + 128 * KIB)])
def test_cublas_workspace_config_is_summed_over_its_pairs(config, expected):
    assert cublas_workspace_bytes((9, 0), env={"CUBLAS_WORKSPACE_CONFIG": config}) == expected


def test_a_malformed_config_falls_back_to_the_default_as_torch_does():
    assert cublas_workspace_bytes((9, 0), env={"CUBLAS_WORKSPACE_CONFIG": "4096x8"}) == 32 * MIB


def test_cublaslt_adds_nothing_when_unified_and_its_size_when_not():
    assert cublaslt_extra_bytes(32 * MIB, env={}) == 0
    assert cublaslt_extra_bytes(32 * MIB, env={"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0"}) == MIB
    assert cublaslt_extra_bytes(32 * MIB, env={"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0", "CUBLASLT_WORKSPACE_SIZE": "4096"}) == 4 * MIB


def test_a_training_step_holds_one_workspace_per_thread_that_runs_cublas():
    """Forward on the main thread, backward on the autograd device thread: the H100 trace showed 2 x 33 MiB."""
    h100_then = blas_workspaces((9, 0), training=True, env={"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0"})
    assert h100_then.total == 2 * 33 * MIB and "2 threads" in h100_then.label()
    assert blas_workspaces((9, 0), training=False, env={}).total == 32 * MIB
    live = blas_workspaces((9, 0), live=(16 * MIB, MIB), env={})
    assert live.per_thread == 16 * MIB and "torch.backends" in live.source


def test_a_cuda_report_carries_the_workspaces_as_a_category_of_their_own():
    """What training_memory does on a GPU, checked by moving a CPU estimate's numbers onto a 'cuda:0' row."""
    import dataclasses

    from helpers import BasicFCModel, training_memory
    from helpers.core.memory import _blas_workspaces

    cpu = training_memory(BasicFCModel(), (8, 1, 28, 28), "adam")
    workspaces = _blas_workspaces("cuda:0")
    assert workspaces.total == 2 * 32 * MIB  # no GPU here: Hopper's default, forward and backward threads
    categories = {**cpu.categories, workspaces.label(): workspaces.total}
    gpu = dataclasses.replace(cpu, peak_by_device={"cuda:0": cpu.peak_bytes + workspaces.total},
                              categories_by_device={"cuda:0": categories}, peak_phase_by_device={"cuda:0": cpu.peak_phase})
    row = gpu.find(category=workspaces.label())
    assert row.at_peak["cuda:0"] == workspaces.total and workspaces.label() in str(gpu)
    assert not any("cuBLAS" in r.category for r in cpu.rows)  # the CPU report is unchanged


def test_charts_of_a_cuda_report_stack_the_workspaces_up_to_the_peak():
    """On a GPU the peak includes the workspaces: the charts must draw them as a part, or the stack ends below its peak line."""
    import dataclasses

    from helpers import BasicFCModel, training_memory
    from helpers.core.memory import _blas_workspaces
    from helpers.distributed.memsave import MemoryComparison, SetupMemory

    cpu = training_memory(BasicFCModel(), (8, 1, 28, 28), "adam")
    workspaces = _blas_workspaces("cuda:0")
    gpu = dataclasses.replace(cpu, peak_by_device={"cuda:0": cpu.peak_bytes + workspaces.total},
                              categories_by_device={"cuda:0": {**cpu.categories, workspaces.label(): workspaces.total}},
                              peak_phase_by_device={"cuda:0": cpu.peak_phase},
                              timeline=[(phase, {"cuda:0": snap["cpu"]}) for phase, snap in cpu.timeline])
    ax = gpu.plot()
    top = max(vertex[1] for area in ax.collections for path in area.get_paths() for vertex in path.vertices)
    assert top == pytest.approx(gpu.peak_bytes) and workspaces.label() in [t.get_text() for t in ax.get_legend().get_texts()]

    row = SetupMemory.from_report("one batch", gpu)
    assert row.workspaces == workspaces.total
    bars = MemoryComparison([row], "setups").plot()
    assert sum(p.get_height() for p in bars.patches) == pytest.approx(gpu.peak_bytes)
    assert SetupMemory.from_report("one batch", cpu).workspaces is None  # on a CPU the column stays hidden
