"""Helpers of tools/train_default_model.py, tools/eval_default_model.py and tools/refresh_ppl_baseline.py
(data, training-side modeling, evaluation, decode-PPL baseline, model card). Import with `tools/` on
sys.path (the scripts do that)."""
