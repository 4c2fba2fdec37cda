"""Question encoders, metric-learning losses and the cluster-disjoint batch sampler."""

from qpr.model.cnn import CNNEncoder
from qpr.model.factory import ENCODERS, build_encoder

__all__ = ["ENCODERS", "CNNEncoder", "build_encoder"]
