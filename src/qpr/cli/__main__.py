"""`python -m qpr.cli`: the `qpr` command without its entry point (tests, benchmarks)."""

from qpr.cli import app

if __name__ == "__main__":
    app()
