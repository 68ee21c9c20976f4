import itertools

import numpy as np

from deepinfer_engine.verify_budget import StepTimeModel, VerifyBudgetPolicy, best_budget


def _brute_force_rate(gains: np.ndarray, base: float, slope: float) -> float:
    """Best tokens/time over every per-request prefix allocation (small cases)."""
    n, k = gains.shape
    best = 0.0
    for lens in itertools.product(range(k + 1), repeat=n):
        tokens = n + sum(gains[i, :l].sum() for i, l in enumerate(lens))
        best = max(best, tokens / (base + slope * (n + sum(lens))))
    return best


def test_budget_is_full_when_rows_are_free_and_minimal_when_drafts_are_hopeless():
    gains = np.cumprod(np.full((4, 5), 0.5), axis=1)
    assert best_budget(gains, base_ms=10.0, slope_ms=0.0) == 4 * 6
    assert best_budget(np.zeros((4, 5)), base_ms=10.0, slope_ms=1.0) == 4


def test_budget_rate_matches_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(30):
        gains = np.cumprod(rng.uniform(0, 1, size=(3, 3)), axis=1)
        base, slope = rng.uniform(1, 10), rng.uniform(0, 3)
        b = best_budget(gains, base, slope)
        n = gains.shape[0]
        top = np.sort(gains.reshape(-1))[::-1][: b - n].sum()
        assert np.isclose((n + top) / (base + slope * b), _brute_force_rate(gains, base, slope))


def test_plan_fixed_and_varlen():
    conf = np.array([[0.9, 0.9, 0.9], [0.1, 0.1, 0.1], [0.5, 0.5, 0.5]], np.float32)
    assert VerifyBudgetPolicy(3, varlen=False).plan(conf).tolist() == [3, 3, 3]
    policy = VerifyBudgetPolicy(3, varlen=True)
    assert policy.plan(conf).tolist() == [3, 3, 3]  # no timing yet: probes, the first at the full budget
    assert policy.plan(conf).sum() == round(0.5 * 9)   # the second probe: half the optional rows
    for rows in range(3, 13):  # rows cost as much as the fixed part: short budgets pay
        policy.step_time.add(rows, 1.0 * rows + 3.0)
    drafts = policy.plan(conf)
    assert drafts.sum() < 9 and drafts[0] >= drafts[2] >= drafts[1] and all(0 <= d <= 3 for d in drafts)


def test_step_time_model_fit():
    m = StepTimeModel(min_samples=3, refit_every=1)
    assert m.fit() is None
    for rows in (8, 16, 24, 32):
        m.add(rows, 2.0 + 0.5 * rows)
    base, slope = m.fit()
    assert np.isclose(base, 2.0) and np.isclose(slope, 0.5)


def test_step_time_model_ignores_one_off_slow_steps():
    """A step that captured a CUDA graph (seconds) must not flatten the line: with least squares
    one such sample among 40 gave slope 0 and a base of ~70 ms on the H200."""
    m = StepTimeModel()
    rng = np.random.default_rng(0)
    m.add(384, 4000.0)                                  # the first step: lazy graph capture
    for _ in range(40):
        rows = int(rng.choice([200, 280, 330, 384]))
        m.add(rows, 2.5 + 0.006 * rows + rng.normal(0, 0.02))
    m.add(300, 900.0)                                   # and a later one-off (inductor compile)
    base, slope = m.fit()
    assert abs(slope - 0.006) < 0.001 and abs(base - 2.5) < 0.3


def test_probing_gives_the_step_time_model_a_spread_under_a_steady_batch():
    """A steady batch planned at one budget would show the step-time line a single row count and
    it would never fit (fixed-length forever): the probes vary the budget until it fits, then
    every probe_interval-th plan probes again; between probes the plan is the model's B*."""
    rng = np.random.default_rng(1)
    n, nextn = 16, 5
    conf = rng.uniform(0.2, 0.95, size=(n, nextn)).astype(np.float32)
    policy = VerifyBudgetPolicy(nextn, varlen=True, probe_interval=8)
    budgets = []
    for _ in range(40):
        drafts = policy.plan(conf)
        rows = int(n + drafts.sum())
        budgets.append(rows)
        policy.step_time.add(rows, 5.0 + 0.05 * rows)   # rows cost: a full budget is not the best
    assert len(set(budgets[:8])) >= 3                    # probes while the model has no spread
    base, slope = policy.step_time.fit()
    assert np.isclose(base, 5.0) and np.isclose(slope, 0.05)
    best = best_budget(np.cumprod(conf, axis=1), base, slope)
    steady = [b for i, b in enumerate(budgets[8:], start=9) if i % 8]
    assert best < n * (nextn + 1) and all(abs(b - best) <= 1 for b in steady)


def test_step_time_fit_is_recomputed_every_refit_every_samples():
    m = StepTimeModel(min_samples=3, refit_every=4)
    for rows in (8, 16, 24):
        m.add(rows, 1.0 + 0.5 * rows)
    assert np.allclose(m.fit(), (1.0, 0.5))
    for rows in (8, 16, 24):                          # a slower device: not yet refitted
        m.add(rows, 2.0 + 1.0 * rows)
    assert np.allclose(m.fit(), (1.0, 0.5))
    m.add(32, 34.0)                                   # the fourth new sample: refit
    assert m.fit()[1] > 0.5


def test_full_budget_plans_every_draft():
    """Rows are free (flat line): the plan is fixed-length, without running the allocation."""
    policy = VerifyBudgetPolicy(5, varlen=True, probe_interval=1000)
    for rows in (10, 20, 30, 40, 50, 60, 10, 20):
        policy.step_time.add(rows, 4.0)
    conf = np.full((10, 5), 0.3, np.float32)
    assert policy.plan(conf).tolist() == [5] * 10
