"""What activation checkpointing costs in time, predicted from the parts of a step and measured.

The rule of thumb says "about a third more compute": checkpointing runs each checkpointed
block's forward once more during backward, and a backward costs about two forwards. That
holds only where its three assumptions hold: backward = 2 forwards, every layer
checkpointed, no time outside forward and backward (the optimizer step). ``recompute_cost``
times each part of one update on this machine (the checkpointed blocks inside the same
forward that times the whole), predicts the overhead from them (the blocks' forward over the
plain update's time), measures it, and explains the gap; it predicts nothing when a part
took longer than the whole it belongs to: the fixed cost of each checkpointed group (saved-tensor hooks, the RNG state saved and
restored, a second autograd graph) weighs most when blocks are small, and two copies of
the same plain update, timed side by side, give the comparison's noise floor.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from helpers.core.device import synchronize
from helpers.core.fake import first_device
from helpers.core.memory import OptimizerChoice
from helpers.core.report import Report, column, format_seconds
from helpers.core.timing import time_interleaved
from helpers.distributed.memsave import example_batch, mean_square_loss, update_function

RULE_OF_THUMB = 1 / 3  # one extra forward on top of forward + backward = 3 forwards


@dataclass
class TimedPart:
    """One timed part of a training update, and its share of the plain update."""

    part: str = column("part")
    seconds: float = column("time", format_seconds)
    share: float = column("of a plain update", ".0%")


class RecomputeCost(Report):
    """The parts of one update timed, checkpointing's overhead predicted from them and measured; ``explanation``."""

    title = "Activation checkpointing: what the recomputation costs in time"

    def __init__(self, rows: list[TimedPart], *, predicted: float, measured: float, noise: float, backward_per_forward: float,
                 blocks_share: float, optimizer_share: float, group_cost: float, groups: int, blocks_seconds: float,
                 description: str, overrun: str = ""):
        self.predicted, self.measured, self.noise = predicted, measured, noise
        if not overrun and blocks_share > 1:
            overrun = f"the checkpointed blocks took {blocks_share:.0%} of the forward they are part of"
        self.overrun = overrun  # which part of the update took longer than the whole it belongs to; "" when none did
        self.backward_per_forward, self.blocks_share, self.optimizer_share = backward_per_forward, blocks_share, optimizer_share
        self.group_cost, self.groups, self.blocks_seconds = group_cost, groups, blocks_seconds
        self.explanation = self._explain()
        super().__init__(rows, [description, self.explanation])

    @property
    def agrees(self) -> bool:
        """Whether measured and predicted overhead differ by no more than the noise floor (at least 5 points)."""
        return abs(self.measured - self.predicted) <= self.tolerance

    @property
    def group_cost_share(self) -> float:
        """Checkpointing's own cost per group, over one group's share of the blocks' forward time."""
        return self.group_cost / (self.blocks_seconds / self.groups) if self.blocks_seconds else 0.0

    @property
    def disturbed(self) -> bool:
        """Whether two copies of one update differ by more than 10%: other work on the machine slowed some rounds."""
        return self.noise > 0.1

    @property
    def tolerance(self) -> float:
        return max(0.05, 2 * self.noise)

    def _explain(self) -> str:
        if self.overrun:  # a part longer than its whole: the parts cannot be added up into a prediction
            return (f"No prediction from these parts: {self.overrun}, so they do not hold together (other work on the machine "
                    f"slowed some rounds). Measured: {self.measured:+.0%} for checkpointing. Rerun the cell on a quieter machine, or with "
                    "more rounds.")
        rule = (f"The rule of thumb's {RULE_OF_THUMB:+.0%} (a third) assumes backward = 2 forwards (here {self.backward_per_forward:.2f}), every layer "
                f"recomputed (here the checkpointed blocks are {self.blocks_share:.0%} of the forward) and no optimizer time (here "
                f"{self.optimizer_share:.0%} of the update); from this machine's parts the recomputed forward should add "
                f"{self.predicted:+.0%}.")
        measured = f" Measured: {self.measured:+.0%}"
        floor = f"two copies of the same plain update differ by {self.noise:.0%}"
        if self.agrees:
            wide = "; a wide floor: other work on the machine disturbed these timings, so rerun for a sharper test" if self.disturbed else ""
            return f"{rule}{measured}, within the noise floor ({floor}{wide})."
        gap = self.measured - self.predicted
        direction = f"{100 * abs(gap):.0f} points {'more' if gap > 0 else 'less'} than the recomputed forward"
        if self.disturbed:
            return (f"{rule}{measured}, {direction}, but these timings do not hold together ({floor}): other work on the machine "
                    "slowed some rounds of every part. Rerun the cell on a quieter machine, or with more rounds.")
        if gap > 0:
            return (f"{rule}{measured}, {direction} ({floor}). The rest is the cost of checkpointing itself: about "
                    f"{format_seconds(self.group_cost)} for each of its {self.groups} groups, {self.group_cost_share:.0%} of a group's "
                    "forward (saved-tensor hooks, the RNG state saved and restored, a second autograd graph). Such fixed per-call "
                    "costs weigh most when the blocks are small, or when launching operations, not arithmetic, sets their time.")
        return (f"{rule}{measured}, {direction} ({floor}): recomputing inside backward was cheaper than the forward timed alone "
                "(a likely cause, not measured here: its inputs are still in cache, and its intermediates are freed group by group, so it "
                "allocates less).")


