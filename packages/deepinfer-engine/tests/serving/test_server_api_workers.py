"""`deepinfer serve --api-workers 2`: two HTTP worker processes over one engine process. Both link
to the engine; killing them mid-stream aborts their requests in the engine (blocks back to idle),
uvicorn starts new ones, and the server serves again; killing the engine process ends its workers.
(The OpenAI, error-matrix and disconnect suites run against this mode as well.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from deepinfer_engine.serving.launch import ServerProcess, scrape

MODEL = "deepinfer-default"
ARGS = ["--device", "cpu", "--block-size", "16", "--max-model-len", "512", "--max-num-seqs", "8",
        "--num-speculative-tokens", "2", "--log-interval", "0", "--api-workers", "2"]


def _worker_pids(server_pid: int) -> list[int]:
    """The uvicorn worker processes: the server's spawned children (not multiprocessing's tracker)."""
    pids = []
    for task in Path(f"/proc/{server_pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"multiprocessing.spawn" in cmd and b"resource_tracker" not in cmd:
                pids.append(int(child))
    return pids


def _wait_metrics(url: str, pred, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            m = scrape(url)
            if pred(m):
                return m
        except OSError:   # no worker accepting for a moment
            m = None
        assert time.monotonic() < deadline, m
        time.sleep(0.1)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads worker pids from Linux /proc")
def test_killed_workers_abort_their_requests_and_are_replaced():
    with ServerProcess(ARGS) as server:
        url = server.base_url
        m = _wait_metrics(url, lambda m: m["deepinfer_api_workers_connected"] == 2)
        assert m["deepinfer_kv_blocks_used"] == 0
        old = _worker_pids(server.proc.pid)
        assert len(old) == 2
        body = {"model": MODEL, "prompt": "def walk(path):", "max_tokens": 400, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))   # decoding now
            for pid in old:
                os.kill(pid, signal.SIGKILL)
            with pytest.raises(httpx.HTTPError):
                for _ in lines:
                    pass
        m = _wait_metrics(url, lambda m: m["deepinfer_api_workers_connected"] == 2 and m["deepinfer_kv_blocks_used"] == 0
                          and m["deepinfer_num_requests_live"] == 0)
        assert m["deepinfer_aborts_total"] == 1
        assert not set(_worker_pids(server.proc.pid)) & set(old)
        assert httpx.get(url + "/health").json() == {"status": "ok"}
        r = httpx.post(url + "/v1/completions", json={**body, "stream": False, "max_tokens": 8}, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8


def test_a_bad_worker_count_fails_before_the_model_loads():
    r = subprocess.run([sys.executable, "-m", "deepinfer_engine.cli", "serve", "--device", "cpu", "--api-workers", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--api-workers: must be >= 1, got 0" in r.stderr


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads worker pids from Linux /proc")
def test_workers_exit_when_the_engine_process_dies():
    """SIGKILL of the engine process (also uvicorn's supervisor): its orphaned workers notice the
    closed link and exit instead of holding the port, answering 503 forever."""
    with ServerProcess(ARGS) as server:
        _wait_metrics(server.base_url, lambda m: m["deepinfer_api_workers_connected"] == 2)
        workers = _worker_pids(server.proc.pid)
        assert len(workers) == 2
        server.proc.kill()
        server.proc.wait(10)
        deadline = time.monotonic() + 30
        try:
            while any(_alive(pid) for pid in workers):
                assert time.monotonic() < deadline, [pid for pid in workers if _alive(pid)]
                time.sleep(0.1)
        finally:   # a failing run leaves no orphans behind
            for pid in workers:
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
