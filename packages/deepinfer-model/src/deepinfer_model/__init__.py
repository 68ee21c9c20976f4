"""deepinfer_model (scaffold; see docs/design.md)."""

__version__ = "0.1.0"
