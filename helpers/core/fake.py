"""Run a model on fake tensors: shapes, dtypes and devices, without memory or compute.

torch's FakeTensorMode makes tensors that carry only metadata, so a model built on the
meta device, even one far bigger than RAM, can run forward, backward and an optimizer
step in seconds. Op counting and memory estimation both run this way; this module makes
the fake copy of a model (the original is left untouched) and fake inputs for it.
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch import nn

from helpers.core.torch_adapters.fake_tensor import NEEDS_REAL_VALUES, FakeTensorMode, new_fake_mode

# Where a model's tensors go: one device for all, or module-name prefix -> device ("" is the default).
Placement = str | torch.device | Mapping[str, str | torch.device] | None
ExampleInput = torch.Tensor | tuple | list | dict


def fake_mode() -> FakeTensorMode:
    """A fresh FakeTensorMode that also accepts stray real tensors (e.g. constants a model keeps as attributes)."""
    return new_fake_mode()


@contextlib.contextmanager
def explain_fake_failures(model: nn.Module, what: str = "estimated") -> Iterator[None]:
    """Turn fake-tensor failures into an error that says why and what to do instead."""
    try:
        yield
    except NEEDS_REAL_VALUES as err:
        op = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(
            f"{type(model).__name__} cannot be {what} on fake tensors: its forward needs the values of its tensors "
            f"({op}: e.g. .item(), a branch on a value, or a shape that depends on values), and fake tensors have none. "
            "Run it for real on a small batch instead (measure_training_memory)."
        ) from err


def _home(device: torch.device) -> torch.device:
    """A real tensor's device; meta tensors are given the CPU, where their shapes are accounted."""
    return torch.device("cpu") if device.type == "meta" else device


def device_for(module_name: str, tensor: torch.Tensor, placement: Placement) -> torch.device:
    """The device ``placement`` assigns to a tensor owned by the module called ``module_name``."""
    if placement is None:
        return _home(tensor.device)
    if not isinstance(placement, Mapping):
        return torch.device(placement)
    matches = [p for p in placement if p == "" or module_name == p or module_name.startswith(p + ".")]
    if not matches:
        return _home(tensor.device)
    return torch.device(placement[max(matches, key=len)])


def _fake_like(t: torch.Tensor, device: torch.device, dtype: torch.dtype | None) -> torch.Tensor:
    """An empty fake tensor with ``t``'s shape and strides; floating tensors take ``dtype`` when given."""
    cast = dtype if dtype is not None and t.is_floating_point() else t.dtype
    return torch.empty_strided(t.shape, t.stride(), dtype=cast, device=device)


def fake_copy(model: nn.Module, mode: FakeTensorMode, placement: Placement = None, dtype: torch.dtype | None = None) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are fake tensors on the placed devices.

    Works for models on the meta device. Nothing real is copied: every parameter
    and buffer is mapped to its fake twin before ``copy.deepcopy`` runs.
    """
    memo: dict[int, Any] = {}
    with mode:
        for name, module in model.named_modules():
            for p in module.parameters(recurse=False):
                if id(p) not in memo:
                    fake = _fake_like(p, device_for(name, p, placement), dtype)
                    memo[id(p)] = nn.Parameter(fake, requires_grad=p.requires_grad)
            for b in module.buffers(recurse=False):
                if id(b) not in memo:
                    memo[id(b)] = _fake_like(b, device_for(name, b, placement), dtype)
    return copy.deepcopy(model, memo)


def first_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (or buffer); the CPU for a model without either."""
    for t in (*model.parameters(), *model.buffers()):
        return t.device
    return torch.device("cpu")


def default_input(model: nn.Module, batch_size: int = 1) -> ExampleInput:
    """A batch for ``model``: its ``example_input(batch_size)`` if it has one, else a meta tensor of its ``input_shape``."""
    if hasattr(model, "example_input"):
        return model.example_input(batch_size)
    shape = getattr(model, "input_shape", None)
    if shape is None:
        raise ValueError(
            f"{type(model).__name__} has no input_shape attribute, so pass the input's shape, e.g. shape=(1, 3, 224, 224), "
            "or an example input tensor"
        )
    return torch.zeros(batch_size, *shape, device="meta")


def as_example(model: nn.Module, shape_or_input: ExampleInput | None) -> ExampleInput:
    """Turn what a caller passed (None, a shape tuple, or example tensors) into example tensors."""
    if shape_or_input is None:
        return default_input(model)
    if isinstance(shape_or_input, (tuple, list)) and shape_or_input and all(isinstance(d, int) for d in shape_or_input):
        return torch.zeros(*shape_or_input, device="meta")
    if isinstance(shape_or_input, torch.Size):
        return torch.zeros(*shape_or_input, device="meta")
    _check_tensors(shape_or_input)
    return shape_or_input


