"""Searching at query time: the dense index, BM25, their fusion, the query encoders and
the loaded bundle. numpy, onnxruntime, faiss, pyarrow; never torch."""
