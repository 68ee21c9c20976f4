"""The engine-path forward over paged caches (kernels package ops; their torch references today)."""
