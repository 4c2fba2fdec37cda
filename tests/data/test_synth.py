"""The synthetic QA-log generator: determinism, schema, and the properties the pipeline
relies on (incoherent generic clusters, noise, junk rows, false negatives, popularity)."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from datetime import date, datetime, timedelta
from pathlib import Path

import pytest

from qpr.data.synth import (
    CONFUSIONS,
    FIELDS,
    GENERIC_ANSWER_IDS,
    Intent,
    SynthSpec,
    generate_day,
    intent_catalogue,
    max_intents,
    write_day,
    write_logs,
)
from qpr.text.normalize import normalize, tokenize

SPEC = SynthSpec()
DAYS = [SPEC.start + timedelta(days=i) for i in range(SPEC.days)]
TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
ANSWER_ID = re.compile(r"^ans-(\d{5}|[a-z0-9-]+)$")


def coherence(questions: list[str]) -> float:
    """Paper eq. 4-5: mean over questions of |T_q ∩ S| / |S|, S the union of the T_q."""
    token_sets = [set(tokenize(q)) for q in questions]
    union = set().union(*token_sets)
    return sum(len(t & union) for t in token_sets) / (len(token_sets) * len(union))


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    """The default data set (14 days x 2200 rows), in memory: well under a second."""
    out: list[dict] = []
    for day in DAYS:
        out += generate_day(day, seed=SPEC.seed, rows=SPEC.rows_per_day, intents=SPEC.intents)
    return out


@pytest.fixture(scope="module")
def catalogue() -> dict[str, Intent]:
    return {i.answer_id: i for i in intent_catalogue(SPEC.intents, SPEC.seed)}


@pytest.fixture(scope="module")
def clusters(rows: list[dict]) -> dict[str, set[str]]:
    """Distinct normalised non-empty questions per answer id, as clustering sees them."""
    out: dict[str, set[str]] = defaultdict(set)
    for row in rows:
        if text := normalize(row["question"]):
            out[row["answer_id"]].add(text)
    return out


# --- catalogue ---------------------------------------------------------------------------


def test_catalogue_shape(catalogue: dict[str, Intent]) -> None:
    intents = list(catalogue.values())
    normal = [i for i in intents if not i.generic]
    assert len(normal) == SPEC.intents
    assert [i.answer_id for i in intents if i.generic] == list(GENERIC_ANSWER_IDS)
    assert [i.answer_id for i in normal] == [f"ans-{k:05d}" for k in range(SPEC.intents)]
    assert len({i.family for i in normal}) >= 30
    assert len({i.topic for i in normal}) >= 15
    assert all(len(i.paraphrases) >= 6 for i in normal)
    assert sum(i.weight for i in intents) == pytest.approx(1.0)


def test_catalogue_paraphrases_belong_to_one_answer() -> None:
    full = intent_catalogue(max_intents(), SPEC.seed)
    owners = Counter(p for intent in full for p in set(intent.paraphrases))
    assert [p for p, n in owners.items() if n > 1] == []
    # Same family, different slot value: different answers and different texts.
    by_family: dict[str, list[Intent]] = defaultdict(list)
    for intent in full:
        by_family[intent.family].append(intent)
    for family, members in by_family.items():
        if family != "generic":
            assert len({m.answer_id for m in members}) == len(members)
            assert len({m.paraphrases[0] for m in members}) == len(members)


def test_paraphrase_word_overlap_varies(catalogue: dict[str, Intent]) -> None:
    # Some surface forms of an intent share few words: otherwise the task is string matching.
    def jaccard(a: str, b: str) -> float:
        ta, tb = set(a.split()), set(b.split())
        return len(ta & tb) / len(ta | tb)

    lowest = [
        min(jaccard(a, b) for a in i.paraphrases for b in i.paraphrases if a != b)
        for i in catalogue.values()
        if not i.generic
    ]
    assert sum(j < 0.3 for j in lowest) / len(lowest) > 0.8


def test_related_intents_share_family(catalogue: dict[str, Intent]) -> None:
    for intent in catalogue.values():
        if intent.related is not None:
            assert intent.related != intent.answer_id
            assert catalogue[intent.related].family == intent.family


def test_smaller_catalogue_is_a_prefix() -> None:
    small = intent_catalogue(50, SPEC.seed)
    large = intent_catalogue(400, SPEC.seed)
    assert [i.paraphrases for i in small[:50]] == [i.paraphrases for i in large[:50]]


@pytest.mark.parametrize("intents", [0, max_intents() + 1])
def test_catalogue_rejects_bad_size(intents: int) -> None:
    with pytest.raises(ValueError, match="intents"):
        intent_catalogue(intents, SPEC.seed)


# --- determinism and files ---------------------------------------------------------------


def test_same_bytes_twice(tmp_path: Path) -> None:
    day = DAYS[3]
    a = write_day(tmp_path / "a", day, seed=7, rows=500, intents=120)
    b = write_day(tmp_path / "b", day, seed=7, rows=500, intents=120)
    assert a.name == "2026-10-04.jsonl"
    assert a.read_bytes() == b.read_bytes()
    other = write_day(tmp_path / "c", day, seed=8, rows=500, intents=120)
    assert other.read_bytes() != a.read_bytes()


def test_day_alone_equals_day_in_range(tmp_path: Path) -> None:
    spec = SynthSpec(seed=5, start=date(2026, 12, 30), days=4, rows_per_day=300, intents=80)
    calls: list[tuple[int, int]] = []
    paths = write_logs(
        tmp_path / "range", spec, progress=lambda done, total: calls.append((done, total))
    )
    assert [p.name for p in paths] == [
        "2026-12-30.jsonl", "2026-12-31.jsonl", "2027-01-01.jsonl", "2027-01-02.jsonl",
    ]  # fmt: skip
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
    alone = write_day(tmp_path / "alone", date(2027, 1, 1), seed=5, rows=300, intents=80)
    assert alone.read_bytes() == paths[2].read_bytes()
    assert sorted(p.name for p in (tmp_path / "range").iterdir()) == [p.name for p in paths]


def test_file_encoding_and_line_format(tmp_path: Path) -> None:
    path = write_day(tmp_path, DAYS[0], seed=SPEC.seed, rows=400, intents=SPEC.intents)
    raw = path.read_bytes()
    assert raw.endswith(b"\n") and b"\r" not in raw
    lines = raw.decode("utf-8").split("\n")[:-1]
    assert len(lines) == 400
    for line in lines:
        assert list(json.loads(line)) == list(FIELDS)
    assert [json.loads(line) for line in lines] == generate_day(
        DAYS[0], seed=SPEC.seed, rows=400, intents=SPEC.intents
    )


def test_exact_row_counts() -> None:
    assert generate_day(DAYS[0], seed=1, rows=0, intents=10) == []
    assert len(generate_day(DAYS[0], seed=1, rows=1, intents=10)) == 1
    assert len(generate_day(DAYS[0], seed=1, rows=777, intents=10)) == 777
    with pytest.raises(ValueError, match="rows"):
        generate_day(DAYS[0], seed=1, rows=-1, intents=10)


# --- rows ---------------------------------------------------------------------------------


def test_schema_of_every_row(rows: list[dict]) -> None:
    assert len(rows) == SPEC.days * SPEC.rows_per_day
    for row in rows:
        assert list(row) == list(FIELDS)
        assert TIMESTAMP.match(row["timestamp"])
        assert re.fullmatch(r"[0-9a-f]{16}", row["request_id"])
        assert re.fullmatch(r"[0-9a-f]{12}", row["session_id"])
        assert row["locale"] in {"en-US", "en-GB", "en-IN", "en-AU", "en-CA"}
        assert row["device"] in {"speaker", "phone", "car", "tv", "watch"}
        assert isinstance(row["question"], str)
        assert ANSWER_ID.match(row["answer_id"])
        confidence = row["confidence"]
        assert isinstance(confidence, float) and 0.0 <= confidence <= 1.0
        assert round(confidence, 3) == confidence


def test_timestamps_inside_their_day_and_sorted() -> None:
    for day in DAYS[:3]:
        stamps = [r["timestamp"] for r in generate_day(day, seed=SPEC.seed, rows=2200, intents=400)]
        assert stamps == sorted(stamps)
        assert {datetime.fromisoformat(s).date() for s in stamps} == {day}


def test_locales_and_devices_are_weighted(rows: list[dict]) -> None:
    locales = Counter(r["locale"] for r in rows)
    assert locales.most_common(1)[0][0] == "en-US" and len(locales) >= 4
    assert Counter(r["device"] for r in rows).most_common(1)[0][0] == "speaker"


def test_every_intent_appears_and_popularity_is_skewed(
    rows: list[dict], catalogue: dict[str, Intent]
) -> None:
    counts = Counter(r["answer_id"] for r in rows)
    normal = sorted(counts[a] for a, i in catalogue.items() if not i.generic)
    assert len(normal) == SPEC.intents and normal[0] >= 3
    assert len(counts) >= 300  # several hundred distinct answer ids
    assert normal[-1] >= 10 * normal[len(normal) // 2]  # Zipf head
    # Popular questions repeat across days.
    assert Counter(r["question"] for r in rows).most_common(1)[0][1] >= 100


# --- what the pipeline relies on -----------------------------------------------------------


def test_generic_clusters_incoherent_normal_clusters_coherent(
    clusters: dict[str, set[str]],
) -> None:
    for answer_id in GENERIC_ANSWER_IDS:
        assert len(clusters[answer_id]) >= 30
        assert coherence(sorted(clusters[answer_id])) < 0.1, answer_id
    normal = [
        coherence(sorted(qs))
        for answer_id, qs in clusters.items()
        if answer_id not in GENERIC_ANSWER_IDS and len(qs) >= 3
    ]
    assert len(normal) >= 300
    assert sum(c >= 0.1 for c in normal) / len(normal) >= 0.95
    assert 0.2 <= sorted(normal)[len(normal) // 2] <= 0.6


def test_generic_answers_cover_unrelated_questions(catalogue: dict[str, Intent]) -> None:
    assert {"ans-yes", "ans-no", "ans-number-4", "ans-number-12", "ans-i-dont-know"} <= set(
        GENERIC_ANSWER_IDS
    )
    assert "what is two plus two" in catalogue["ans-number-4"].paraphrases
    assert "how many legs does a dog have" in catalogue["ans-number-4"].paraphrases
    assert all(len(catalogue[a].paraphrases) >= 20 for a in GENERIC_ANSWER_IDS)


def test_asr_noise(rows: list[dict], catalogue: dict[str, Intent]) -> None:
    misheard = truncated = odd_case = 0
    for row in rows:
        intent = catalogue[row["answer_id"]]
        if intent.generic or not row["question"].strip():
            continue
        tokens = tokenize(row["question"])
        clean = [p.split() for p in intent.paraphrases]
        clean_words = {w for p in clean for w in p}
        replacements = {r for w in clean_words for r in CONFUSIONS.get(w, ())}
        if any(t in replacements and t not in clean_words for t in tokens):
            misheard += 1
        if any(len(tokens) < len(p) and p[: len(tokens)] == tokens for p in clean):
            truncated += 1
        if re.search(r"\b[A-Z]{2,}\b|\b[a-z]+ [A-Z]", row["question"]):
            odd_case += 1
    n = len(rows)
    assert 0.005 < misheard / n < 0.2
    assert 0.005 < truncated / n < 0.2
    assert odd_case > 0
    # Voice transcripts: most questions carry no punctuation at all.
    unpunctuated = sum(not re.search(r"[?.,!]", r["question"]) for r in rows)
    assert unpunctuated / n > 0.9


def test_junk_rows_rare_but_present(rows: list[dict]) -> None:
    n = len(rows)
    empty = sum(not r["question"].strip() for r in rows)
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    duplicates = n - len(set(lines))
    assert 0 < empty / n < 0.01
    assert 0 < duplicates / n < 0.01
    # A retry is the same request: the same request id, nothing else shares one.
    ids = Counter(r["request_id"] for r in rows)
    assert sum(c - 1 for c in ids.values()) == duplicates


def test_false_negatives(rows: list[dict], catalogue: dict[str, Intent]) -> None:
    owner = {p: i for i in catalogue.values() for p in i.paraphrases}
    exact = [r for r in rows if r["question"] in owner]
    wrong = [r for r in exact if owner[r["question"]].answer_id != r["answer_id"]]
    assert 0.005 < len(wrong) / len(exact) < 0.05
    assert all(owner[r["question"]].related == r["answer_id"] for r in wrong)
