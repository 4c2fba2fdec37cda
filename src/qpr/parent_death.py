"""A child process that dies with its parent (Linux PR_SET_PDEATHSIG), so a parent killed
by SIGKILL, which runs no clean-up, never leaves its child running on alone.

Imports nothing else of qpr: every pipeline stage reaches it (flows/lifetime.py), so its
own deps stay this one file.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A `preexec_fn`: the child gets `sig` when the thread that started it dies (Linux;
    elsewhere nothing), so a killed parent never leaves its child working on alone."""
    parent = os.getpid()
    # Looked up here, in the parent: a child forked from a threaded parent must not load
    # a library (another thread may have held the loader's lock at the fork).
    prctl = None
    with contextlib.suppress(Exception):
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died before prctl: act as if after
            os.kill(os.getpid(), sig)

    return preexec
