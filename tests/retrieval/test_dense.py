"""FAISS index: factory rewriting, build, exclusion, -1 handling, persistence, gate checks."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from qpr.retrieval.dense import (
    IdMap,
    IndexConfig,
    RowDistances,
    build_index,
    distances_to,
    drop_excluded,
    ef_search_of,
    exact_recall_at_k,
    exact_twin,
    faiss_threads,
    fit_factory,
    gpu_available,
    higher_is_better,
    load_index,
    nlist_of,
    recall_against,
    refine_k_factor_of,
    save_index,
    search,
    self_retrieval_rate,
    set_ef_search,
    set_nprobe,
    set_refine_k_factor,
    stored_dim,
    use_per_query_scan,
)


def _vectors(n: int, d: int = 16, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------- factory strings


@pytest.mark.parametrize(
    ("factory", "n", "expected"),
    [
        ("IVF2000,Flat", 30_000, "IVF769,Flat"),
        ("IVF2000,Flat", 78_000, "IVF2000,Flat"),
        ("IVF2000, Flat", 100_000, "IVF2000,Flat"),
        ("IVF2000,PQ16", 10_000, "IVF256,PQ16"),
        ("OPQ16_64,IVF2000,PQ16x8", 10_000, "OPQ16_64,IVF256,PQ16x8"),
        ("IVF1024_HNSW32,Flat", 1_000, "IVF25_HNSW32,Flat"),
        ("PCA64,IVF100,SQ8", 50, "PCA64,IVF1,SQ8"),
        ("Flat", 5, "Flat"),
        ("HNSW32", 5, "HNSW32"),
        ("HNSW32,Flat", 5, "HNSW32,Flat"),
    ],
)
def test_fit_factory_rewrites_only_the_ivf_nlist(factory, n, expected):
    fitted, note = fit_factory(factory, n)
    assert fitted == expected
    assert (note is None) == (fitted == factory.replace(" ", ""))


def test_fit_factory_message_and_pq_floor():
    assert fit_factory("IVF2000,Flat", 30_000)[1] == (
        "IVF2000 needs 78,000 training vectors, have 30,000: using IVF769"
    )
    # 2**8 centroids per sub-quantizer need 39 vectors each: 9,000 are searched exactly
    assert fit_factory("IVF64,PQ8", 9_000) == (
        "Flat",
        "IVF64,PQ8: a PQ codebook of 2**8 centroids needs at least 9,984 training vectors, "
        "have 9,000: using exact search (Flat)",
    )
    assert fit_factory("IVF1024,PQ150x4fs,RFlat", 9, 32)[0] == "Flat"
    # examples/my_logs.csv: 40 questions get exact search, not IVF1,PQ128x4fs
    assert fit_factory("IVF1024,PQ150x4fs,RFlat", 40, 384)[0] == "Flat"
    assert fit_factory("IVF1024,PQ150x4fs,RFlat", 624, 384)[0] == "IVF16,PQ128x4fs,RFlat"
    with pytest.raises(ValueError):
        fit_factory("Flat", 0)


def test_a_small_corpus_is_searched_exactly_without_faiss_warnings(capfd):
    # 40 questions (examples/my_logs.csv) under the default factory: FAISS would train a
    # 16-centroid PQ codebook per sub-quantizer on them and warn for each one.
    notes: list[str] = []
    config = IndexConfig(factory="IVF1024,PQ150x4fs,RFlat", nprobe=384)
    index = build_index(_vectors(40, 384), config, seed=0, log=notes.append)
    assert isinstance(faiss.downcast_index(index), faiss.IndexFlat)
    assert "please provide at least" not in capfd.readouterr().err
    assert any("using exact search (Flat)" in note for note in notes)


@pytest.mark.parametrize(
    ("factory", "n", "d", "expected"),
    [
        ("IVF1024,PQ150x4fs,RFlat", 200_000, 300, "IVF1024,PQ150x4fs,RFlat"),
        ("IVF1024,PQ150x4fs,RFlat", 200_000, 128, "IVF1024,PQ128x4fs,RFlat"),
        ("IVF1024,PQ150x4fs,RFlat", 200_000, 384, "IVF1024,PQ128x4fs,RFlat"),
        ("IVF1024,PQ150x4fs,RFlat", 3_900, 100, "IVF100,PQ100x4fs,RFlat"),
        ("IVF64,PQ16", 10_000, 30, "IVF64,PQ15"),
        ("OPQ16_64,IVF64,PQ16", 10_000, 30, "OPQ16_64,IVF64,PQ15"),
        ("HNSW32,Flat", 10, 300, "HNSW32,Flat"),
    ],
)
def test_fit_factory_fits_pq_to_the_dimension(factory, n, d, expected):
    fitted, note = fit_factory(factory, n, d)
    assert fitted == expected
    assert (note is None) == (fitted == factory)
    if "PQ128" in fitted:
        assert note.endswith(
            "PQ150 needs a dimension divisible by 150, have " + f"{d}: using PQ128"
        )


# ---------------------------------------------------------------- build


def test_fast_scan_with_exact_re_ranking(tmp_path):
    """IVF + 4-bit PQ fast scan + exact re-ranking: k_factor set, kept on disk, and more
    candidates re-ranked give the exact neighbours back (PQ alone misses some)."""
    vectors, queries = _vectors(4_000, 32), _vectors(100, 32, seed=1)
    _, exact = search(
        build_index(vectors, IndexConfig("Flat", nprobe=1), seed=1, log=_quiet), queries, 10
    )
    lines: list[str] = []
    index = build_index(
        vectors,
        IndexConfig("IVF16,PQ16x4fs,RFlat", nprobe=16, refine_k_factor=1),
        seed=1,
        log=lines.append,
    )
    assert refine_k_factor_of(index) == 1.0 and nlist_of(index) == 16
    assert "exact re-ranking of 1x k candidates" in lines[-1]

    def recall() -> float:
        _, rows = search(index, queries, 10)
        return float(np.mean([len(set(r) & set(e)) / 10 for r, e in zip(rows, exact, strict=True)]))

    compressed_only = recall()
    # The re-ranked budget is k_factor·min(k, 20): asking for 100 re-ranks the same 20·k_factor
    # PQ candidates as asking for 20, so the first 20 do not change.
    set_refine_k_factor(index, 8)
    assert np.array_equal(search(index, queries, 100)[1][:, :20], search(index, queries, 20)[1])
    set_refine_k_factor(index, 1)
    # k = 1 is asked as at least MIN_REFINED_K re-ranked ones: the same first hit as k = 10
    assert np.array_equal(search(index, queries, 1)[1][:, 0], search(index, queries, 10)[1][:, 0])
    assert set_refine_k_factor(index, 16)
    assert compressed_only < 0.9 < 0.99 <= recall()  # nprobe = nlist: only PQ can miss
    again = load_index(save_index(index, tmp_path / "fs.faiss"), nprobe=16)
    assert refine_k_factor_of(again) == 16.0
    # Reconstruction reads the exact vectors kept for re-ranking.
    assert np.array_equal(again.reconstruct(7), vectors[7])
    with pytest.raises(ValueError, match="k_factor"):
        set_refine_k_factor(index, 0.5)
    flat = build_index(vectors, IndexConfig("Flat", nprobe=1), seed=1, log=_quiet)
    assert not set_refine_k_factor(flat, 4) and refine_k_factor_of(flat) is None
    assert nlist_of(flat) is None


def test_nlist_reduction_is_logged_and_applied():
    lines: list[str] = []
    index = build_index(
        _vectors(500), IndexConfig("IVF64,Flat", nprobe=4), seed=1, log=lines.append
    )
    ivf = faiss.extract_index_ivf(index)
    assert ivf.nlist == 500 // 39 == 12
    assert ivf.nprobe == 4
    assert index.ntotal == 500
    assert lines[0] == "IVF64 needs 2,496 training vectors, have 500: using IVF12"
    assert "built IVF12,Flat" in lines[-1]


def test_training_is_deterministic_for_a_seed():
    x = _vectors(2_000)
    a = build_index(x, IndexConfig("IVF16,Flat", nprobe=2), seed=7, log=_quiet)
    b = build_index(x, IndexConfig("IVF16,Flat", nprobe=2), seed=7, log=_quiet)
    centroids = [faiss.extract_index_ivf(i).quantizer.reconstruct_n(0, 16) for i in (a, b)]
    np.testing.assert_array_equal(*centroids)
    np.testing.assert_array_equal(search(a, x[:50], 5)[1], search(b, x[:50], 5)[1])


def test_bad_input_is_refused():
    x = _vectors(100)
    x[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        build_index(x, IndexConfig("Flat", nprobe=1), seed=0, log=_quiet)
    with pytest.raises(ValueError, match="metric"):
        build_index(_vectors(10), IndexConfig("Flat", nprobe=1, metric="cos"), seed=0, log=_quiet)


def test_flat_index_ignores_nprobe_with_a_log_line():
    lines: list[str] = []
    index = build_index(_vectors(300), IndexConfig("Flat", nprobe=8), seed=0, log=lines.append)
    assert index.ntotal == 300
    assert any("nprobe=8 ignored" in line for line in lines)


def test_hnsw_index_takes_ef_search_and_ef_construction():
    lines: list[str] = []
    index = build_index(
        _vectors(300),
        IndexConfig("HNSW16", nprobe=8, ef_search=40, ef_construction=30),
        seed=0,
        log=lines.append,
    )
    assert index.ntotal == 300
    assert faiss.downcast_index(index).hnsw.efConstruction == 30
    assert ef_search_of(index) == 40
    assert "efConstruction 30, efSearch 40" in lines[-1]
    assert not any("ignored" in line for line in lines)


def test_ef_search_is_hnsw_only_and_nprobe_ivf_only():
    hnsw = build_index(_vectors(300), IndexConfig("HNSW16,Flat", nprobe=1), seed=0, log=_quiet)
    ivf = build_index(_vectors(400), IndexConfig("IVF4,Flat", nprobe=1), seed=0, log=_quiet)
    assert set_ef_search(hnsw, 7) and ef_search_of(hnsw) == 7
    assert not set_ef_search(ivf, 7) and ef_search_of(ivf) is None
    assert set_nprobe(ivf, 3) and not set_nprobe(hnsw, 3)
    with pytest.raises(ValueError, match="ef_search"):
        set_ef_search(hnsw, 0)


def test_hnsw_build_is_reproducible_and_keeps_ef_search_on_disk(tmp_path):
    # 45k vectors: more than one insertion chunk, so the chunked add is exercised
    x = _vectors(45_000, d=8)
    first = build_index(
        x, IndexConfig("HNSW8,Flat", nprobe=1, ef_search=33, ef_construction=16), seed=0, log=_quiet
    )
    second = build_index(
        x, IndexConfig("HNSW8,Flat", nprobe=1, ef_search=33, ef_construction=16), seed=0, log=_quiet
    )
    a = save_index(first, tmp_path / "a.faiss").read_bytes()
    b = save_index(second, tmp_path / "b.faiss").read_bytes()
    assert a == b  # same vectors, same graph, byte for byte
    assert ef_search_of(load_index(tmp_path / "a.faiss", nprobe=1)) == 33
    assert ef_search_of(load_index(tmp_path / "a.faiss", nprobe=1, ef_search=90)) == 90
    # and it finds the true neighbours of most queries at a modest efSearch
    assert exact_recall_at_k(first, x, x[:200] + 0.01, 10) > 0.9


@pytest.mark.skipif(gpu_available(), reason="checks the CPU fallback")
def test_gpu_flag_degrades_to_cpu_on_faiss_cpu():
    lines: list[str] = []
    index = build_index(
        _vectors(400), IndexConfig("IVF8,Flat", nprobe=2, use_gpu=True), seed=0, log=lines.append
    )
    assert isinstance(index, faiss.IndexIVFFlat)
    assert any("GPU requested" in line for line in lines)
    assert "CPU" in lines[-1]
    # auto mode says nothing about a GPU it does not have
    lines.clear()
    build_index(
        _vectors(400), IndexConfig("IVF8,Flat", nprobe=2, use_gpu=None), seed=0, log=lines.append
    )
    assert not any("GPU" in line for line in lines)


@pytest.mark.gpu
@pytest.mark.skipif(not gpu_available(), reason="needs faiss-gpu and a CUDA device")
def test_builds_and_searches_on_gpu_and_saves_a_cpu_index(tmp_path):
    x = _vectors(5_000, d=32)
    lines: list[str] = []
    index = build_index(
        x, IndexConfig("IVF64,Flat", nprobe=8, use_gpu=True), seed=0, log=lines.append
    )
    assert "GPU" in lines[-1]
    assert type(index).__name__.startswith("GpuIndex")
    _, rows = search(index, x[:100], 5, exclude=np.arange(100))
    assert not (rows == np.arange(100)[:, None]).any()
    assert self_retrieval_rate(index, x, 500, seed=0) > 0.99
    save_index(index, tmp_path / "gpu.faiss")
    loaded = load_index(tmp_path / "gpu.faiss", nprobe=8)
    assert isinstance(loaded, faiss.IndexIVFFlat) and loaded.ntotal == 5_000


# ---------------------------------------------------------------- search


def test_exclusion_removes_self_and_keeps_the_next_k():
    x = _vectors(1_000)
    index = build_index(x, IndexConfig("Flat", nprobe=1), seed=0, log=_quiet)
    queries = np.arange(20)
    d_all, r_all = search(index, x[queries], 6)
    assert (r_all[:, 0] == queries).all()  # a vector finds itself first
    d, r = search(index, x[queries], 5, exclude=queries)
    assert r.shape == (20, 5) and r.dtype == np.int64 and d.dtype == np.float32
    assert not (r == queries[:, None]).any()
    np.testing.assert_array_equal(r, r_all[:, 1:])
    np.testing.assert_array_equal(d, d_all[:, 1:])
    # a row that is not among the results: the k best are kept as they are
    far = np.full(20, 999, dtype=np.int64)
    far_rows = search(index, x[queries], 5, exclude=far)[1]
    np.testing.assert_array_equal(far_rows, r_all[:, :5])


def test_missing_results_stay_minus_one():
    x = _vectors(3)
    index = build_index(x, IndexConfig("Flat", nprobe=1), seed=0, log=_quiet)
    _, r = search(index, x, 5, exclude=np.array([0, 1, -1]))
    np.testing.assert_array_equal(r[:2, 2:], -1)  # 3 vectors, one excluded: 2 real rows
    assert (r[0, :2] != 0).all() and (r[1, :2] != 1).all()
    assert r[2, 0] == 2 and (r[2, :3] >= 0).all() and (r[2, 3:] == -1).all()
    # an exclude of -1 never removes FAISS's own -1 padding as if it were a row
    scores = np.array([[0.1, 0.2, 9.0, 9.0]])
    rows = np.array([[4, 5, -1, -1]])
    s, kept = drop_excluded(scores, rows, np.array([-1]), 3)
    np.testing.assert_array_equal(kept, [[4, 5, -1]])
    np.testing.assert_array_equal(s, [[0.1, 0.2, 9.0]])


def test_inner_product_metric_returns_similarities():
    x = _vectors(200)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    index = build_index(x, IndexConfig("Flat", nprobe=1, metric="ip"), seed=0, log=_quiet)
    assert higher_is_better(index)
    sims, rows = search(index, x[:5], 3)
    assert (rows[:, 0] == np.arange(5)).all()
    np.testing.assert_allclose(sims[:, 0], 1.0, rtol=1e-5)
    assert (np.diff(sims, axis=1) <= 0).all()


# ---------------------------------------------------------------- persistence


def test_save_load_round_trip_sets_nprobe(tmp_path):
    x = _vectors(2_000)
    index = build_index(x, IndexConfig("IVF32,Flat", nprobe=1), seed=3, log=_quiet)
    path = save_index(index, tmp_path / "models" / "index.faiss")
    loaded = load_index(path, nprobe=6)
    assert faiss.extract_index_ivf(loaded).nprobe == 6
    assert loaded.ntotal == 2_000
    faiss.extract_index_ivf(index).nprobe = 6
    np.testing.assert_array_equal(search(loaded, x[:40], 5)[1], search(index, x[:40], 5)[1])
    assert not list(path.parent.glob(".*tmp"))  # no temp file left behind


@pytest.mark.parametrize("factory", ["Flat", "IVF16,Flat", "HNSW8", "OPQ4,IVF16,PQ4", "PCA8,Flat"])
def test_stored_dim_reads_the_width_without_reading_the_index(tmp_path, factory):
    path = save_index(
        build_index(_vectors(1_000), IndexConfig(factory, nprobe=1), seed=0, log=_quiet),
        tmp_path / "index.faiss",
    )
    assert stored_dim(path) == _vectors(1).shape[1] == load_index(path, nprobe=None).d
    path.write_bytes(path.read_bytes()[:6])
    assert stored_dim(path) is None and stored_dim(tmp_path / "missing.faiss") is None


def test_id_map_round_trip_and_lookups(tmp_path):
    ids = IdMap(np.array([40, 10, 30, 20]))
    path = ids.save(IdMap.path_for(tmp_path / "index.faiss"))
    assert path.name == "index.ids.npy"
    loaded = IdMap.load(path)
    assert loaded.qids.dtype == np.int64 and len(loaded) == 4
    np.testing.assert_array_equal(loaded.qids, ids.qids)
    np.testing.assert_array_equal(loaded.to_qids(np.array([[1, -1], [3, 0]])), [[10, -1], [20, 40]])
    np.testing.assert_array_equal(loaded.to_rows(np.array([20, 40, 99])), [3, 0, -1])
    with pytest.raises(ValueError, match="unique"):
        IdMap(np.array([1, 2, 1]))


# ---------------------------------------------------------------- gate checks


def test_self_retrieval_rate_is_one_and_counts_exact_duplicates():
    x = _vectors(3_000)
    x[1] = x[0]  # an exact duplicate question: either row is a correct rank 1
    index = build_index(x, IndexConfig("IVF32,Flat", nprobe=1), seed=0, log=_quiet)
    assert self_retrieval_rate(index, x, sample=3_000, seed=0) == 1.0
    # vectors that do not match the index fail the check
    assert self_retrieval_rate(index, _vectors(3_000, seed=9), sample=200, seed=0) < 0.1


def test_exact_recall_at_k():
    x = _vectors(3_000)
    queries = _vectors(100, seed=5)
    flat = build_index(x, IndexConfig("Flat", nprobe=1), seed=0, log=_quiet)
    assert exact_recall_at_k(flat, x, queries, 10) == 1.0
    coarse = build_index(x, IndexConfig("IVF64,Flat", nprobe=1), seed=0, log=_quiet)
    recall = exact_recall_at_k(coarse, x, queries, 10)
    assert 0.0 < recall < 1.0
    faiss.extract_index_ivf(coarse).nprobe = 64  # every list: exact again
    assert exact_recall_at_k(coarse, x, queries, 10) == 1.0


def test_recall_against_hand_computed():
    approx = np.array([[1, 2, 3], [4, 5, -1], [7, 8, 9]])
    exact = np.array([[3, 2, 0], [4, 6, 8], [-1, -1, -1]])
    # 2/3, 1/3, and an empty reference counts as recalled
    assert recall_against(approx, exact) == pytest.approx((2 / 3 + 1 / 3 + 1) / 3)
    assert np.isnan(recall_against(approx[:0], exact[:0]))
    with pytest.raises(ValueError, match="approximate"):
        recall_against(approx[:1], exact)


@pytest.mark.parametrize("factory", ["IVF16,PQ16x4fs,RFlat", "IVF16,Flat", "HNSW8,Flat"])
def test_exact_twin_searches_the_stored_vectors_exhaustively(factory):
    x, queries = _vectors(2_000, 32), _vectors(50, 32, seed=3)
    index = build_index(x, IndexConfig(factory, nprobe=1), seed=0, log=_quiet)
    twin = exact_twin(index)
    assert twin.ntotal == index.ntotal and twin.metric_type == index.metric_type
    exact = faiss.IndexFlatL2(32)
    exact.add(x)
    assert np.array_equal(twin.search(queries, 10)[1], exact.search(queries, 10)[1])
    if factory.startswith("IVF"):  # one list of 16 probed: approximate, the twin is not
        assert recall_against(search(index, queries, 10)[1], twin.search(queries, 10)[1]) < 1


@pytest.mark.parametrize(
    "factory", ["Flat", "HNSW8,Flat", "IVF16,PQ16x4fs,RFlat", "IVF16,Flat", "IVF16,PQ8"]
)
def test_distances_to_are_the_stored_vectors_squared_l2(factory):
    # Flat storage (Flat, HNSW's, the re-ranking store) is read in place; IVF lists through
    # a direct map; PQ codes give their decoded vectors.
    x, queries = _vectors(2_000, 32), _vectors(3, 32, seed=4)
    index = build_index(x, IndexConfig(factory, nprobe=4), seed=0, log=_quiet)
    rows = np.array([[5, 17, -1, 1999], [0, 0, 3, -1], [-1, -1, -1, -1]])
    got = distances_to(index, queries, rows)
    stored = index.reconstruct_n(0, index.ntotal) if "PQ8" in factory else x
    for i in range(3):
        for j, row in enumerate(rows[i]):
            if row < 0:
                assert np.isinf(got[i, j])
            else:
                expected = ((queries[i] - stored[row]) ** 2).sum()
                assert got[i, j] == pytest.approx(expected, rel=1e-4)
    with pytest.raises(ValueError, match="rows must be"):
        distances_to(index, queries, rows[:2])


@pytest.mark.parametrize("factory", ["Flat", "HNSW8,Flat", "IVF16,PQ16x4fs,RFlat", "IVF16,PQ8"])
def test_row_distances_equal_distances_to(factory):
    # the one-question lookup reads the same storage the same way: equal float32 values
    x, queries = _vectors(2_000, 32), _vectors(3, 32, seed=5)
    index = build_index(x, IndexConfig(factory, nprobe=4), seed=0, log=_quiet)
    one_query = RowDistances(index)
    rows = np.array([1999, 5, 17, 0, 5])
    for i in range(3):
        want = distances_to(index, queries[i : i + 1], rows[None])[0]
        got = one_query(queries[i : i + 1], rows)
        assert got.dtype == np.float32 and np.array_equal(got, want)
    assert one_query(queries[:1], np.zeros(0, np.int64)).shape == (0,)
    if factory != "IVF16,PQ8":  # flat storage: FAISS would read outside it, so refused
        for bad in ([-1], [2_000]):
            with pytest.raises(ValueError, match="rows must be in"):
                one_query(queries[:1], np.array(bad))
        with pytest.raises(ValueError, match="query must be"):
            one_query(queries[:2], rows)


def test_one_query_runs_faiss_on_one_openmp_thread_and_leaves_the_callers_limit(monkeypatch):
    # FAISS splits a search by query: for one, a second thread would only spin beside it,
    # taking the core BM25's thread needs (docs/scale.md)
    x, queries = _vectors(2_000, 32), _vectors(4, 32, seed=5)
    index = build_index(x, IndexConfig("Flat", nprobe=1), seed=0, log=_quiet)
    flat = type(faiss.downcast_index(index))
    seen: list[tuple[str, int]] = []

    def recording(name, original):
        def method(self, *args, **kwargs):
            seen.append((name, faiss.omp_get_max_threads()))
            return original(self, *args, **kwargs)

        return method

    monkeypatch.setattr(type(index), "search", recording("search", type(index).search))
    monkeypatch.setattr(
        flat,
        "compute_distance_subset",
        recording("distances", flat.compute_distance_subset),
    )
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)
    try:
        one = search(index, queries[:1], 5)
        batch = search(index, queries, 5)
        distances = RowDistances(index)(queries[:1], np.array([3, 1, 4]))
        assert seen == [("search", 1), ("search", 2), ("distances", 1)]
        assert faiss.omp_get_max_threads() == 2
    finally:
        faiss.omp_set_num_threads(before)
    np.testing.assert_array_equal(one[1], batch[1][:1])
    np.testing.assert_array_equal(distances, distances_to(index, queries[:1], [[3, 1, 4]])[0])


def test_faiss_threads_sets_the_limit_meanwhile_and_puts_the_callers_back_on_error():
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)
    try:
        with faiss_threads(1):
            assert faiss.omp_get_max_threads() == 1
        assert faiss.omp_get_max_threads() == 2
        with pytest.raises(RuntimeError, match="inside"), faiss_threads(3):
            assert faiss.omp_get_max_threads() == 3
            raise RuntimeError("inside")
        assert faiss.omp_get_max_threads() == 2
        with faiss_threads(0):  # never below one thread
            assert faiss.omp_get_max_threads() == 1
        assert faiss.omp_get_max_threads() == 2
    finally:
        faiss.omp_set_num_threads(before)


def test_per_query_scan_is_set_on_fast_scan_indexes_and_finds_the_same_rows(tmp_path):
    x, queries = _vectors(3_000, 32), _vectors(64, 32, seed=8)
    index = build_index(x, IndexConfig("IVF16,PQ16x4fs", nprobe=6), seed=0, log=_quiet)
    ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
    assert ivf.implem == 11  # build_index sets it
    ivf.implem = 0  # FAISS's own choice
    auto = [index.search(queries[i : i + 1], 50) for i in range(len(queries))]
    batch_auto = index.search(queries, 50)
    assert use_per_query_scan(index) and ivf.implem == 11
    for i, (want_d, want_rows) in enumerate(auto):
        got_d, got_rows = index.search(queries[i : i + 1], 50)
        # same distances; rows at equal (quantised) distance may come in another order
        assert np.array_equal(np.sort(got_d), np.sort(want_d))
        assert set(got_rows[0][got_d[0] < got_d[0].max()]) <= set(want_rows[0])
    assert np.array_equal(index.search(queries, 50)[0], batch_auto[0])
    for factory in ("Flat", "HNSW8,Flat", "IVF16,Flat", "IVF16,PQ8"):
        assert not use_per_query_scan(
            build_index(x, IndexConfig(factory, nprobe=2), seed=0, log=_quiet)
        )
    # not stored in the file: load_index sets it again
    ivf.implem = 0
    loaded = load_index(save_index(index, tmp_path / "fs.faiss"), nprobe=6)
    assert faiss.downcast_index(faiss.extract_index_ivf(loaded)).implem == 11


def test_vector_shards_build_the_same_index_as_the_whole(tmp_path) -> None:
    from qpr.retrieval.dense import VectorShards, build_index_from_shards

    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((3000, 16)).astype(np.float32)
    paths = []
    for i, part in enumerate(np.array_split(vectors, 4)):
        paths.append(tmp_path / f"{i}.npy")
        np.save(paths[-1], part)
    shards = VectorShards(paths)
    assert len(shards) == 3000 and shards.dim == 16
    np.testing.assert_array_equal(shards.rows(np.array([2999, 0, 1500])), vectors[[2999, 0, 1500]])
    config = IndexConfig("IVF16,PQ8x4fs,RFlat", nprobe=4, use_gpu=False)
    quiet = lambda _: None  # noqa: E731
    a = build_index_from_shards(shards, config, seed=5, log=quiet)
    b = build_index(vectors, config, seed=5, log=quiet)
    for x, y in zip(search(a, vectors[:50], 10), search(b, vectors[:50], 10), strict=True):
        np.testing.assert_array_equal(x, y)
    assert self_retrieval_rate(a, shards, 100, 5) == self_retrieval_rate(b, vectors, 100, 5)


def test_vector_shards_refuse_mixed_widths(tmp_path) -> None:
    from qpr.retrieval.dense import VectorShards

    np.save(tmp_path / "a.npy", np.zeros((3, 4), np.float32))
    np.save(tmp_path / "b.npy", np.zeros((3, 5), np.float32))
    with pytest.raises(ValueError, match="one D"):
        VectorShards([tmp_path / "a.npy", tmp_path / "b.npy"])


def test_training_points_keep_small_corpora_whole_and_bound_large_ones() -> None:
    from qpr.retrieval.dense import training_points

    assert training_points(134_091, 1024) == 134_091  # Quora: every vector, as FAISS would
    assert training_points(5_000, 148) == 5_000
    assert training_points(10_000_000, 16_384) == 39 * 16_384  # the floor FAISS warns under
    assert training_points(1_000_000, 4096) == 2**31 // 4096
    assert training_points(10_000_000, 16) == 256 * 16  # FAISS's own subsample


@pytest.mark.parametrize("factory", ["Flat", "IVF4,PQ4x4fs,RFlat", "HNSW8,Flat", "IVF4,Flat"])
def test_stored_vectors_are_the_added_ones_in_row_order(factory: str) -> None:
    import faiss

    from qpr.retrieval.dense import stored_vectors

    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(300, 8)).astype(np.float32)
    index = faiss.index_factory(8, factory)
    index.train(vectors)
    index.add(vectors)
    np.testing.assert_array_equal(stored_vectors(index), vectors)


def test_stored_vectors_refuse_an_index_of_codes_only() -> None:
    import faiss

    from qpr.retrieval.dense import stored_vectors

    vectors = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)
    index = faiss.index_factory(8, "IVF4,PQ4x4fs")
    index.train(vectors)
    index.add(vectors)
    with pytest.raises(ValueError, match="no exact vectors"):
        stored_vectors(index)


@pytest.mark.parametrize("factory", ["Flat", "HNSW8,Flat", "IVF8,Flat", "IVF8,PQ4x4fs,RFlat"])
@pytest.mark.parametrize("share", [3, 400])  # 667 rows: the selector; 5 rows: exact scan
def test_allowed_rows_are_searched_inside_the_index(
    factory: str, share: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("qpr.retrieval.dense.EXACT_SCAN_ROWS", 100)
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((2000, 16)).astype(np.float32)
    allowed = np.zeros(len(vectors), bool)
    allowed[::share] = True
    assert (allowed.sum() <= 100) == (share == 400)
    index = build_index(
        vectors, IndexConfig(factory, nprobe=8, use_gpu=False), seed=0, log=lambda _: None
    )
    queries = vectors[:4] + 0.01
    _, rows = search(index, queries, 5, allowed=allowed)
    assert (rows >= 0).all() and allowed[rows].all()
    # the allowed rows' own nearest neighbours (exact), which a filtered search must find
    sub = np.flatnonzero(allowed)
    exact = ((queries[:, None, :] - vectors[sub][None]) ** 2).sum(-1)
    expected = sub[np.argsort(exact, axis=1)[:, :5]]
    assert (rows[:, 0] == expected[:, 0]).all()
    if factory == "Flat" or share == 400:
        assert rows.tolist() == expected.tolist()
    _, excluded = search(index, queries, 5, allowed=allowed, exclude=expected[:, 0])
    assert (excluded != expected[:, :1]).all() and allowed[excluded[excluded >= 0]].all()


def test_nothing_allowed_finds_nothing() -> None:
    vectors = np.random.default_rng(1).standard_normal((50, 8)).astype(np.float32)
    index = build_index(vectors, IndexConfig("Flat", nprobe=1, use_gpu=False), seed=0,
                        log=lambda _: None)  # fmt: skip
    _, rows = search(index, vectors[:2], 3, allowed=np.zeros(50, bool))
    assert (rows == -1).all()
    with pytest.raises(ValueError, match="allowed must be bool"):
        search(index, vectors[:2], 3, allowed=np.ones(50, np.int8))
