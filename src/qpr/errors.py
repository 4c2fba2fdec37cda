"""The package's error base. Every error a user can act on (bad data, a failed gate, a
bad setting, a missing or broken bundle, a registry refusal) derives from `QPRError`, so
a command line or a flow catches one class and prints one clear message.

Each subclass also keeps the builtin base it always had (ValueError, RuntimeError,
FileNotFoundError), so code that caught those still does. Imports nothing of `qpr`."""

from __future__ import annotations


class QPRError(Exception):
    """An error with a message meant for the person running QPR."""
