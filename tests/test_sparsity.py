"""helpers.hardware.sparsity: pruned weights through a dense and a CSR kernel."""
from __future__ import annotations

import pytest

from helpers.core import load
from helpers.hardware import sparse_matmul
from helpers.hardware.sparsity import SparseMatmul, SparseTiming


def row(density: float, dense_vs_full: float, csr_vs_full: float) -> SparseTiming:
    return SparseTiming(density, 100, int(300 * density), 1.0, 1.0, dense_vs_full, csr_vs_full)


def test_storage_follows_the_density():
    report = sparse_matmul(n=64, densities=(1.0, 0.05), min_run_time=0.01, rounds=1)
    full, sparse = report.find(density=1.0), report.find(density=0.05)
    assert full.dense_bytes == sparse.dense_bytes == 64 * 64 * 4
    assert full.csr_bytes > full.dense_bytes > sparse.csr_bytes  # indices cost more than they save when nothing is zero
    assert full.dense_vs_full == 1.0 and sparse.csr_seconds > 0
    assert len([n for n in report.notes if not n.startswith(load.LOAD_NOTE)]) == 3  # and a note on the load, when there was some


def test_the_sentences_follow_the_numbers():
    same, csr_wins = SparseMatmul.sentences([row(1.0, 1.0, 3.0), row(0.5, 1.0, 1.2), row(0.01, 0.98, 0.3)])
    assert "zero or not" in same
    assert "from 1% non-zeros down" in csr_wins and "3.3x faster" in csr_wins
    faster, never = SparseMatmul.sentences([row(1.0, 1.0, 3.0), row(0.1, 0.5, 1.5)])
    assert "2.0x faster" in faster and "disturbed" in faster and "never beat" in never
    assert SparseMatmul.sentences([row(1.0, 1.0, 3.0)]) == []


@pytest.mark.parametrize("settings", [dict(densities=(0.5, 0.1)), dict(densities=(1.0, 0.0)), dict(n=0), dict(rounds=0)])
def test_bad_arguments_say_what_was_wrong(settings):
    with pytest.raises(ValueError, match="densities|rounds"):
        sparse_matmul(**settings)
