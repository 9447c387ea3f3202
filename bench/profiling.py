"""py-spy profiles of the stack's processes during one benchmark run (``--profile DIR``).

``py-spy record`` samples each component (the decode worker with its pool children) for as long
as the run lasts and writes collapsed stacks (``<name>.txt``, flamegraph input); ``top`` sums
them into the functions that hold the most samples, by themselves and with what they call.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path


class Profiler:
    def __init__(self, out: Path, pids: dict[str, int], rate: int = 200) -> None:
        if shutil.which("py-spy") is None and not Path(_py_spy()).exists():
            raise RuntimeError("py-spy is not installed (requirements-dev.txt)")
        out.mkdir(parents=True, exist_ok=True)
        self.out, self.pids, self.rate = out, pids, rate
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def __enter__(self) -> Profiler:
        for name, pid in self.pids.items():
            cmd = [_py_spy(), "record", "--pid", str(pid), "--rate", str(self.rate), "--format", "raw"]
            cmd += ["--output", str(self.out / f"{name}.txt"), "--subprocesses", "--nonblocking"]
            log = open(self.out / f"{name}.log", "wb")
            self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs.values():
            proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _py_spy() -> str:
    return shutil.which("py-spy") or str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "py-spy")


def stacks(collapsed: Path) -> list[tuple[list[str], int]]:
    """(frames outermost first, samples) per line of py-spy's raw output."""
    out = []
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            out.append(([f.split(" (")[0] for f in stack.split(";")], int(count)))
    return out


def top(collapsed: Path, n: int = 30) -> tuple[int, list[tuple[str, int, int]]]:
    """All samples, and (function, samples on top of the stack, samples anywhere in it) for the
    ``n`` functions holding the most samples by themselves."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for frames, count in stacks(collapsed):
        own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    return sum(own.values()), [(f, own[f], total[f]) for f, _ in own.most_common(n)]


def main(argv: list[str] | None = None) -> None:
    """``python -m bench.profiling DIR``: the top functions of every profile in DIR."""
    import sys

    folder = Path((argv or sys.argv[1:])[0])
    for path in sorted(folder.glob("*.txt")):
        samples, rows = top(path)
        print(f"\n== {path.stem}: {samples} samples ==\n{'own %':>7}{'total %':>9}  function")
        for name, own, total in rows:
            print(f"{100 * own / samples:7.1f}{100 * total / samples:9.1f}  {name}")


if __name__ == "__main__":
    main()
