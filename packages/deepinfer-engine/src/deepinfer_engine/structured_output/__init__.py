"""Structured output (issue 9): typed specs, asynchronous xgrammar compilation with a byte-bounded
cache and a timeout, per-request matchers that roll back rejected drafts, per-row vocab masks.

Only `spec` is imported eagerly; xgrammar loads on the first grammar request."""

from deepinfer_engine.structured_output.spec import StructuredOutput

__all__ = ["StructuredOutput"]
