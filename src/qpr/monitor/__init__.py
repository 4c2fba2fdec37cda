"""Watching a served model: how live questions drift from the training questions.

drift.py    the drift measures, small functions over arrays (no I/O)

The monitor flow (flows/monitor.py) reads the service's query log, calls these and writes
the report; docs/operations.md ("Watching the service") shows one.
"""
