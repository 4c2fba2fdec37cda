"""Synthetic QA logs of any size (1M, 3M, 10M questions) with real questions' word statistics.

The embedded default logs (`qpr.data.synth`) hold a few thousand questions of a few hundred
hand-written intents. A scale corpus instead draws its words from distributions fitted to
the Quora questions (134,091 distinct questions, stemmed, English stop words removed):

- Question openers are real question words ("how do i", "what is the best", "why"...):
  they make the long posting lists of a real index. On Quora the most common term is in 40 %
  of the questions, the 10th in 5.6 %, the 100th in 0.85 %.
- Content words are pseudo-words drawn from a Zipf-Mandelbrot law (rank r has weight
  (r + 10)^-0.95): a long tail, and no content word in more than a few % of the questions
  (on Quora "best" is in 5.6 %, "india" in 2.6 %). The vocabulary grows with the corpus as
  Heaps' law says (21,875 stemmed terms at 134k questions, × (N / 134k)^0.55).
- A paraphrase cluster shares 1-4 core content words; each of its questions keeps, swaps for
  a cluster synonym, or drops each core word, adds 0-3 common words, and takes its own
  opener. Cluster sizes are geometric (45 % single questions, mean 2.2, at most 50).
- Noise: 5 % of questions carry a typo (two letters swapped), the tail of singleton words.

`docs/scale.md` compares the result with Quora at equal size (posting-list lengths, terms a
question, BM25 query cost).

Files: `<out>/logs-00000.parquet`, ... (question, answer_id, timestamp: the QA-log format
`qpr.data.loaders` reads), one per `shard_rows` questions, and `.manifest.json`. A shard
depends only on (seed, shard number, questions): shards can be written in any order, in
parallel, and a killed run resumes at the first shard not yet written.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from qpr.io import write_atomic, write_json_atomic

__all__ = ["ScaleSpec", "parse_count", "scale_queries", "shard_path", "write_scale_corpus"]

FORMAT = "qpr-scale-logs/1"
MANIFEST = ".manifest.json"  # hidden: the log loader reads every other file
QUORA_TERMS, QUORA_QUESTIONS, HEAPS = 21_875, 134_091, 0.55
ZIPF, MANDELBROT = 0.95, 10  # weight (rank + 10)^-0.95: no content word in over ~3 %

# (opener, weight): question words as they open Quora questions, most common first.
OPENERS: tuple[tuple[str, float], ...] = (
    ("what is the", 9), ("how do i", 8), ("what are the", 5), ("how can i", 5), ("why do", 3),
    ("what is the best way to", 3), ("which is the best", 3), ("how to", 3), ("why is", 3),
    ("is it possible to", 2), ("what are some", 3), ("can i", 2), ("what should i do", 2),
    ("how does", 2), ("do you think", 1), ("should i", 2), ("what does", 2), ("who is", 1),
    ("where can i get", 1), ("how much does", 1), ("how many", 1), ("is there any", 1),
    ("what would happen if", 1), ("what is your", 1), ("how did", 1), ("why does my", 1),
    ("what are good", 1), ("which", 1), ("when should i", 1), ("does", 1), ("what",  2),
    ("how", 2), ("what do you like about", 0.5), ("how do people", 0.5), ("have you", 0.5),
)  # fmt: skip
# Common content-like words mixed into any question ("india", "life", "good" on Quora).
COMMON = [
    "best",
    "good",
    "people",
    "life",
    "india",
    "world",
    "money",
    "time",
    "way",
    "new",
    "year",
    "use",
    "make",
    "get",
    "learn",
    "work",
    "online",
    "job",
    "business",
    "book",
    "movie",
    "company",
    "school",
    "phone",
    "app",
    "water",
    "old",
    "first",
    "free",
    "better",
    "love",
    "english",
    "engineering",
    "student",
    "university",
    "course",
    "indian",
    "girl",
    "friend",
]
# Stop words between the content words: BM25 drops them, the encoder reads them.
FILLERS = "the a in of for to my and on with is at".split()  # noqa: SIM905
_ONSETS = "b c d f g h j k l m n p r s t v w z br ch cl dr fr gr kl pl pr sh st tr".split()  # noqa: SIM905
_VOWELS = "a e i o u ai ea io ou".split()  # noqa: SIM905


@dataclass(frozen=True)
class ScaleSpec:
    """What a scale corpus is: its size, seed and shard size; the rest is fitted above."""

    questions: int
    seed: int = 13
    shard_rows: int = 500_000
    typo_rate: float = 0.05

    def __post_init__(self) -> None:
        if self.questions < 1 or self.shard_rows < 1:
            raise ValueError(
                f"questions and shard_rows must be >= 1, got {self.questions}, {self.shard_rows}"
            )

    @property
    def shards(self) -> int:
        return -(-self.questions // self.shard_rows)

    @property
    def vocabulary(self) -> int:
        """Content words to draw from: Heaps' law from Quora's size, doubled because a
        Zipf draw of N questions meets only part of its vocabulary."""
        return int(1.2 * QUORA_TERMS * (self.questions / QUORA_QUESTIONS) ** HEAPS) + 1000

    def rows_of(self, shard: int) -> int:
        return min(self.shard_rows, self.questions - shard * self.shard_rows)


def parse_count(text: str) -> int:
    """'10M' → 10_000_000, '134k' → 134_000, '2500' → 2500 (ValueError otherwise)."""
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:].lower(), 1)
    number = text[:-1] if scale > 1 else text
    try:
        value = int(float(number) * scale)
    except ValueError as exc:
        raise ValueError(f"not a count: {text!r} (e.g. 1M, 134k, 2500)") from exc
    if value < 1:
        raise ValueError(f"a count must be >= 1, got {text!r}")
    return value


def _pseudo_word(rank: np.ndarray) -> list[str]:
    """A pronounceable word per rank, longer for rarer words (as in real text); distinct
    ranks give distinct words (two syllables per 26·9·26·9 ranks, then three)."""
    onsets, vowels = len(_ONSETS), len(_VOWELS)
    out = []
    for r in rank.tolist():
        syllables, r = [], int(r)
        while True:
            syllables.append(_ONSETS[r % onsets] + _VOWELS[(r // onsets) % vowels])
            r //= onsets * vowels
            if r == 0 and len(syllables) >= 2:
                break
        out.append("".join(syllables))
    return out


class _Words:
    """The corpus' content vocabulary and its Zipf sampler (inverse CDF over ranks)."""

    def __init__(self, size: int) -> None:
        weights = (np.arange(1, size + 1, dtype=np.float64) + MANDELBROT) ** -ZIPF
        self.cdf = np.cumsum(weights / weights.sum())
        self.words = np.asarray(_pseudo_word(np.arange(size)), dtype=object)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.minimum(np.searchsorted(self.cdf, rng.random(n)), len(self.cdf) - 1)


