"""Grammar compilation off the engine loop: a thread pool, a byte-bounded LRU cache, a timeout.

`GrammarCompilerService.submit(spec)` returns a `CompileTicket` at once; the engine polls tickets
between steps (`ticket.result(now)`), so a slow grammar never stalls other requests. Identical
specs (same `cache_key`) share one compilation, in flight or cached. The cache holds compiled
grammars up to `cache_bytes` (xgrammar's `memory_size_bytes`), evicting the least recently used.

Timeout: a compilation whose own duration exceeds `timeout_s`, or that is still running
`timeout_s` after submission, fails the waiting request with "structured_output: compile timed
out". xgrammar cannot be interrupted, so the worker runs to its end in the background; its result
is still cached if it succeeds (a retry then hits the cache). Workers are bounded (`max_workers`),
so runaway compilations queue instead of multiplying threads.
"""

from __future__ import annotations

import collections
import json
import re
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from deepinfer_engine.structured_output.native_stderr import capture_native_stderr
from deepinfer_engine.structured_output.spec import StructuredOutput
from deepinfer_engine.structured_output.xgrammar_compat import import_xgrammar

DEFAULT_CACHE_BYTES = 256 << 20
DEFAULT_TIMEOUT_S = 30.0


# xgrammar's C++ log prefix on error messages: "[05:43:55] /project/cpp/regex_converter.cc:94: "
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\]\s+\S+:\d+:\s*")


# xgrammar (0.2.8/0.2.9) spells the characters of a length-bounded JSON string (minLength/maxLength)
# as [^"\\\r\n], which admits raw control characters (\t, \x1c ...) that JSON forbids unescaped; its
# unbounded strings use [^\0-\x1f"\\\r\n]. We convert the schema to EBNF and tighten the bounded form.
_LOOSE_STRING_CHARS = r'[^\"\\\r\n]'
_STRICT_STRING_CHARS = r'[^\0-\x1f\"\\\r\n]'


def strict_json_strings(ebnf: str) -> str:
    return ebnf.replace(_LOOSE_STRING_CHARS, _STRICT_STRING_CHARS)


# xgrammar's notice that it compiles oneOf as anyOf: exact for the oneOf schema_check lets through
# (branches exclusive by type or by a tagged property), which xgrammar's own test cannot prove.
_ONE_OF_AS_ANY_OF = re.compile(r"oneOf .*falling back to anyOf")


class GrammarCompileError(Exception):
    """A grammar that cannot be compiled (invalid) or took too long (timeout)."""


@dataclass
class _Compiled:
    grammar: object          # xgrammar.CompiledGrammar
    seconds: float           # compile wall time (0 for a cache hit)
    nbytes: int


