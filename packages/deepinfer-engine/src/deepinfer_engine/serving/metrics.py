"""Serving metrics (prometheus_client, one registry per server) and the periodic one-line log.

Updated by the engine loop (`LoopObserver`): after every step and at every idle wake-up, so a
scrape right after the loop applied an abort already shows the freed blocks. Latency buckets
start at 100 us: a decode step of a small model is well under a millisecond on the GPU. The
per-token latencies are `LoopHistogram`s: plain counters the loop thread alone writes, so one
delta of k tokens costs one observation, not k locked ones.
"""

from __future__ import annotations

import bisect
import logging
import math
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily

logger = logging.getLogger("deepinfer")

LATENCY_BUCKETS = (1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
                   20.0, 60.0, 120.0)
P = "deepinfer_"


class LoopHistogram:
    """A prometheus histogram written by one thread (the engine loop): `observe(value, count)`
    adds `count` observations of `value` without a lock; a scrape reads the counters as they are."""

    def __init__(self, name: str, doc: str, buckets: tuple[float, ...], registry: CollectorRegistry):
        self.name, self.doc, self.bounds = name, doc, list(buckets)
        self.counts = [0] * (len(buckets) + 1)   # the last: above every bound (+Inf)
        self.sum = 0.0
        registry.register(self)

    def observe(self, value: float, count: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += count   # bucket le=bound holds value <= bound
        self.sum += value * count

    @property
    def count(self) -> int:
        return sum(self.counts)

    def collect(self):
        cumulative, buckets = 0, []
        for bound, n in zip([*self.bounds, math.inf], list(self.counts)):
            cumulative += n
            buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), cumulative))
        yield HistogramMetricFamily(self.name, self.doc, buckets=buckets, sum_value=self.sum)


