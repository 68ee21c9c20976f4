"""Test helpers for multi-process code: a group of spawned gloo ranks that runs functions on request.

    with RankGroup(2) as group:             # one spawn per test module (a pytest fixture)
        a, b = group.run(fn, arg)           # fn(rank, world, arg) on every rank, results in rank order

`fn` is a module-level function; the children load its file by path (a test file works: its
rank-side bodies sit beside the tests that call them).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import queue
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

RESULT_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _next(inbox, parent_pid: int):
    """The next request; None (stop) once the parent process is gone (no orphans)."""
    while True:
        try:
            return inbox.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent_pid:
                return None


def _rank_main(rank: int, world: int, port: int, inbox, outbox, parent_pid: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    modules: dict[str, object] = {}
    try:
        while (item := _next(inbox, parent_pid)) is not None:
            path, name, arg = item
            try:
                if path not in modules:
                    spec = importlib.util.spec_from_file_location(f"_rank_module_{len(modules)}", path)
                    modules[path] = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(modules[path])
                fn = getattr(modules[path], name)
                outbox.put((rank, True, fn(rank, world, arg)))
            except Exception:
                outbox.put((rank, False, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class RankGroup:
    def __init__(self, world: int = 2):
        ctx = mp.get_context("spawn")
        port = free_port()
        self.world = world
        self.inboxes = [ctx.Queue() for _ in range(world)]
        self.outbox = ctx.Queue()
        self.procs = [ctx.Process(target=_rank_main, args=(r, world, port, self.inboxes[r], self.outbox, os.getpid()), daemon=True)
                      for r in range(world)]
        for p in self.procs:
            p.start()

    def run(self, fn: Callable[[int, int, Any], Any], arg: Any = None) -> list[Any]:
        for box in self.inboxes:
            box.put((inspect.getfile(fn), fn.__name__, arg))
        results: list[Any] = [None] * self.world
        errors = []
        for _ in range(self.world):
            try:
                rank, ok, value = self.outbox.get(timeout=RESULT_TIMEOUT_S)
            except queue.Empty:
                raise TimeoutError(f"RankGroup.run({fn.__name__}): no result within {RESULT_TIMEOUT_S}s") from None
            results[rank] = value
            if not ok:
                errors.append(f"rank {rank}:\n{value}")
        if errors:
            raise RuntimeError("\n".join(errors))
        return results

    def close(self) -> None:
        for box in self.inboxes:
            box.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()

    def __enter__(self) -> RankGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
