"""Issue 9: text stop strings cut exactly (ids, logprobs, text), across tokens and inside accepted
draft blocks; the incremental detokenizer; streaming deltas hold back undecided text."""

import numpy as np
import pytest

from deepinfer_engine import LLM, SamplingParams
from deepinfer_engine.detokenizer import IncrementalDetokenizer, TokenTable
from deepinfer_engine.errors import InvalidRequestError
from deepinfer_engine.stop_strings import StopStringMatcher

MAX_TOKENS = 24


def _llm(nextn: int = 0) -> LLM:
    return LLM(device="cpu", block_size=16, max_num_batched_tokens=128, max_num_seqs=16, max_model_len=256,
               num_speculative_tokens=nextn, enable_mtp_varlen=False)


@pytest.fixture(scope="module")
def llm0():
    return _llm(0)


@pytest.fixture(scope="module")
def table(llm0):
    return TokenTable.from_tokenizer(llm0.tokenizer, llm0.engine.vocab_size)


def _prompts(n: int) -> list[list[int]]:
    rng = np.random.default_rng(1)
    return [rng.integers(7, 8000, size=int(rng.integers(3, 20))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def free_runs(llm0):
    prompts = _prompts(12)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2)
    return prompts, llm0.generate(prompt_token_ids=prompts, sampling_params=params, use_tqdm=False)


def _completing_token(tok, ids: list[int], text_len: int, text: str) -> int:
    """Index of the first token whose prefix decode covers text[:text_len]."""
    for k in range(len(ids)):
        if tok.decode(ids[: k + 1]).startswith(text[:text_len]) and len(tok.decode(ids[: k + 1])) >= text_len:
            return k
    raise AssertionError("never covered")


def _boundary_stop(tok, ids: list[int], text: str, min_k: int = 1) -> tuple[str, int, int] | None:
    """A 3-char ASCII stop string that spans the boundary between tokens k and k+1 (k >= min_k)
    and occurs first there: (stop, start, completing token index)."""
    for k in range(min_k, len(ids) - 1):
        end_k = len(tok.decode(ids[: k + 1]))
        for start in (end_k - 2, end_k - 1):
            stop = text[start: start + 3]
            if start < 0 or len(stop) < 3 or not stop.isascii() or not stop.strip() or "\ufffd" in text[:start + 3]:
                continue
            if text.find(stop) == start and end_k < start + 3 <= len(tok.decode(ids[: k + 2])):
                return stop, start, k + 1
    return None


def test_stop_string_spanning_two_tokens_cuts_exactly(llm0, free_runs):
    tok = llm0.tokenizer
    prompts, free = free_runs
    checked = 0
    for prompt, f in zip(prompts, free):
        found = _boundary_stop(tok, f.token_ids, f.text)
        if found is None:
            continue
        stop, start, k = found
        for include in (False, True):
            out = llm0.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
                temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2, stop=["\x00never", stop],
                include_stop_str_in_output=include), use_tqdm=False)[0]
            assert out.finish_reason == "stop" and out.stop_str == stop and out.stop_token_id is None
            assert out.text == f.text[: start + (len(stop) if include else 0)]
            assert out.token_ids == f.token_ids[: k + 1], "ids through the completing token, none after"
            # (batch 1 vs the batched free run: logprobs agree to float noise; batch_invariant tests pin bits)
            assert out.token_logprobs == pytest.approx(f.token_logprobs[: k + 1], abs=1e-4)
            assert [list(t) for t in out.top_logprobs] == [list(t) for t in f.top_logprobs[: k + 1]]
        checked += 1
    assert checked >= 3
    assert llm0.engine.scheduler.num_running() == 0 and not llm0.engine.has_unfinished()


def test_text_stop_keeps_the_finished_request_blocks_in_the_prefix_cache(free_runs):
    """A text stop ends the request with `abort_request`; the blocks its committed tokens filled were
    hashed step by step, so they stay in the prefix cache: a follow-up prompt that extends the
    stopped output (a chat turn) is served from the cache up to the last full block."""
    # the paged window layout: block-grain hits (with rings a hit needs an SWA snapshot: test_swa_tier.py)
    llm = LLM(device="cpu", block_size=16, max_num_batched_tokens=128, max_num_seqs=4, max_model_len=256,
              num_speculative_tokens=0, enable_prefix_caching=True, window_kv="paged")
    tok = llm.tokenizer
    prompt = np.random.default_rng(5).integers(7, 8000, size=40).tolist()
    free = llm.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True), use_tqdm=False)[0]
    found = _boundary_stop(tok, free.token_ids, free.text, min_k=12)
    assert found is not None
    stop, _, k = found
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
        temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, stop=[stop]), use_tqdm=False)[0]
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: k + 1]
    follow_up = prompt + out.token_ids + list(range(100, 164))   # long enough that the final-chunk floor does not bind
    before = llm.engine.stats.num_prefix_cached_tokens
    llm.generate(prompt_token_ids=[follow_up], sampling_params=SamplingParams(temperature=0, max_tokens=1),
                 use_tqdm=False)
    committed = len(prompt) + len(out.token_ids) - 1     # the last emitted token's KV was never written
    assert llm.engine.stats.num_prefix_cached_tokens - before == committed // 16 * 16 > len(prompt) // 16 * 16


