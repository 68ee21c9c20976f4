"""Acceptance 4: decoder bounded replay.

- The decode output after replay is compared with the exact reconstruction (every layer over
  every token); the divergence is printed and asserted bounded, and is exactly zero when the
  prompt fits in the window (the replay then covers the whole prompt).
- The replay (the consumer layers over the last min(W, P) prompt tokens) writes nothing
  prefix-cache visible: only the consumer layers' window planes (and the DFlash planes when the
  runner writes main keys) change.
"""


import torch

from deepinfer_model.testing import Driver, Seq, tiny_model

# Random weights give the worst case (nothing was trained to tolerate truncation); the bound
# guards against the replay silently leaking into the encoder side or growing with the length.
MAX_MEAN_KL = 0.05   # observed ~2e-3 on tiny


def greedy_continue(model, tokens, prompt_len, steps):
    toks = list(tokens)
    for _ in range(steps):
        ref = model.reference_forward(torch.tensor(toks), mode="bounded_replay", prompt_len=prompt_len)
        toks.append(int(ref.logits[-1].argmax()))
    return toks


def test_divergence_from_exact_is_reported_and_bounded():
    model = tiny_model()
    w = model.config.sliding_window
    g = torch.Generator().manual_seed(0)
    rows = []
    for prompt_len in (w // 2, w, 3 * w, 5 * w):
        prompt = torch.randint(4, 8192, (prompt_len,), generator=g).tolist()
        toks = greedy_continue(model, prompt, prompt_len, 8)
        bounded = model.reference_forward(torch.tensor(toks), mode="bounded_replay", prompt_len=prompt_len)
        exact = model.reference_forward(torch.tensor(toks), mode="exact")
        b = bounded.logits[prompt_len - 1 - bounded.logit_start:]            # last prompt row + decode rows
        e = exact.logits[prompt_len - 1:]
        kl = (torch.log_softmax(e, -1).exp() * (torch.log_softmax(e, -1) - torch.log_softmax(b, -1))).sum(-1)
        agree = (b.argmax(-1) == e.argmax(-1)).float().mean().item()
        rows.append((prompt_len, (b - e).abs().max().item(), kl.mean().item(), agree))
    print(f"\nbounded replay vs exact (random tiny weights, W = {w}):")
    print("  prompt  max|dlogit|  mean KL   top-1 agree")
    for p, d, kl, a in rows:
        print(f"  {p:6d}  {d:10.4f}  {kl:8.5f}  {a:8.2%}")
    for p, d, kl, _ in rows:
        if p <= w:
            assert d == 0.0, "prompt within the window: replay covers it, no divergence"
        else:
            assert d > 0.0 and kl < MAX_MEAN_KL


def _snapshot(cache):
    snap = {name: getattr(cache, name).clone() for name in ("index_k", "comp_stage", "engram_ids")}
    snap["kv"] = [cache.kv_plane(p).clone() for p in range(cache.layout.num_kv_planes)]   # plane by plane
    return snap


def test_replay_writes_only_consumer_window_planes():
    model = tiny_model()
    topo = model.config.topology
    w = model.config.sliding_window
    prompt = torch.randint(4, 8192, (53,), generator=torch.Generator().manual_seed(2)).tolist()
    caches = []
    for is_last in (False, True):
        drv = Driver(model, num_blocks=16, block_size=8, shuffle_seed=5)
        seq = Seq(list(prompt), prompt_len=53 if is_last else 10**6)
        drv.prefill([seq], [25])
        before = _snapshot(drv.cache)
        meta, out = drv.prefill([seq], [28])                     # last chunk: replays 16 >= W tokens
        assert out.full_rows.numel() == (w if is_last else 0)
        caches.append((before, _snapshot(drv.cache), seq.blocks))
    (before_a, enc_only, blocks), (_, with_replay, _) = caches
    lay = Driver(model).cache.layout
    consumer_planes = {lay.window_planes[l] for l in topo.consumer_layers}
    for name in ("index_k", "comp_stage", "engram_ids"):
        assert torch.equal(enc_only[name], with_replay[name]), name
    for plane in range(len(with_replay["kv"])):
        same = torch.equal(enc_only["kv"][plane], with_replay["kv"][plane])
        assert same == (plane not in consumer_planes), f"kv plane {plane}"
    # ... and within the consumer planes only the replay slots (last W prompt positions) changed.
    replay_slots = {blocks[p // 8] * 8 + p % 8 for p in range(53 - w, 53)}
    for plane in consumer_planes:
        changed = (with_replay["kv"][plane] != before_a["kv"][plane]).any(-1).nonzero().squeeze(1).tolist()
        assert set(changed) <= replay_slots
