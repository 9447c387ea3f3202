"""Children that die with their parent (Linux ``PR_SET_PDEATHSIG``), so a killed test run or
`make up` never leaves workers behind. A no-op elsewhere.

libc is loaded here, at import, in the parent: the ``preexec_fn`` runs between fork and exec
of a possibly multi-threaded process, where only a bare system call is safe (no dlopen).
"""

from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1


def _load_prctl() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


def term_with_parent() -> None:
    """``preexec_fn`` for subprocess.Popen: SIGTERM this child when the parent (thread) exits."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM))
