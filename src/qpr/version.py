"""The package's version, defined once. pyproject.toml reads it from here (setuptools'
dynamic version); the service, the registry and the MLflow runs report it.

Ground floor: imports nothing, so a module that reports the version need not import the
`qpr` package (whose `Searcher` reaches the service's registry source).
"""

# 0.2.0: question and cluster ids in JSON are decimal strings (docs/serving.md, "Ids are
# strings"), a breaking change for clients of the service, `--json` and the pyfunc.
__version__ = "0.2.0"
