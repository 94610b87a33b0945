"""Errors a user can cause when pointing specdec at an endpoint (one line, exit status 2)."""

from __future__ import annotations

from specdec.errors import SpecdecError


class EndpointError(SpecdecError):
    """The endpoint cannot be used: unreachable, wrong model, refused requests, missing fields."""