def _typo(word: str, rng: np.random.Generator) -> str:
    if len(word) < 3:
        return word
    i = int(rng.integers(0, len(word) - 1))
    return word[:i] + word[i + 1] + word[i] + word[i + 2 :]


def _cluster_size(rng: np.random.Generator) -> int:
    return min(int(rng.geometric(0.45)), 50)


def _cluster_questions(
    words: _Words, rng: np.random.Generator, spec: ScaleSpec, size: int
) -> list[str]:
    """`size` paraphrases of one cluster (the rng state decides the cluster's words)."""
    core = words.draw(rng, int(rng.integers(2, 6)))
    synonyms = words.draw(rng, core.size)
    opener_cdf = _OPENER_CDF
    out: list[str] = []
    for _ in range(3 * size):  # a few tries: a cluster of short questions repeats itself
        if len(out) == size:
            break
        picked = []
        for word, synonym in zip(core.tolist(), synonyms.tolist(), strict=True):
            roll = rng.random()
            if roll < 0.75:
                picked.append(words.words[word])
            elif roll < 0.9:
                picked.append(words.words[synonym])
        for _ in range(int(rng.integers(0, 3))):
            picked.append(COMMON[int(rng.integers(0, len(COMMON)))])
        for _ in range(int(rng.integers(0, 4))):
            at = int(rng.integers(0, len(picked) + 1))
            picked.insert(at, FILLERS[int(rng.integers(0, len(FILLERS)))])
        if not picked:
            picked.append(words.words[core[0]])
        if len(picked) > 1 and rng.random() < 0.3:
            rng.shuffle(picked)
        if rng.random() < spec.typo_rate:
            at = int(rng.integers(0, len(picked)))
            picked[at] = _typo(picked[at], rng)
        opener = _OPENERS[int(np.searchsorted(opener_cdf, rng.random()))]
        text = f"{opener} {' '.join(picked)}"
        if text not in out:
            out.append(text)
    return out


