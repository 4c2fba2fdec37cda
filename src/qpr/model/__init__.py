"""Question encoders, metric-learning losses and the cluster-disjoint batch sampler."""

from qpr.model.cnn import CNNEncoder
from qpr.model.factory import ENCODERS, build_encoder
from qpr.model.transformer import TransformerEncoder

__all__ = ["ENCODERS", "CNNEncoder", "TransformerEncoder", "build_encoder"]
