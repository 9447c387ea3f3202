"""Children that die with their parent (Linux ``PR_SET_PDEATHSIG``), so a killed test run or
`make up` never leaves workers behind. A no-op elsewhere."""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1


def term_with_parent() -> None:
    """``preexec_fn`` for subprocess.Popen: SIGTERM this child when the parent exits."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
