"""Prefect flows: one per pipeline stage, plus the whole pipeline.

Thin by design: each flow wires library functions from `qpr` to Prefect tasks and to an
MLflow run; no algorithm lives here. Importing this package applies the shared
environment defaults before Prefect or MLflow are imported, and holds the chatty
libraries' loggers to the asked-for level (quiet by default).
"""

from qpr import environment

environment.apply()
environment.quiet_loggers()
