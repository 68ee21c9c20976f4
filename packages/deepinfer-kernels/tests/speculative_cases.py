"""The target / draft distributions the speculative-sampling exactness tests share
(``test_verification_speculative.py``, ``test_verification_varlen_exactness.py``).

Target p_m and draft q_m for positions m = 1..6 of one request: row k (k = 0..5) predicts
position k + 1; drafts x_1..x_5 ~ q_1..q_5 fill rows 1..5. Both distributions contain zeros the
other does not share, so accept, reject and residual paths are all exercised."""

import torch

P = torch.tensor([
    [0.30, 0.25, 0.20, 0.15, 0.10, 0.00],
    [0.05, 0.40, 0.05, 0.20, 0.00, 0.30],
    [0.25, 0.25, 0.25, 0.25, 0.00, 0.00],
    [0.10, 0.10, 0.50, 0.10, 0.10, 0.10],
    [0.00, 0.35, 0.15, 0.30, 0.10, 0.10],
    [0.60, 0.10, 0.10, 0.10, 0.10, 0.00],
], dtype=torch.float32)
Q = torch.tensor([
    [0.25, 0.25, 0.25, 0.10, 0.05, 0.10],
    [0.10, 0.30, 0.00, 0.25, 0.05, 0.30],
    [0.30, 0.20, 0.30, 0.10, 0.10, 0.00],
    [0.05, 0.15, 0.40, 0.15, 0.15, 0.10],
    [0.05, 0.30, 0.20, 0.25, 0.10, 0.10],
], dtype=torch.float32)