class ServingMetrics:
    def __init__(self, log_interval_s: float = 10.0):
        r = self.registry = CollectorRegistry()
        self.log_interval_s = log_interval_s
        g = lambda name, doc, **kw: Gauge(P + name, doc, registry=r, **kw)  # noqa: E731
        c = lambda name, doc, **kw: Counter(P + name, doc, registry=r, **kw)  # noqa: E731
        h = lambda name, doc: LoopHistogram(P + name, doc, LATENCY_BUCKETS, r)  # noqa: E731
        self.queue_depth = g("queue_depth", "requests not yet running: loop commands + waiting + grammar-held")
        self.running = g("num_requests_running", "requests running in the scheduler")
        self.waiting = g("num_requests_waiting", "requests waiting in the scheduler or for their grammar")
        self.live = g("num_requests_live", "requests added to the loop and not finished")
        self.slots_used = g("request_slots_used", "scheduler request slots held (running + waiting)")
        self.mtp_slots_used = g("mtp_slots_used", "speculation (MTP) info slots held")
        self.kv_used = g("kv_blocks_used", "KV cache blocks in use")
        self.kv_total = g("kv_blocks_total", "KV cache blocks in the pool")
        self.prefix_hit_rate = g("prefix_cache_hit_rate", "prompt tokens served from the prefix cache / all")
        self.tokens_per_s = g("generation_tokens_per_second", "generated tokens per second over the log interval")
        self.acceptance = g("draft_acceptance_rate", "accepted / verified drafts at each draft position",
                            labelnames=("position",))
        self.mean_acceptance_length = g("mean_acceptance_length", "tokens per request per decode step")
        self.steps = c("engine_steps", "engine steps")
        self.last_abort_step = g("last_abort_step", "engine step count when the last abort was applied")
        self.idle_step = g("resources_idle_step", "engine step count when KV blocks and request slots last "
                           "returned to idle (0 used)")
        self.aborts = c("aborts", "requests aborted (client disconnects included)")
        self.preemptions = c("preemptions", "requests preempted (recompute) when KV blocks ran out")
        self.generated = c("generation_tokens", "tokens generated")
        self.prompt_tokens = c("prompt_tokens", "prompt tokens of finished requests")
        self.finished = c("requests_finished", "finished requests", labelnames=("finish_reason",))
        self.grammar_failures = c("grammar_compile_fallbacks",
                                  "grammar compilations that failed or timed out (the request finished 'error')")
        self.http_errors = c("http_errors", "error responses", labelnames=("status",))
        self.api_workers = g("api_workers_connected", "API worker processes linked to the engine (serve --api-workers)")
        self.ttft = h("time_to_first_token_seconds", "arrival to first token")
        self.itl = h("inter_token_latency_seconds", "time between a request's tokens (per token)")
        self.e2e = h("e2e_request_latency_seconds", "arrival to finish")
        self.step_time = h("engine_step_seconds", "wall time of one engine step")
        self.grammar_compile = Histogram(P + "grammar_compile_seconds", "grammar submit to ready / failed", registry=r,
                                         buckets=LATENCY_BUCKETS)
        self.prefix_admissions = c("prefix_cache_admissions", "admissions by prefix-cache outcome: NONE = the "
                                   "longest cached prefix was used, else the PrefixMiss reason it was cut",
                                   labelnames=["reason"])
        self.prefix_cached_tokens = c("prefix_cached_tokens", "prompt tokens served from the prefix cache")
        self._seen = {"steps": 0, "aborts": 0, "preemptions": 0, "generated": 0}
        self._last_log = time.monotonic()
        self._was_idle = True
        self._tokens_at_log = 0

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ the HTTP app's side
    async def scrape(self) -> bytes:
        """/metrics' body (serving.api_worker.EngineClient gets it from the engine process instead)."""
        return self.render()

    def count_http_error(self, status: int) -> None:
        self.http_errors.labels(str(status)).inc()

    # ------------------------------------------------------------------ LoopObserver
    def on_delta(self, stream, delta, now: float) -> None:
        n = len(delta.token_ids)
        if n:
            if stream.first_token_at == now and stream.last_token_at is None:
                self.ttft.observe(now - stream.arrival)
                n -= 1   # the first token's latency is the TTFT
            if n and stream.last_token_at is not None:
                self.itl.observe((now - stream.last_token_at) / len(delta.token_ids), len(delta.token_ids))
        if delta.finished:
            self.e2e.observe(now - stream.arrival)
            self.finished.labels(delta.finish_reason or "none").inc()
            self.prompt_tokens.inc(delta.num_prompt_tokens)

    def on_step(self, llm, step_s: float) -> None:
        self.step_time.observe(step_s)
        self._update(llm)

    def on_idle(self, llm) -> None:
        self._update(llm)

    # ------------------------------------------------------------------ gauges from the engine
    def _update(self, llm) -> None:
        g, st = llm.engine.gauges(), llm.state
        stats = g.stats
        running, waiting = g.num_running, g.num_waiting
        self.running.set(running)
        self.waiting.set(waiting + g.num_held)
        self.queue_depth.set(llm.num_queued + waiting + g.num_held)
        self.live.set(st.num_live)
        self.slots_used.set(running + waiting)
        self.mtp_slots_used.set(g.num_used_mtp_slots)
        self.kv_total.set(g.num_blocks)
        used = g.num_blocks - g.num_free_blocks
        self.kv_used.set(used)
        idle = used == 0 and running + waiting == 0 and g.num_used_mtp_slots == 0
        if idle and not self._was_idle:
            self.idle_step.set(st.num_steps)
        self._was_idle = idle
        prompt = stats.num_prefill_tokens + stats.num_prefix_cached_tokens
        self.prefix_hit_rate.set(stats.num_prefix_cached_tokens / prompt if prompt else 0.0)
        for j, rate in enumerate(stats.acceptance_rate_per_position):
            self.acceptance.labels(str(j)).set(rate)
        self.mean_acceptance_length.set(stats.mean_acceptance_length)
        self._inc(self.steps, "steps", st.num_steps)
        self._inc(self.aborts, "aborts", st.num_aborts)
        self._inc(self.preemptions, "preemptions", stats.num_preemptions)
        self._inc(self.generated, "generated", stats.num_generated_tokens)
        self._inc(self.prefix_cached_tokens, "prefix_cached", stats.num_prefix_cached_tokens)
        for reason, n in g.admissions_by_prefix_miss.items():
            self._inc(self.prefix_admissions.labels(reason), "prefix:" + reason, n)
        self.last_abort_step.set(st.last_abort_step)
        for seconds, failed in g.grammar_compiles:
            self.grammar_compile.observe(seconds)
            if failed:
                self.grammar_failures.inc()
        now = time.monotonic()
        if now - self._last_log >= max(self.log_interval_s, 1.0):
            self.tokens_per_s.set((stats.num_generated_tokens - self._tokens_at_log) / (now - self._last_log))
            self._tokens_at_log, self._last_log = stats.num_generated_tokens, now
            if self.log_interval_s > 0:
                logger.info(self.summary_line())

    def _inc(self, counter, key: str, value: int) -> None:
        """Advance `counter` to the engine's cumulative `value` (keyed `key`)."""
        if value > self._seen.setdefault(key, 0):
            counter.inc(value - self._seen[key])
            self._seen[key] = value

    def summary_line(self) -> str:
        v = lambda m: m._value.get()  # noqa: E731
        acc = "/".join(f"{self.acceptance.labels(str(j))._value.get():.2f}"
                       for j in range(len(self.acceptance._metrics)))
        return (f"serve: running {v(self.running):.0f} waiting {v(self.waiting):.0f} queue {v(self.queue_depth):.0f} | "
                f"kv {v(self.kv_used):.0f}/{v(self.kv_total):.0f} blocks | prefix hit {100 * v(self.prefix_hit_rate):.1f}% | "
                f"gen {v(self.tokens_per_s):.1f} tok/s | draft acc {acc or '-'} | "
                f"preempt {self._seen['preemptions']} aborts {self._seen['aborts']} "
                f"grammar fallbacks {self.grammar_failures._value.get():.0f}")
