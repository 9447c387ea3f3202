"""`make up`'s supervisor restarts what dies, says why, backs off, and counts the restarts."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from scripts.supervisor import Child, Supervisor, describe_exit
from tests.support.stack import wait_for


def supervise_until(sup: Supervisor, predicate, timeout_s: float = 15.0) -> None:  # type: ignore[no-untyped-def]
    def step() -> bool:
        sup.supervise()
        return bool(predicate())

    wait_for(step, timeout_s, interval_s=0.05, what="supervised condition")


def test_a_dying_child_is_reported_and_restarted_with_backoff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    restarted: list[str] = []
    sup = Supervisor({}, tmp_path, tmp_path / "logs", on_restart=lambda c: restarted.append(c.name))
    code = "import sys; print('cannot load the model: no such path', flush=True); sys.exit(75)"
    child = sup.start("inference", [sys.executable, "-c", code])
    try:
        supervise_until(sup, lambda: child.restarts == 2)
        assert restarted == ["inference", "inference"]
        err = capsys.readouterr().err
        assert "inference died (exit code 75: engine unhealthy)" in err
        assert "cannot load the model: no such path" in err  # its last words, not just a code
        assert child.quick_deaths >= 2  # dying at once: the backoff grows (1 s, then 2 s)
        assert (tmp_path / "logs" / "inference.log").read_text().count("cannot load") >= 2
    finally:
        sup.stop(timeout_s=5)


def test_a_killed_child_comes_back_and_stop_ends_everything(tmp_path: Path) -> None:
    sup = Supervisor({}, tmp_path, tmp_path / "logs")
    child: Child = sup.start("decode", [sys.executable, "-c", "import time; time.sleep(60)"])
    first_pid = child.process.pid if child.process else 0
    assert child.process is not None
    child.process.send_signal(signal.SIGKILL)
    supervise_until(sup, lambda: child.alive() and child.process and child.process.pid != first_pid)
    assert child.restarts == 1
    started = time.monotonic()
    sup.stop(timeout_s=5)
    assert not child.alive() and time.monotonic() - started < 5


def test_exit_descriptions() -> None:
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(1) == "exit code 1"