def recompute_cost(model: nn.Module, wrap: Callable[[nn.Module, int], nn.Module], batch_size: int = 8, every: int = 1,
                   optimizer: OptimizerChoice = "adam", rounds: int = 5, blocks: str = "blocks") -> RecomputeCost:
    """Time the parts of one update of ``model`` and of ``wrap(model, every)``, its ``blocks`` checkpointed in groups of ``every``.

    Parts, each the fastest of ``rounds`` interleaved rounds (``time_interleaved``; one CPU
    thread, or the GPU's time): the forward (with autograd, as in training) and, inside the same
    call, the checkpointed blocks' part of it (what backward recomputes), forward + backward, the
    whole update (twice, on two copies: their difference is the noise floor), and the checkpointed
    update. When a part took longer than its whole (forward + backward faster than the forward, or
    the update faster than forward + backward), the report predicts nothing.
    The predicted overhead is the blocks' forward over the plain update's time.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1 (interleaved timing rounds per part), got {rounds}")
    if every < 1:
        raise ValueError(f"every must be at least 1 (blocks per checkpointed group), got {every}")
    if not isinstance(getattr(model, blocks, None), (nn.ModuleList, nn.Sequential)):
        raise ValueError(f"{type(model).__name__}.{blocks} is not a ModuleList or Sequential; pass blocks= the name of the "
                         "attribute holding the layers that run one after another")
    wrapped = wrap(model, every)
    sequence = list(getattr(model, blocks))
    groups = math.ceil(len(sequence) / every)
    example = example_batch(model, batch_size)

    device = first_device(model)
    clock = {"on": False}
    calls: list[tuple[float, float]] = []  # (the whole forward, the blocks inside it) per call, the warm-up first

    def blocks_start(module, args) -> None:
        if clock["on"]:
            synchronize(device)
            clock["blocks from"] = time.perf_counter()

    def blocks_end(module, args, output) -> None:
        if clock["on"]:
            synchronize(device)
            clock["blocks"] = time.perf_counter() - clock["blocks from"]

    def forward() -> None:  # the blocks are timed inside it, so their time is part of this forward's by construction
        clock["on"] = True
        start = time.perf_counter()
        mean_square_loss(model(example))
        synchronize(device)
        calls.append((time.perf_counter() - start, clock["blocks"]))
        clock["on"] = False

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        mean_square_loss(model(example)).backward()

    parts = {"forward": forward, "forward+backward": forward_backward,
             "update": update_function(model, example, optimizer), "update again": update_function(model, example, optimizer),
             "checkpointed": update_function(wrapped, example, optimizer)}
    hooks = [sequence[0].register_forward_pre_hook(blocks_start), sequence[-1].register_forward_hook(blocks_end)]
    try:
        t = {name: turns.fastest for name, turns in time_interleaved(parts, device, rounds, cpu_threads=1).items()}
    finally:
        for hook in hooks:
            hook.remove()
    model.zero_grad(set_to_none=True)
    t["forward"], t["blocks"] = min(calls[1:])  # the fastest forward (the warm-up left out), and its blocks
    plain = min(t["update"], t["update again"])
    overrun = ("forward + backward took less than the forward alone" if t["forward+backward"] < t["forward"] else
               "the whole update took less than its forward + backward" if plain < t["forward+backward"] else "")
    backward = max(t["forward+backward"] - t["forward"], 0.0)
    optimizer_step = max(plain - t["forward+backward"], 0.0)
    label = f"update, checkpoint every {every} block{'s' if every > 1 else ''}"
    rows = [TimedPart("forward (loss included)", t["forward"], t["forward"] / plain),
            TimedPart("  of which the checkpointed blocks", t["blocks"], t["blocks"] / plain),
            TimedPart("backward", backward, backward / plain),
            TimedPart("optimizer step", optimizer_step, optimizer_step / plain),
            TimedPart("plain update", plain, 1.0),
            TimedPart("plain update, second copy", max(t["update"], t["update again"]), max(t["update"], t["update again"]) / plain),
            TimedPart(label, t["checkpointed"], t["checkpointed"] / plain)]
    description = (f"{type(model).__name__}, {len(sequence)} blocks in {groups} checkpointed group{'s' if groups > 1 else ''}, batch "
                   f"{batch_size}, {optimizer}; each time the fastest of {rounds} interleaved rounds.")
    return RecomputeCost(rows, predicted=t["blocks"] / plain, measured=t["checkpointed"] / plain - 1,
                         noise=abs(t["update"] - t["update again"]) / plain,
                         backward_per_forward=backward / t["forward"], blocks_share=t["blocks"] / t["forward"],
                         optimizer_share=optimizer_step / plain,
                         group_cost=max(t["checkpointed"] - plain - t["blocks"], 0.0) / groups, groups=groups, blocks_seconds=t["blocks"],
                         description=description, overrun=overrun)


def _input_of(block: nn.Module, model: nn.Module, example: torch.Tensor) -> torch.Tensor:
    """What ``block`` receives when ``model`` runs on ``example`` (detached: the recomputation starts from a stored input)."""
    seen: list[torch.Tensor] = []
    handle = block.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach()))
    try:
        with torch.no_grad():
            model(example)
    finally:
        handle.remove()
    return seen[0]
