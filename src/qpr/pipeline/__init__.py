"""Pipeline stages: each reads the previous stage's files, runs the library, gates the
result and writes its own outputs (atomically, only after its gates passed).

A stage function takes settings and paths and returns metrics, so the same code runs from
DVC, Prefect, the CLI and tests; Prefect and MLflow stay in flows/.
"""
