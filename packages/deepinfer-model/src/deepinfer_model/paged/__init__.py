"""The paged forward: the model over paged KV caches and flat rows (the kernels package's ops)."""
