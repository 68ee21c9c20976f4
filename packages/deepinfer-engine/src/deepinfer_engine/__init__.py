"""deepinfer_engine (scaffold; see docs/design.md)."""

__version__ = "0.1.0"
