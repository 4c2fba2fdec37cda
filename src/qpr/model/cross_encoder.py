"""A cross-encoder re-ranker: one relevance logit per (question, candidate) pair.

    [CLS] question [SEP] candidate [SEP] → BertModel (all-MiniLM-L6-v2) → [CLS] state
    → BERT's pooler (dense + tanh) → dropout → linear → logit

Why: a bi-encoder (`qpr.model.transformer`) encodes each question alone, so a query and
a candidate never see each other's words; it is fast because the index holds vectors made
offline. A cross-encoder reads both questions in one sequence and attends across them,
which judges "same question?" better, but costs a transformer call per pair. So it only
re-orders the few candidates the first stage found (Nogueira & Cho 2019, "Passage
Re-ranking with BERT": BERT over [CLS] query [SEP] passage [SEP], the [CLS] vector into
a single-layer classifier, re-ranking BM25's top 1,000).

The weights start from the packaged all-MiniLM-L6-v2 (`qpr.text.pretrained`, nothing is
downloaded), its pooler included: that is the [CLS] head BERT was pretrained with (next
sentence prediction reads a pair the same way). The linear head starts as BERT initialises
its heads (normal, std initializer_range 0.02; seed torch before building). A zero head
would block every gradient into the body until Adam had grown it, step by tiny step.

Padding invariance: the attention mask hides [PAD] keys and only [CLS] is read, so extra
padding columns change a score by float rounding only.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from qpr.model.transformer import load_bert
from qpr.text.pretrained import DEFAULT_PACKAGE

PAD_ID = 0  # BERT's [PAD]


class CrossEncoder(nn.Module):
    """(token_ids, token_type_ids) LongTensor[B, L] (0 = [PAD]) → FloatTensor[B] logits.

    Rows are ``[CLS] a [SEP] b [SEP]`` with types 0 then 1
    (`qpr.text.wordpiece.WordPieceTokenizer.encode_pairs`); a higher logit means "b asks
    what a asks". Logits of one query's candidates compare with each other; they are not
    probabilities (the training loss is a softmax over each query's group).

    Args:
        package: importable package holding the pretrained BERT
            (`qpr.text.pretrained.package_model_dir`).
        dropout: before the head while training (BERT's own 0.1 by default).

    Example::

        model = CrossEncoder().eval()
        ids, types = tokenizer.encode_pairs(["how to learn python"], ["python tips"], max_len=64)
        model(torch.from_numpy(ids), torch.from_numpy(types)).shape  # torch.Size([1])
    """

    name = "cross_encoder"

    def __init__(self, package: str = DEFAULT_PACKAGE, *, dropout: float | None = None) -> None:
        super().__init__()
        self.bert = load_bert(package, pooler=True)
        hidden = int(self.bert.config.hidden_size)
        rate = float(self.bert.config.hidden_dropout_prob) if dropout is None else dropout
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {rate}")
        self.dropout = nn.Dropout(rate)
        self.head = nn.Linear(hidden, 1)
        nn.init.normal_(self.head.weight, std=float(self.bert.config.initializer_range))
        nn.init.zeros_(self.head.bias)
        self._config: dict[str, Any] = {"package": str(package), "dropout": rate}

    def config(self) -> dict[str, Any]:
        """Constructor kwargs (JSON-friendly), saved beside the weights:
        ``CrossEncoder(**config)`` rebuilds the architecture."""
        return dict(self._config)

    def forward(self, token_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        mask = (token_ids != PAD_ID).to(torch.int64)
        pooled = self.bert(
            input_ids=token_ids, attention_mask=mask, token_type_ids=token_type_ids
        ).pooler_output
        return self.head(self.dropout(pooled)).squeeze(-1)