class ByteLRU:
    """LRU map bounded by the sum of its values' sizes in bytes."""

    def __init__(self, capacity_bytes: int):
        self.capacity = capacity_bytes
        self.nbytes = 0
        self._items: collections.OrderedDict = collections.OrderedDict()
        self.hits = self.misses = self.evictions = 0

    def get(self, key):
        item = self._items.get(key)
        if item is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return item

    def put(self, key, item: _Compiled) -> None:
        if item.nbytes > self.capacity:
            return  # larger than the whole cache: serve it, do not keep it
        old = self._items.pop(key, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._items[key] = item
        self.nbytes += item.nbytes
        while self.nbytes > self.capacity:
            _, evicted = self._items.popitem(last=False)
            self.nbytes -= evicted.nbytes
            self.evictions += 1

    def __len__(self) -> int:
        return len(self._items)


class CompileTicket:
    """One request's wait for its grammar."""

    def __init__(self, spec: StructuredOutput, future: Future, submitted: float, timeout_s: float):
        self.spec = spec
        self._future = future
        self.submitted = submitted
        self.timeout_s = timeout_s

    def done(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self._future.done() or now - self.submitted > self.timeout_s

    def wait(self):
        """Block until compiled or timed out, then result() (tools and tests; the engine polls)."""
        remaining = self.timeout_s - (time.monotonic() - self.submitted)
        try:
            self._future.result(timeout=max(0.0, remaining))
        except Exception:  # noqa: BLE001 - timeouts and compile errors are reported by result()
            pass
        return self.result()

    def result(self, now: float | None = None):
        """The compiled grammar; raises GrammarCompileError (invalid / timed out). Call when done()."""
        now = time.monotonic() if now is None else now
        if not self._future.done():
            if now - self.submitted > self.timeout_s:
                raise GrammarCompileError(f"compile timed out after {self.timeout_s:g} s ({self.spec.describe()})")
            raise RuntimeError("CompileTicket.result() before done()")
        try:
            compiled: _Compiled = self._future.result()
        except GrammarCompileError:
            raise
        except Exception as err:  # xgrammar raises RuntimeError with the parser's message
            lines = [_LOG_PREFIX.sub("", ln).strip() for ln in str(err).strip().splitlines()]
            lines = [ln for ln in lines if ln]
            raise GrammarCompileError(f"invalid {self.spec.kind}: {lines[0] if lines else type(err).__name__}") from None
        if compiled.seconds > self.timeout_s:
            raise GrammarCompileError(f"compile timed out: took {compiled.seconds:.3g} s > {self.timeout_s:g} s "
                                      f"({self.spec.describe()})")
        return compiled.grammar


class GrammarCompilerService:
    def __init__(self, tokenizer_info, *, max_workers: int = 2, cache_bytes: int = DEFAULT_CACHE_BYTES,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        xgr = import_xgrammar()
        # Our cache replaces xgrammar's (bounded by bytes, shared in-flight futures); one thread per
        # compilation inside xgrammar keeps the pool's bound meaningful.
        self._xgr = xgr
        self._compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=1, cache_enabled=False)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="deepinfer-grammar")
        self._lock = threading.Lock()
        self.cache = ByteLRU(cache_bytes)
        self._inflight: dict[tuple, Future] = {}
        self.timeout_s = timeout_s

    def submit(self, spec: StructuredOutput) -> CompileTicket:
        key = spec.cache_key
        now = time.monotonic()
        with self._lock:
            hit = self.cache.get(key)
            if hit is not None:
                fut: Future = Future()
                fut.set_result(_Compiled(hit.grammar, 0.0, hit.nbytes))
            else:
                fut = self._inflight.get(key)
                if fut is None:
                    fut = self._pool.submit(self._compile, spec)
                    self._inflight[key] = fut
        return CompileTicket(spec, fut, now, self.timeout_s)

    def _compile(self, spec: StructuredOutput) -> _Compiled:
        start = time.perf_counter()
        try:
            grammar = self._compile_now(spec)
        finally:
            with self._lock:
                self._inflight.pop(spec.cache_key, None)
        item = _Compiled(grammar, time.perf_counter() - start, int(grammar.memory_size_bytes))
        with self._lock:
            self.cache.put(spec.cache_key, _Compiled(grammar, 0.0, item.nbytes))
        return item

    def _compile_now(self, spec: StructuredOutput):
        c = self._compiler
        ws = {"any_whitespace": spec.any_whitespace}
        if spec.any_whitespace and spec.max_whitespace_cnt is not None:
            ws["max_whitespace_cnt"] = spec.max_whitespace_cnt
        if spec.kind in ("json_schema", "json_object"):
            schema = json.dumps(spec.checked_schema()) if spec.kind == "json_schema" else '{"type": "object"}'
            with capture_native_stderr() as captured:
                grammar = self._xgr.Grammar.from_json_schema(schema, strict_mode=spec.kind == "json_schema", **ws)
            warnings = [_LOG_PREFIX.sub("", ln).strip() for ln in captured.text.splitlines()
                        if "Warning" in ln and not _ONE_OF_AS_ANY_OF.search(ln)]
            if warnings:   # a keyword the backend dropped: refuse rather than emit unchecked output
                raise GrammarCompileError(f"json_schema: the grammar backend cannot enforce it: "
                                          f"{warnings[0].removeprefix('Warning: ')}")
            return c.compile_grammar(strict_json_strings(str(grammar)))
        if spec.kind == "regex":
            return c.compile_regex(spec.value)
        if spec.kind == "grammar":
            return c.compile_grammar(spec.value)
        raise GrammarCompileError(f"unknown kind {spec.kind!r}")

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
