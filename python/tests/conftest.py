"""Shared setup: which mcp_id_guard is under test.

packaging/test-packages.sh sets MCP_ID_GUARD_EXPECT_UNDER to the virtualenv the
wheel was installed into: the tests then refuse to run against any other copy
(a source tree on the path would test the wrong thing).
"""

from __future__ import annotations

import os
from pathlib import Path


def pytest_report_header(config):  # noqa: ANN001, ARG001 — pytest hook
    import mcp_id_guard

    return f"mcp_id_guard from {Path(mcp_id_guard.__file__).parent}"


def pytest_configure(config):  # noqa: ANN001, ARG001 — pytest hook
    expected = os.environ.get("MCP_ID_GUARD_EXPECT_UNDER")
    if not expected:
        return
    import mcp_id_guard
    from mcp_id_guard import _core

    for module in (mcp_id_guard, _core):
        where = Path(module.__file__).resolve()
        if not where.is_relative_to(Path(expected).resolve()):
            raise RuntimeError(f"{module.__name__} is {where}, not under {expected}: not the installed wheel")
