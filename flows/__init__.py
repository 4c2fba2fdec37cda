"""Prefect flows: one per pipeline stage, plus the whole pipeline.

Thin by design: each flow wires library functions from `qpr` to Prefect tasks and to an
MLflow run; no algorithm lives here. Importing this package applies the shared
environment defaults before Prefect or MLflow are imported, and holds the chatty
libraries' loggers to the asked-for level (quiet by default). Run as a program
(`python -m flows.stage NAME`, as dvc.yaml does), it first pins the math to one code path
on every CPU (qpr.environment.pin_math), before anything below loads numpy or torch.
"""

import sys

from qpr import environment

# Python sets argv[0] to "-m" while it imports the package of a module run with -m; an
# import from a test or another program leaves that program's math alone.
if sys.argv[:1] == ["-m"]:
    environment.pin_math()
environment.apply()
environment.quiet_loggers()
