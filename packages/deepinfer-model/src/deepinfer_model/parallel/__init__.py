"""Parallel model transforms: expert parallelism (expert_parallel.py) and its load balancer (eplb.py)."""
