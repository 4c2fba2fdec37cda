"""The paper's CNN question encoder and vocabulary (Bonadiman et al. 2019, section 4.2),
the shape every CNN benchmark builds: params.yaml's defaults. Standard library only, so a
benchmark that runs where the project's other dependencies are missing can import it."""

from __future__ import annotations

from typing import Any

MAX_WORDS = 50_000  # vocabulary: the most frequent words of the training questions ...
HASH_BINS = 5_000  # ... plus hash bins for the rest
MAX_LEN = 40  # tokens per question
ENCODER_KW: dict[str, Any] = {
    "embedding_dim": 300,
    "windows": (5,),
    "channels": 300,
    "output_dim": 300,
}
