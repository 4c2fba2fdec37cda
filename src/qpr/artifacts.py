"""The bundle's contract: the files a trained model consists of and how the service
searches it. Written by the pipeline, read by the service, the registry and evaluation."""

from __future__ import annotations

# The exported encoder's graph: "token_ids" int64 [batch, length] (0 = padding) in,
# "embeddings" float32 [batch, D] out; batch and length are dynamic.
INPUT_NAME = "token_ids"
OUTPUT_NAME = "embeddings"
