"""Searching at query time: the dense index, BM25, their fusion, the query encoders, the
re-ranker, the one served ranking (`hybrid`: candidates → exact distances → fusion →
re-ranking → threshold) and the bundle (`loading` reads and cross-checks it, `bundle`
searches it through `hybrid`). numpy, onnxruntime, faiss, pyarrow; never torch."""
