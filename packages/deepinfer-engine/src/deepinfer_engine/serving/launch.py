"""Start `deepinfer serve` as a subprocess on a free 127.0.0.1 port and wait until it is healthy
(tests, tools/load_bench.py, tools/soak.py).

    with ServerProcess(["--device", "cpu", "--block-size", "16"]) as server:
        openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants, `pid` first (Linux /proc; a process that exits meanwhile is skipped)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


class ServerProcess:
    def __init__(self, args: list[str], env: dict[str, str] | None = None, startup_timeout_s: float = 300.0,
                 log_path: str | Path | None = None):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.startup_timeout_s = startup_timeout_s
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None

    def start(self) -> ServerProcess:
        cmd = [sys.executable, "-m", "deepinfer_engine.cli", "serve", "--host", "127.0.0.1",
               "--port", str(self.port), *self.args]
        log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL   # noqa: SIM115
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} during start-up"
                                   + (f" (log: {self.log_path})" if self.log_path else ""))
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"server not healthy after {self.startup_timeout_s:g} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def pids(self) -> list[int]:
        """The server's processes: the engine process and its API workers (Linux /proc)."""
        return process_tree(self.proc.pid)

    def rss_bytes(self) -> int:
        """Resident memory of the server: the sum over its processes (Linux /proc)."""
        total = 0
        for pid in self.pids():
            try:
                with open(f"/proc/{pid}/status") as f:
                    total += next((int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:")), 0)
            except OSError:
                pass
        return total

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def scrape(base_url: str) -> dict[str, float]:
    """/metrics as {sample name with labels: value} (prometheus text format)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values