def _check_tensors(example: Any) -> None:
    leaves = list(example.values()) if isinstance(example, dict) else list(example) if isinstance(example, (tuple, list)) else [example]
    if not leaves or not all(isinstance(t, torch.Tensor) for t in leaves):
        raise TypeError(
            "the example input must be a shape tuple of ints, a tensor, a tuple/list of tensors (positional arguments) "
            f"or a dict of tensors (keyword arguments); got {type(example).__name__}"
        )


def split_args(example: ExampleInput) -> tuple[tuple, dict]:
    """Positional and keyword arguments for ``model(...)`` from one example input."""
    if isinstance(example, dict):
        return (), dict(example)
    if isinstance(example, (tuple, list)):
        return tuple(example), {}
    return (example,), {}


def fake_inputs(example: ExampleInput, mode: FakeTensorMode, device: torch.device, dtype: torch.dtype | None = None) -> tuple[tuple, dict]:
    """Fake twins of the example's tensors on ``device``, as (args, kwargs)."""
    args, kwargs = split_args(example)
    with mode:
        return tuple(_fake_like(a, device, dtype) for a in args), {k: _fake_like(v, device, dtype) for k, v in kwargs.items()}


def with_batch(example: ExampleInput, batch_size: int) -> ExampleInput:
    """The example with every tensor's first (batch) dimension set to ``batch_size``, on the meta device."""

    def resize(t: torch.Tensor) -> torch.Tensor:
        if t.dim() == 0:
            raise ValueError("cannot change the batch size of a 0-dimensional input")
        return torch.empty(batch_size, *t.shape[1:], dtype=t.dtype, device="meta")

    args, kwargs = split_args(example)
    if kwargs:
        return {k: resize(v) for k, v in kwargs.items()}
    resized = [resize(a) for a in args]
    return resized[0] if isinstance(example, torch.Tensor) else type(example)(resized)


def batch_size_of(example: ExampleInput) -> int:
    args, kwargs = split_args(example)
    first = (list(args) + list(kwargs.values()))[0]
    return int(first.shape[0]) if first.dim() else 1


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# ---------------------------------------------------------------- a fake run, watched module by module


@dataclass
class FakeRun:
    """A model's fake copy with fake inputs, ready to run under ``mode``: ``with run.mode: run.model(*run.args, **run.kwargs)``."""

    mode: FakeTensorMode
    model: nn.Module
    args: tuple
    kwargs: dict
    example: ExampleInput

    @property
    def input_shapes(self) -> list[tuple]:
        """The shapes of the example's tensors, positional then keyword."""
        args, kwargs = split_args(self.example)
        return [tuple(t.shape) for t in (*args, *kwargs.values())]


def fake_run(model: nn.Module, shape_or_input: ExampleInput | tuple[int, ...] | None = None, *, placement: Placement = None,
             dtype: torch.dtype | None = None, training: bool = True,
             prepare: Callable[[nn.Module], object] | None = None) -> FakeRun:
    """The fake copy of ``model`` (placed, cast, in training or eval mode) and fake inputs on its first device.

    ``shape_or_input`` is what ``as_example`` takes (None: one sample of ``model.input_shape``).
    ``prepare`` is called on the fake copy before its inputs are made (e.g. to check its devices).
    """
    example = as_example(model, shape_or_input)
    mode = fake_mode()
    fake_model = fake_copy(model, mode, placement, dtype).train(training)
    if prepare is not None:
        prepare(fake_model)
    args, kwargs = fake_inputs(example, mode, first_device(fake_model), dtype)
    return FakeRun(mode, fake_model, args, kwargs, example)


@contextlib.contextmanager
def module_hooks(modules: Iterable[tuple[str, nn.Module]], before: Callable[[str, nn.Module], None] | None = None,
                 after: Callable[[str, nn.Module, Any, Any], None] | None = None) -> Iterator[None]:
    """Within the block, ``before(name, module)`` runs as each named module's forward starts and
    ``after(name, module, inputs, output)`` as it returns (outputs are left unchanged); the hooks go on leaving it."""
    def pre_hook(name: str) -> Callable:
        def hook(module, inputs) -> None:  # returning None leaves the inputs alone
            before(name, module)
        return hook

    def post_hook(name: str) -> Callable:
        def hook(module, inputs, output) -> None:  # returning None leaves the output alone
            after(name, module, inputs, output)
        return hook

    handles = []
    try:
        for name, module in modules:
            if before is not None:
                handles.append(module.register_forward_pre_hook(pre_hook(name)))
            if after is not None:
                handles.append(module.register_forward_hook(post_hook(name)))
        yield
    finally:
        for handle in handles:
            handle.remove()


def leaf_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The named modules with no children: the layers that do the work."""
    return [(name, m) for name, m in model.named_modules() if not any(True for _ in m.children())]
