"""Where data lives: local paths and fsspec URLs."""

from __future__ import annotations

import os


def is_remote(path) -> bool:
    """True for fsspec URLs other than local files (``s3://``, ``gs://``, ``memory://``...)."""
    text = os.fspath(path) if not isinstance(path, str) else path
    return "://" in text and not text.startswith("file://")