_OPENERS = [o for o, _ in OPENERS]
_OPENER_CDF = np.cumsum([w for _, w in OPENERS]) / sum(w for _, w in OPENERS)


def _shard_frame(spec: ScaleSpec, shard: int, words: _Words) -> pd.DataFrame:
    """Shard `shard`'s rows: whole clusters until its row count, the last one cut."""
    rng = np.random.default_rng([spec.seed, shard])
    rows, questions, answers = spec.rows_of(shard), [], []
    cluster = 0
    while len(questions) < rows:
        size = _cluster_size(rng)
        texts = _cluster_questions(words, rng, spec, size)
        questions.extend(texts)
        answers.extend([f"s{shard}c{cluster}"] * len(texts))
        cluster += 1
    start = pd.Timestamp("2026-01-01") + pd.Timedelta(days=shard)
    offsets = np.sort(rng.integers(0, 86_400, rows)).astype("timedelta64[s]")
    return pd.DataFrame(
        {
            "question": questions[:rows],
            "answer_id": answers[:rows],
            "timestamp": start + pd.to_timedelta(offsets),
        }
    )


def shard_path(out_dir: Path, shard: int) -> Path:
    return out_dir / f"logs-{shard:05d}.parquet"


def _shards_to_write(spec: ScaleSpec, out_dir: Path) -> Iterator[int]:
    manifest = out_dir / MANIFEST
    if manifest.is_file():
        found = json.loads(manifest.read_text())
        if found.get("spec") != asdict(spec):
            raise ValueError(
                f"{out_dir} holds another scale corpus ({found.get('spec')}); "
                "write this one elsewhere"
            )
    for shard in range(spec.shards):
        if not shard_path(out_dir, shard).is_file():
            yield shard


def write_scale_corpus(
    spec: ScaleSpec, out_dir: Path, *, log: Callable[[str], None] = print
) -> list[Path]:
    """Write every shard not yet written (atomically), then the manifest; the shard paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = list(_shards_to_write(spec, out_dir))
    write_json_atomic(out_dir / MANIFEST, {"format": FORMAT, "spec": asdict(spec)})
    if todo:
        words = _Words(spec.vocabulary)
        for done, shard in enumerate(todo, 1):
            frame = _shard_frame(spec, shard, words)
            write_atomic(shard_path(out_dir, shard), lambda f, df=frame: df.to_parquet(f))
            log(f"scale corpus: shard {shard + 1}/{spec.shards} ({done}/{len(todo)} written)")
    return [shard_path(out_dir, s) for s in range(spec.shards)]


def scale_queries(spec: ScaleSpec, count: int, *, seed: int = 1) -> pd.DataFrame:
    """`count` new questions (not in the corpus) with the answer_id of the cluster they
    paraphrase: each regenerates a random cluster of a random shard and keeps one more
    variant of it, drawn after the cluster's logged questions. Columns question,
    answer_id."""
    words = _Words(spec.vocabulary)
    pick = np.random.default_rng([spec.seed, seed, 7])
    rows = []
    for shard in sorted(pick.integers(0, spec.shards, count).tolist()):
        rng = np.random.default_rng([spec.seed, shard])
        target = int(pick.integers(0, 50))
        produced = 0
        for cluster in range(target + 1):
            size = _cluster_size(rng)
            if cluster < target:
                produced += len(_cluster_questions(words, rng, spec, size))
                continue
            if produced + size > spec.rows_of(shard):
                break  # this cluster was cut from the shard
            state = rng.bit_generator.state
            texts = _cluster_questions(words, rng, spec, size)
            rng.bit_generator.state = state
            extra = _cluster_questions(words, rng, spec, size + 1)[-1]
            if extra not in texts:
                rows.append((extra, f"s{shard}c{cluster}"))
    return pd.DataFrame(rows, columns=["question", "answer_id"])
