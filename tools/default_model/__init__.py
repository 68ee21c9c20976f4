"""The default model's tools: the scripts (train.py, train_tokenizer.py, eval_model.py,
refresh_ppl_baseline.py, stdlib_corpus.py, pack_stdlib_corpus.py) and their helpers (data,
training-side modeling, training phases, evaluation, decode-PPL baseline, model card). Import with
`tools/` on sys.path (the scripts do that)."""
