"""Keeping a trained model in service: the model registry, and retraining on fresh logs.

registry.py           register, promote, roll back (MLflow aliases)
version_files.py      what a registry version stores, and its files put back together
promotion.py          which version serves: the promotion policy, on plain data
shadow.py             the shadow check: challenger and champion on the logged questions
cycle.py              one retraining cycle: its steps, commit point and rollback
layout.py             where a retraining run works, its lock, its errors
harvest.py            the service's feedback into new log files and evaluation cases
incoming.py           new log files: discover, validate, quarantine, archive, the ledger
merge.py              new log rows into the daily files of data/, never a duplicate
journal.py            the crash journal: snapshot before data/ changes, recovery after
carry.py              the deltas added while a cycle runs: kept by a rollback, published after
vcs.py                the run's git and DVC commands
processes.py          running dvc/git, and stopping what a killed run left running
registry_snapshot.py  the registry state a rollback puts back
summary.py            the run's summary and its report in words

Prefect stays out of this package (flows/retrain.py wires the cycle to it); MLflow is
reached only through registry.py and registry_snapshot.py.
"""