def test_stop_string_inside_accepted_draft_block(llm0, free_runs, make_oracle):
    """Prefill emits token 0; the first decode step accepts drafts for tokens 1..5 (oracle) and
    samples token 6. A stop string completed by token k in 1..4 ends the request there: tokens
    k+1.. of the accepted block are never emitted."""
    prompts, free = free_runs
    tok = llm0.tokenizer
    make_oracle([p + f.token_ids for p, f in zip(prompts, free)], 5)
    picks = 0
    for prompt, f in zip(prompts, free):
        head = tok.decode(f.token_ids[:5])
        found = _boundary_stop(tok, f.token_ids[:5], head, min_k=0)
        if found is None or not (1 <= found[2] <= 4) or f.text.find(found[0]) != found[1]:
            continue
        stop, start, k = found
        llm = _llm(5)
        out = llm.generate(prompt_token_ids=[prompt], sampling_params=SamplingParams(
            temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=0, stop=[stop]), use_tqdm=False)[0]
        assert out.token_ids == f.token_ids[: k + 1] and out.text == f.text[:start]
        assert out.token_logprobs == pytest.approx(f.token_logprobs[: k + 1], abs=1e-4)
        assert out.num_accepted_tokens >= k, "the stop must fall inside accepted drafts"
        assert llm.engine.stats.num_generated_tokens == k + 1  # usage counts emitted tokens only
        assert llm.engine.scheduler.num_running() == 0 and not llm.engine.has_unfinished()
        picks += 1
        if picks == 3:
            break
    assert picks >= 1


def test_stop_matcher_unit():
    m = StopStringMatcher(["abc", "bcd", "x"])
    assert m.find("zzab", 0) is None
    hit = m.find("zzabcd", 4)         # both "abc" and "bcd" end in the new text: earliest end wins
    assert (hit.stop, hit.start, hit.end) == ("abc", 2, 5)
    assert m.find("abc", 3) is None   # ended inside already-checked text
    assert m.holdback("qqab") == 2 and m.holdback("qqb") == 1 and m.holdback("qq") == 0
    assert StopStringMatcher(["ab", "abcde"]).find("xabcde", 1).stop == "ab"


def test_incremental_detokenizer_matches_decode_and_holds_back_utf8(llm0, table):
    tok = llm0.tokenizer
    byte_token = {}
    for i, b in enumerate(table.token_bytes):
        if len(b) == 1:
            byte_token.setdefault(b[0], i)
    assert len(byte_token) == 256  # ByteLevel: every byte is a token
    det = IncrementalDetokenizer(table)
    pieces = [det.push(byte_token[b]) for b in "哤".encode()]
    assert pieces == ["", "", "哤"] and det.offsets == [0, 0, 1]
    rng = np.random.default_rng(0)
    for _ in range(200):
        ids = rng.integers(0, len(table), size=int(rng.integers(1, 12))).tolist()
        if rng.random() < 0.5:  # splice in raw multi-byte pieces, sometimes truncated
            ids += [byte_token[b] for b in "é中😀".encode()[: int(rng.integers(1, 10))]]
        det = IncrementalDetokenizer(table)
        for j, t in enumerate(ids):
            det.push(t)
            if j % 3 == 0:   # a read in the middle must not disturb later appends
                assert det.text == det.text_since(0)
        det.finish()
        text = det.text
        assert text == tok.decode(ids), ids
        # the per-token readers: length and tails, without joining the whole text
        assert det.length == len(text) and det.offsets[-1] == len(text)
        for start in range(len(text) + 2):
            assert det.text_since(start) == text[start:]


def test_streaming_deltas_concatenate_and_never_show_a_stop(llm0, free_runs):
    tok = llm0.tokenizer
    prompts, free = free_runs
    stops = []
    for f in free:
        found = _boundary_stop(tok, f.token_ids, f.text)
        stops.append([found[0]] if found else [])
    params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, stop=s) for s in stops]
    text: dict[int, str] = {}
    toks: dict[int, list[int]] = {}
    final = {}
    for d in llm0.generate_stream(prompt_token_ids=prompts, sampling_params=params):
        assert d.index not in final, "nothing after the finished delta"
        text[d.index] = text.get(d.index, "") + d.text
        toks[d.index] = toks.get(d.index, []) + d.token_ids
        for s in stops[d.index]:
            assert s not in text[d.index]
        if d.finished:
            final[d.index] = d.output
    assert sorted(final) == list(range(len(prompts)))
    for i, out in final.items():
        assert text[i] == out.text and toks[i] == out.token_ids
        if stops[i]:
            assert out.finish_reason == "stop" and out.stop_str == stops[i][0]


def test_streaming_holds_back_a_possible_stop_prefix(llm0, free_runs):
    """A stop string that never completes but whose prefix ends the text of some step: that tail
    is withheld until the next token rules it out, and the final text is complete."""
    prompts, free = free_runs
    f = free[0]
    k = 5
    prefix = llm0.tokenizer.decode(f.token_ids[: k + 1])
    stop = prefix[-1] + "\x01\x02"  # last char of step k's text, then characters the model never writes
    seen = []
    for d in llm0.generate_stream(prompt_token_ids=[prompts[0]], sampling_params=SamplingParams(
            temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, stop=[stop])):
        seen.append(d)
    emitted = ""
    for d in seen:
        emitted += d.text
        if len(d.output.token_ids) == k + 1 and not d.finished:
            assert emitted == prefix[:-1], "the possible stop prefix is held back"
    assert emitted == f.text and seen[-1].output.finish_reason == "length"


def test_new_sampling_fields_validate():
    for kw, field in [({"stop": [""]}, "stop"), ({"stop": [1]}, "stop"), ({"stop": ["a"] * 17}, "stop"),
                      ({"prompt_logprobs": 21}, "prompt_logprobs"), ({"prompt_logprobs": -1}, "prompt_logprobs"),
                      ({"include_stop_str_in_output": 1}, "include_stop_str_in_output"),
                      ({"structured_output": "json"}, "structured_output")]:
        with pytest.raises(InvalidRequestError) as err:
            SamplingParams(**kw)
        assert err.value.field == field
    assert SamplingParams(stop="x").stop == ["x"]
