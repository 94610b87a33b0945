"""Errors a user can cause when pointing specdec at an endpoint (one line, exit status 2)."""

from __future__ import annotations

from specdec.errors import SpecdecError


class EndpointError(SpecdecError):
    """The endpoint cannot be used: unreachable, wrong model, refused requests, missing fields."""


class BadReply(EndpointError):
    """A reply that cannot be used whatever was asked: of the wrong shape, not JSON, larger
    than its bound, or slower than its bound. Probes that treat a refusal as "the server has
    no such feature" let this through: a broken reply is an error, not a missing feature."""
