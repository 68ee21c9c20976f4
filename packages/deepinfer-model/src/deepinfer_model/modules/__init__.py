"""nn.Module building blocks of V4.1-Flash, one concept per file (HF parameter names)."""
