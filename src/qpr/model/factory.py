"""Encoders by name, so params.yaml / checkpoints can say which one to build."""

from __future__ import annotations

from typing import Any

from torch import nn

from qpr.model.cnn import CNNEncoder
from qpr.model.static import StaticEncoder
from qpr.model.transformer import TransformerEncoder

# transformer.py imports `transformers` only when an encoder is built, so listing it here
# costs nothing on the CNN path.
ENCODERS: dict[str, type[nn.Module]] = {
    "cnn": CNNEncoder,
    "static": StaticEncoder,
    "transformer": TransformerEncoder,
}


def build_encoder(name: str, **kwargs: Any) -> nn.Module:
    """A fresh encoder: build_encoder("cnn", vocab_size=..., embedding_dim=..., ...) or
    build_encoder("transformer", package=..., projection_dim=..., normalize=...).

    Every encoder has a `name` class attribute and `config()` returning these kwargs, so
    build_encoder(enc.name, **enc.config()) rebuilds an equal architecture.
    """
    try:
        cls = ENCODERS[name]
    except KeyError:
        raise ValueError(f"unknown encoder {name!r}; known: {sorted(ENCODERS)}") from None
    return cls(**kwargs)
