"""One training step, one way to resolve the AMP dtype: every helper that trains, times or measures a step uses these.

``resolve_amp(amp, device)`` turns what a caller asks for (False, True, "fp16", "bf16",
a dtype) into the dtype autocast runs in, or None without AMP. ``training_step`` is the
step itself: forward (under autocast when asked), the loss, backward (scaled by a
GradScaler when given; over equal micro-batches when asked), the optimizer step.
``forward_backward`` is its first half, for gradient accumulation and gradient checks.
The device of every entry point is resolved by ``helpers.core.device.pick_device``
(None: $EDL_DEVICE, else CUDA when present, else the CPU).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from helpers.core.device import DTYPES, dtype_name, pick_device
from helpers.core.fake import ExampleInput, batch_size_of, first_device, split_args

# the 16-bit types autocast runs in, by short name and by torch's own name ("bfloat16")
AMP_DTYPES = {name: DTYPES[short] for short in ("fp16", "bf16") for name in (short, str(DTYPES[short]).removeprefix("torch."))}
PHASES = ("forward", "backward", "optimizer step")


def resolve_amp(amp: bool | str | torch.dtype | None, device: str | torch.device | None = None) -> torch.dtype | None:
    """The dtype autocast runs in for ``amp`` on ``device``, or None for no AMP.

    ``amp`` is False or None (no AMP), True (the device's default: fp16 on CUDA, bf16
    elsewhere), "fp16"/"bf16" (or their long names), or torch.float16/torch.bfloat16.
    A dtype passes through unchanged, so resolving twice gives the same answer.
    """
    if amp is None or amp is False:
        return None
    if amp is True:
        kind = torch.device(device).type if device is not None else pick_device(None).type  # a named device as named
        return torch.float16 if kind == "cuda" else torch.bfloat16
    if isinstance(amp, torch.dtype) and amp in AMP_DTYPES.values():
        return amp
    if isinstance(amp, str) and amp.lower() in AMP_DTYPES:
        return AMP_DTYPES[amp.lower()]
    raise ValueError(f"amp={amp!r} is not understood: autocast needs a 16-bit type. Use False (fp32), True "
                     "(the device's default), 'fp16' or 'bf16'.")


def amp_name(dtype: torch.dtype | None) -> str:
    """'fp16' or 'bf16' for an autocast dtype, 'fp32' for None (no AMP)."""
    if dtype is not None and dtype not in AMP_DTYPES.values():
        raise KeyError(dtype)
    return "fp32" if dtype is None else dtype_name(dtype)


def tensors_in(value: Any) -> list[torch.Tensor]:
    """Every tensor in a model's output or input: a tensor, or tuples, lists and dicts of them, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_in(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors_in(v)]
    return []


def default_loss(output: Any) -> torch.Tensor:
    """The default loss: the sum, in fp32, of every floating-point element the model returns.

    Its gradient is 1 for every output element, so backward runs through the whole
    network exactly as under any real loss. The loss itself adds only a scalar (and an
    fp32 copy of a half-precision output); cross-entropy would also keep its
    log-softmax, one more tensor the size of the output.
    """
    leaves = [t for t in tensors_in(output) if t.is_floating_point()]
    if not leaves:
        raise ValueError("the model returned no floating-point tensor: pass loss_fn=..., a function from its output to a scalar")
    loss = leaves[0].float().sum()
    for t in leaves[1:]:
        loss = loss + t.float().sum()
    return loss


def micro_batches_of(batch: ExampleInput, parts: int) -> list[tuple[tuple, dict]]:
    """``batch`` cut into ``parts`` equal micro-batches along its first dimension, each as (args, kwargs)."""
    args, kwargs = split_args(batch)
    if parts < 1:
        raise ValueError(f"micro_batches must be at least 1, got {parts}")
    if parts == 1:
        return [(args, kwargs)]
    size = batch_size_of(batch)
    if size % parts:
        raise ValueError(f"a batch of {size} does not split into {parts} equal micro-batches; pick a divisor of {size}")
    cut_args = [a.chunk(parts) for a in args]
    cut_kwargs = {k: v.chunk(parts) for k, v in kwargs.items()}
    return [(tuple(c[i] for c in cut_args), {k: c[i] for k, c in cut_kwargs.items()}) for i in range(parts)]


def forward_backward(model: nn.Module, batch: ExampleInput, loss_fn: Callable | None = None, *, amp_dtype: torch.dtype | None = None,
                     micro_batches: int = 1, scaler: torch.amp.GradScaler | None = None,
                     on_phase: Callable[[str], None] | None = None, keep_loss: bool = True) -> torch.Tensor | None:
    """Forward and backward of ``model`` on ``batch``: ``.grad`` then holds the gradient of the batch's loss.

    With ``micro_batches`` = k the batch is cut into k equal slices and each slice's
    loss is divided by k, so a mean loss gives the same gradients as one big batch.
    ``amp_dtype`` (from ``resolve_amp``) runs forward under autocast; ``scaler`` scales
    each loss before backward. ``on_phase`` is called with "forward" and "backward" as
    each begins. Returns the loss (detached, summed over micro-batches), or None with
    ``keep_loss=False``, which frees it at once (a memory measurement then sees none of it).
    """
    loss_fn = loss_fn or default_loss
    device_type = first_device(model).type
    total = None
    for args, kwargs in micro_batches_of(batch, micro_batches):
        if on_phase:
            on_phase("forward")
        with torch.autocast(device_type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = loss_fn(model(*args, **kwargs))
        if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
            raise ValueError(f"loss_fn must return a scalar tensor, got {type(loss).__name__} {getattr(loss, 'shape', '')}")
        if micro_batches > 1:
            loss = loss / micro_batches
        if on_phase:
            on_phase("backward")
        (scaler.scale(loss) if scaler is not None else loss).backward()
        if keep_loss:
            total = loss.detach() if total is None else total + loss.detach()
        del loss
    return total


def training_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: ExampleInput, loss_fn: Callable | None = None, *,
                  amp_dtype: torch.dtype | None = None, micro_batches: int = 1, scaler: torch.amp.GradScaler | None = None,
                  on_phase: Callable[[str], None] | None = None, keep_loss: bool = True) -> torch.Tensor | None:
    """One optimizer update: ``forward_backward`` (see there for the arguments), the optimizer step, gradients freed.

    ``batch`` is what the model takes: a tensor, a tuple of positional tensors or a dict
    of keyword tensors, already on the model's device. ``loss_fn`` maps the model's output
    to a scalar (default: ``default_loss``). Gradients are set to None before and after
    (``zero_grad``), so the step starts and ends without them; ``on_phase`` also hears
    "optimizer step". With a ``scaler``, the step goes through it (skipped on inf/nan)
    and the scale is updated.
    """
    if any(p.grad is not None for group in optimizer.param_groups for p in group["params"]):
        optimizer.zero_grad(set_to_none=True)  # only when needed: the call itself shows up as operators in a trace
    loss = forward_backward(model, batch, loss_fn, amp_dtype=amp_dtype, micro_batches=micro_batches, scaler=scaler,
                            on_phase=on_phase, keep_loss=keep_loss)
    if on_phase:
        on_phase("optimizer step")
    if scaler is None:
        optimizer.step()
    else:
        scaler.step(optimizer)
        scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss
