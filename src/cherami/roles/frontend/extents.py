"""Routes for stream-mode consumer groups (extent listing and offset commits)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from cherami.roles.frontend.app import Frontend


def add_stream_group_routes(app: web.Application, frontend: Frontend) -> None:
    """Registered by build_app; filled in by the Spark data source work."""
