"""Training every model family through one loop (loop.py): a step per family (the encoder,
the query student, the re-ranker), configs built from the settings, validation measures,
checkpoints, mined hard negatives and a teacher's vectors."""
