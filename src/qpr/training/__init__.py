"""Training an encoder: one TrainConfig, the loop, validation measures, checkpoints,
mined hard negatives and a teacher's vectors."""
