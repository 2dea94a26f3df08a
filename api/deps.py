"""Shared route plumbing: the Runtime of this app and the documented error responses."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request

from actors.runtime import Runtime
from api.schemas import ErrorBody, ValidationErrorBody


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error answers a route may give (all ``{"detail": ...}``)."""
    meanings = {
        401: "Missing or invalid API key.",
        404: "No such object in your scope (another scope's objects look absent).",
        409: "The object's state does not allow this now.",
        413: "Request body over 1 MiB.",
        422: "Invalid request.",
    }
    documented: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorBody, "description": meanings.get(code, "Error.")} for code in codes}
    if 422 in codes:
        documented[422] = {"model": ValidationErrorBody, "description": meanings[422]}
    return documented


# Every authenticated route may answer these.
COMMON = (401, 422)
