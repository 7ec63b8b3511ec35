"""capsmed.io's helpers that the other tests reach only indirectly."""

from __future__ import annotations

import os
import sys

import pytest


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_the_umask_is_read_without_setting_it(monkeypatch):
    """Setting the umask to 0 for an instant (to read it) gave a file another thread of
    the runner created in that instant mode 0666."""
    from capsmed import io

    old = os.umask(0o027)
    try:
        calls = []
        real = os.umask
        monkeypatch.setattr(io.os, "umask", lambda mask: calls.append(mask) or real(mask))
        assert io._umask() == 0o027 and calls == []
    finally:
        os.umask(old)
