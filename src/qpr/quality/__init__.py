"""Data-quality gates: Great Expectations suites (`suites`) and the `gate()` that runs them.

Import from the submodules (`from qpr.quality.gate import gate, GateFailed`). Nothing is
re-exported here: a `gate` function would shadow the `gate` submodule. Importing either
submodule is cheap; Great Expectations itself is imported only when a gate runs.
"""
