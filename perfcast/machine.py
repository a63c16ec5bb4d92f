"""Which machine: a short, stable id of a host, shared by the trace reader and the
calibration (kept apart so that reading a trace does not import the calibration code)."""

from __future__ import annotations

import hashlib


def machine_id(hostname: str) -> str:
    """A short, stable id of a host: compares machines without writing their names."""
    return hashlib.sha256(hostname.encode("utf-8", "replace")).hexdigest()[:12]
