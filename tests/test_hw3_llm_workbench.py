"""Assignment 3 part 3's workbench holds engines to their budgets, counts time in steps on its own, and its goodput
bar is one the reference clears on every workload while the lecture's engine cannot.

A small random Llama stands in for SmolLM2 here: with every request generated to its max_tokens, which tokens come
out never changes when they come out, so schedules, budgets and goodput are the same as with the real model (the
notebook itself runs SmolLM2, in tests/test_assignments.py)."""
from __future__ import annotations

import statistics
import sys

import pytest
import torch

from helpers.course import assignments
from helpers.serving.llama import Llama
from helpers.serving.llm_engine import Engine
from helpers.serving.smollm import LlamaConfig

from .grading_support import ROOT

WORKBENCH = ROOT / "assignments" / "source" / "hw3_deployment"

pytestmark = pytest.mark.instructor  # the workbench and the reference solution are sealed


@pytest.fixture(scope="module")
def hw3_llm():
    sys.path.insert(0, str(WORKBENCH))
    import hw3_llm

    return hw3_llm


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    config = LlamaConfig(layers=1, width=64, heads=4, kv_heads=2, ffn_width=128, vocab_size=49152, rope_base=10000.0,
                         norm_eps=1e-5, context=8192)
    return Llama(config).eval()


@pytest.fixture(scope="module")
def reference(hw3_llm):
    """The reference SLOEngine, defined from the source notebook's solution cell."""
    nb = assignments.read(WORKBENCH / "part3_llm_serving.ipynb")
    namespace = {name: getattr(hw3_llm, name) for name in hw3_llm.__all__}
    exec(next(c.source for c in nb.cells if assignments.grade_id(c) == "task1_engine"), namespace)  # noqa: S102
    return namespace["SLOEngine"]


def good_counts(hw3_llm, tiny, engine_class, seeds, num_blocks=64):
    counts = []
    for seed in seeds:
        model = hw3_llm.StepModel(num_blocks, model=tiny)
        counts.append(sum(o.good for o in hw3_llm.serve(engine_class(model), model, hw3_llm.workload(seed)).outcomes))
    return counts


def test_the_step_model_refuses_each_budget_overrun_and_says_which(hw3_llm, tiny):
    model = hw3_llm.StepModel(4, token_budget=8, block_size=4, model=tiny)
    overruns = {
        "budget is 8": [([0, 1, 2], 0, [5] * 9)],                          # 9 new tokens
        "take more blocks": [([0], 0, [5] * 5)],                           # one block holds 4
        "block ids are 0..3": [([7, 1], 0, [5] * 5)],
        "same KV slot": [([0], 0, [5]), ([0], 0, [6])],                     # two sequences in one block
        "at least one sequence": [],
    }
    for message, sequences in overruns.items():
        with pytest.raises(hw3_llm.BudgetExceeded, match=message):
            model(sequences)
    logits = model([([0, 1], 0, [5] * 6), ([2], 0, [7, 8])])
    assert logits.shape == (2, 49152)
    with pytest.raises(hw3_llm.BudgetExceeded, match="one forward pass"):
        model([([3], 0, [1])])
    model.forwards_this_step = 0                                           # what serve does before each step
    assert model([([3], 0, [1])]).shape == (1, 49152) and model.forwards == 2 and model.tokens == 9


def test_serve_counts_steps_itself_and_names_an_engine_that_starves_or_invents(hw3_llm, tiny):
    class OneTokenAStep:
        """Hands out token 1 for each request, one a step, without the model."""

        def __init__(self):
            self.left = {}

        def add(self, prompt, max_tokens, ttft_slo):
            self.left[len(self.left)] = max_tokens
            return len(self.left) - 1

        def step(self):
            out = {i: 1 for i, n in self.left.items() if n}
            for i in out:
                self.left[i] -= 1
            return out

    model = hw3_llm.StepModel(8, model=tiny)
    arrivals = [hw3_llm.Arrival(2, (1, 2), 3, 1, "chat"), hw3_llm.Arrival(0, (1,), 2, 1, "chat")]
    report = hw3_llm.serve(OneTokenAStep(), model, arrivals)
    late, early = report.outcomes
    assert early.steps == [0, 1] and late.steps == [2, 3, 4] and late.ttft == 1 and report.goodput == 1.0

    class Silent(OneTokenAStep):
        def step(self):
            return {}

    with pytest.raises(AssertionError, match="2 of 2 requests were unfinished after 20 steps"):
        hw3_llm.serve(Silent(), model, arrivals, max_steps=20)

    class Inventor(OneTokenAStep):
        def step(self):
            return {99: 1}

    with pytest.raises(AssertionError, match="request 99, which add never returned"):
        hw3_llm.serve(Inventor(), model, arrivals)


def test_the_lecture_engine_keeps_the_budgets_and_gives_each_prompt_its_greedy_answer(hw3_llm, tiny):
    arrivals = hw3_llm.workload(4, chats=4, documents=3)
    model = hw3_llm.StepModel(24, model=tiny)
    engine = hw3_llm.LectureEngine(model)
    report = hw3_llm.serve(engine, model, arrivals)
    assert model.forwards <= report.steps and engine.engine.stats.preemptions > 0   # 24 blocks: too few for all
    for outcome in report.outcomes:
        alone = Engine(tiny, eos_ids=()).generate([list(outcome.arrival.prompt)], outcome.arrival.max_tokens)[0]
        assert outcome.tokens == alone


def test_the_goodput_bar_is_cleared_by_the_reference_on_every_sampled_workload_and_never_by_the_lecture(hw3_llm, tiny, reference):
    seeds = range(100, 130)
    lecture = good_counts(hw3_llm, tiny, hw3_llm.LectureEngine, seeds)
    mine = good_counts(hw3_llm, tiny, reference, seeds)
    slack = [m - (g + (16 - g) / 3) for g, m in zip(lecture, mine)]
    print(f"lecture {min(lecture)}-{max(lecture)} of 16 (median {statistics.median(lecture)}), reference "
          f"{min(mine)}-{max(mine)} (median {statistics.median(mine)}), smallest lead over the bar {min(slack):.2f}")
    assert min(slack) > 0, f"the reference misses the bar on workload {seeds[slack.index(min(slack))]}"
    assert max(lecture) < 16, "a workload the lecture's engine serves in full leaves nothing to win"
