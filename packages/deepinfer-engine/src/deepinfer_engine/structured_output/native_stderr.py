"""Capture what native code (xgrammar's C++ logger) writes to file descriptor 2 during one call.

xgrammar reports keywords it drops as `[hh:mm:ss] file.cc:N: Warning: ...` lines on the
process's stderr, where neither Python's `warnings` nor `sys.stderr` can see them. The schema
compiler wraps `Grammar.from_json_schema` in `capture_native_stderr()` and turns such a warning
into that request's error. Capture points fd 2 at a temporary file for the call (milliseconds;
one capture at a time, under a lock); whatever else was written meanwhile (another thread's
stderr) is not a warning and is written back to stderr afterwards.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading

_lock = threading.Lock()


class Captured:
    text: str = ""


@contextlib.contextmanager
def capture_native_stderr():
    captured = Captured()
    with _lock, tempfile.TemporaryFile(mode="w+b") as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            captured.text = tmp.read().decode("utf-8", "replace")
            others = "".join(ln for ln in captured.text.splitlines(keepends=True) if "Warning" not in ln)
            if others:
                sys.stderr.write(others)
