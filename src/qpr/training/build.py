"""What a run starts from, as params.yaml describes it: the tokenizer and the tokens per
question it trains with, the encoder (seeded: the same initial weights every time) and the
loss.

Here rather than in qpr.model: the mapping from settings is the training run's (the loss is
train.*, the seed makes the run reproducible), while qpr.model builds encoders and losses
by name and never needs the settings. The evaluate stage's untrained baseline uses it too:
that baseline is the encoder as training starts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from qpr.config import Settings, SettingsError

if TYPE_CHECKING:
    from torch import nn

    from qpr.text.vocab import Vocabulary
    from qpr.text.wordpiece import WordPieceTokenizer


def encoder_max_len(settings: Settings) -> int:
    """Tokens per question the encoder trains and runs with: text.max_len (CNN) or
    model.transformer.max_len (word pieces, [CLS] and [SEP] included)."""
    if settings.model.encoder == "transformer":
        return settings.model.transformer.max_len
    return settings.text.max_len


def build_tokenizer(
    settings: Settings, train_texts: Sequence[str]
) -> Vocabulary | WordPieceTokenizer:
    """model.encoder = transformer: its packaged word-piece tokenizer (no vocabulary is
    built: the pretrained embeddings fix the ids). Else the vocabulary of the training
    questions: the top text.max_words words plus text.hash_bins hashing-trick bins."""
    if settings.model.encoder == "transformer":
        from qpr.text.wordpiece import WordPieceTokenizer

        transformer = settings.model.transformer
        return WordPieceTokenizer.from_package(transformer.package, max_len=transformer.max_len)
    from qpr.text.vocab import Vocabulary

    text = settings.text
    return Vocabulary.build(
        train_texts, max_words=text.max_words, hash_bins=text.hash_bins, min_count=text.min_count
    )


def build_encoder_and_loss(
    settings: Settings, vocab_size: int, *, num_classes: int | None = None
) -> tuple[nn.Module, nn.Module | None]:
    """The encoder and loss that params.yaml describes (seeded: same initial weights).

    num_classes: the distinct clusters of the pairs trained on
    (qpr.training.pairs.num_training_classes), needed by a classifying loss (amsoftmax);
    without it such a loss is not built and None stands in its place (for callers that only
    want the encoder)."""
    from qpr.model import build_encoder
    from qpr.training.checkpoint import seed_everything

    seed_everything(settings.seed)
    model = settings.model
    if model.encoder == "transformer":
        encoder = build_encoder(
            "transformer",
            package=model.transformer.package,
            projection_dim=model.transformer.projection_dim,
            normalize=model.normalize,
        )
        if vocab_size != encoder.vocab_size:
            raise SettingsError(
                f"model.encoder: transformer has {encoder.vocab_size:,} word-piece ids but the "
                f"tokenizer has {vocab_size:,}: models/vocab.json is not its tokenizer"
            )
    else:
        encoder = build_encoder(
            model.encoder,
            vocab_size=vocab_size,
            embedding_dim=model.embedding_dim,
            windows=tuple(model.windows),
            channels=model.channels,
            output_dim=model.output_dim,
            dropout=model.dropout,
            normalize=model.normalize,
        )
    loss = build_training_loss(settings, num_classes=num_classes, dim=int(encoder.output_dim))
    return encoder, loss


def build_training_loss(
    settings: Settings, *, num_classes: int | None, dim: int
) -> nn.Module | None:
    """The loss of train.loss; None for amsoftmax without num_classes (see above).

    Raises SettingsError for amsoftmax without model.normalize."""
    from qpr.model.losses import build_loss

    train = settings.train
    if train.loss == "sdml" and train.prior == "teacher":
        return build_loss(
            "sdml_teacher", smoothing=train.smoothing, temperature=train.teacher.temperature
        )
    if train.loss == "sdml":
        return build_loss("sdml", smoothing=train.smoothing, scale=train.scale)
    if train.loss == "triplet":
        return build_loss(
            "triplet",
            margin=train.margin,
            distance=train.distance,
            negatives=train.negatives,
            seed=settings.seed,
        )
    if train.loss == "amsoftmax":
        # AM-Softmax shapes angles only; the index ranks by L2 distance, which agrees with
        # cosine only on unit vectors. Failing beats silently serving a mismatched geometry
        # or changing the encoder behind the user's back.
        if not settings.model.normalize:
            raise SettingsError(
                "train.loss: amsoftmax trains cosine similarities, but the index ranks by L2 "
                "distance, which ranks like cosine only on unit vectors: set "
                "model.normalize: true (e.g. dvc exp run -S model.normalize=true)"
            )
        if num_classes is None:
            return None
        return build_loss(
            "amsoftmax",
            num_classes=num_classes,
            dim=dim,
            margin=train.am_margin,
            scale=train.am_scale,
            sampled_classes=train.am_sampled_classes,
        )
    raise SettingsError(f"train.loss: unknown loss {train.loss!r}")
