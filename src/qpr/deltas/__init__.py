"""Fresh questions without retraining: index deltas, tombstones and their compaction.

A bundle's main index (models/index/) is written by the index stage. Beside it, in a
folder of its own (`qpr.artifacts.DELTAS_DIR`, the index stage's persisted DVC output, so
`dvc repro` never wipes it):

    deltas/deltas.json           the manifest: version counter, each delta, the tombstones
    deltas/<NNNN>/               one delta: vectors.faiss (exact Flat), ids.npy,
                                 questions.parquet, bm25.npz
    index/absorbed.json          the manifest version the main index already holds

The manifest is the single commit point. A delta is written to a temporary folder,
fsynced, renamed to deltas/<NNNN>, and only then named in a new manifest (written
atomically). A crash before that rename or that manifest leaves the served state as it was:
a folder the manifest does not name is never read (and is removed by the next `add`).

One writer at a time: every add, delete, drop, compaction, publish and full build holds the
models folder's writer lock (`lock.py`) from its read of the manifest to its last write.
Readers (a load, the service) take no lock.

Versions: every `add`, `delete` and `drop` raises the counter by one. A delta carries the
version it was added at (the main index is version 0). A tombstone (question id, version v)
hides that id's rows in every part older than v. So a changed answer is one `add` of the
same id: its delta writes the tombstone that hides the old row. A deleted id comes back
only when a later delta adds it again.

Absorption: a full build (the index stage) and `compact` index the live questions of the
main set and of every delta, and record the manifest version they hold (absorbed.json).
Loading skips the deltas and tombstones at or below it. The manifest keeps them: the next
full build starts again from the cluster stage's questions and needs them once more.

BM25: a delta's weights use the main index's statistics (N, each term's df, the mean
length avgdl), frozen at the main build. Its words unknown to the main vocabulary score
nothing until compaction; each delta records how many of its word tokens that drops
(`unknown_tokens` / `tokens`). Compaction recomputes every statistic over all questions.

Loading (`format.load_parts`): the delta vectors are added to the loaded, in-memory copy
of the main index and the delta postings appended to the main BM25 postings, so one search
sees every row (the files on disk never change). Tombstoned rows are a row mask applied
inside the dense search and BM25, as a filter is (`qpr.retrieval.bundle.Bundle`).

A delta that fails its check (a file missing, altered or unreadable, rows that disagree,
vectors of another width or not finite) fails alone: a load leaves it out with the
tombstones its add wrote and names it; add, delete and compact refuse to build on it
until `drop` removes it (`format.check_deltas`, `format.require_sound`).

Modules (add.py imports format.py, both import lock.py; publish.py reaches the registry,
which imports format.py):

    format.py    the manifest (read, and `manifest_update`: its one writer), a delta
                 folder's files, the parts a load adds, what a full build indexes. What
                 the bundle loader and the index stage need: no framework, no torch.
    add.py       `qpr index add | delete | drop | compact`: files or frames into a new
                 delta, tombstones, undoing a delta, merging the deltas into the index.
    publish.py   after a change: pinned in dvc.lock, registered and promoted.
    lock.py      the writer lock (flock on models/.writer.lock), its wait and busy error.

No framework code: the CLI and flows/refresh.py call these functions.
"""
