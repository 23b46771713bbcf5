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


class OneTokenAStep:
    """The simplest honest engine: request i owns blocks 2i and 2i + 1, runs its prompt whole, then a token a step."""

    def __init__(self, model):
        self.model, self.requests = model, {}

    def add(self, prompt, max_tokens, ttft_slo):
        self.requests[len(self.requests)] = (list(prompt), max_tokens, [])
        return len(self.requests) - 1

    def answers(self):
        """{request id: its greedy next token}, from one forward pass over every unfinished request."""
        running = [(i, p, out) for i, (p, n, out) in self.requests.items() if len(out) < n]
        if not running:
            return {}
        sequences = [([2 * i, 2 * i + 1], len(p) + len(out) - 1, [out[-1]]) if out else ([2 * i, 2 * i + 1], 0, p)
                     for i, p, out in running]
        return dict(zip([i for i, _, _ in running], self.model(sequences).argmax(-1).tolist()))

    def step(self):
        emitted = self.answers()
        for i, token in emitted.items():
            self.requests[i][2].append(token)
        return emitted


def test_serve_counts_steps_itself_and_names_an_engine_that_starves_or_invents(hw3_llm, tiny):
    arrivals = [hw3_llm.Arrival(2, (1, 2), 3, 1, "chat"), hw3_llm.Arrival(0, (1,), 2, 1, "chat")]
    model = hw3_llm.StepModel(8, model=tiny)
    report = hw3_llm.serve(OneTokenAStep(model), model, arrivals)
    late, early = report.outcomes
    assert early.steps == [0, 1] and late.steps == [2, 3, 4] and late.ttft == 1 and report.goodput == 1.0
    for outcome in report.outcomes:
        assert outcome.tokens == Engine(tiny, eos_ids=()).generate([list(outcome.arrival.prompt)], outcome.arrival.max_tokens)[0]

    class Silent(OneTokenAStep):
        def step(self):
            return {}

    with pytest.raises(AssertionError, match="2 of 2 requests were unfinished after 20 steps"):
        hw3_llm.serve(Silent(hw3_llm.StepModel(8, model=tiny)), model, arrivals, max_steps=20)

    class Inventor(OneTokenAStep):
        def step(self):
            return {99: 1}

    with pytest.raises(AssertionError, match="request 99, which add never returned"):
        hw3_llm.serve(Inventor(hw3_llm.StepModel(8, model=tiny)), model, arrivals)


def test_a_token_counts_only_as_the_answer_of_its_steps_forward_pass(hw3_llm, tiny):
    arrivals = [hw3_llm.Arrival(0, (5, 6, 7), 3, 1, "chat")]

    class Unbudgeted(OneTokenAStep):
        """The right tokens, from the raw model run outside the StepModel: first tokens at once, no budget."""

        def answers(self):
            return {i: Engine(self.model.llama, eos_ids=()).generate([p + out], 1)[0][0]
                    for i, (p, n, out) in self.requests.items() if len(out) < n}

    class OffByOne(OneTokenAStep):
        def answers(self):
            return {i: (t + 1) % 49152 for i, t in super().answers().items()}

    class PromptOnly(OneTokenAStep):
        """Runs the model every step, but on the prompt alone: its rows never continue the tokens handed out."""

        def answers(self):
            running = [i for i, (p, n, out) in self.requests.items() if len(out) < n]
            logits = self.model([([2 * i, 2 * i + 1], 0, self.requests[i][0]) for i in running])
            return dict(zip(running, logits.argmax(-1).tolist()))

    refusals = {Unbudgeted: "no row of this step's forward pass ran its sequence", OffByOne: "greedy decoding of this step's",
                PromptOnly: "no row of this step's forward pass"}
    for engine, message in refusals.items():
        model = hw3_llm.StepModel(8, model=tiny)
        with pytest.raises(AssertionError, match=message):
            hw3_llm.serve(engine(model), model, arrivals)


def test_serve_recounts_the_passes_itself_so_changing_the_models_own_state_gains_nothing(hw3_llm, tiny):
    """The model's budget, pass counter and records are attributes the engine holds: serve's recount (against what the
    model was built with) refuses what they would let through, and an honest engine is unaffected by it."""
    arrivals = [hw3_llm.Arrival(0, tuple(range(1, 40)), 2, 1, "chat")]   # a 39-token prompt: over a budget of 32

    class RaisesTheBudget(OneTokenAStep):
        def __init__(self, model):
            super().__init__(model)
            model.token_budget = 10**6                                   # the model's own check now lets 39 through

    class TwoPassesAStep(OneTokenAStep):
        def step(self):
            self.model([([200], 0, [3])])                                # a pass of its own, then the counter reset
            self.model.forwards_this_step = 0
            return super().step()

    class HidesItsPasses(OneTokenAStep):
        def step(self):
            emitted = super().step()
            self.model.passes.clear()
            return emitted

    short = [hw3_llm.Arrival(0, (1, 2, 3), 2, 1, "chat")]
    refusals = {RaisesTheBudget: (arrivals, "39 new tokens; the model was built with a budget of 32"),
                TwoPassesAStep: (short, "ran 2 forward passes; a step may run one"),
                HidesItsPasses: (short, "no row of this step's forward pass")}
    for engine, (requests, message) in refusals.items():
        model = hw3_llm.StepModel(256, token_budget=32, block_size=32, model=tiny)
        with pytest.raises(AssertionError, match=message):
            hw3_llm.serve(engine(model), model, requests)
    model = hw3_llm.StepModel(256, token_budget=64, block_size=32, model=tiny)
    assert hw3_llm.serve(OneTokenAStep(model), model, arrivals).outcomes[0].finished
    with pytest.raises(TypeError, match="serve needs the StepModel"):
        hw3_llm.serve(OneTokenAStep(model), object(), arrivals)


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
