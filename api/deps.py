"""Shared route plumbing: the Runtime of this app, the documented error responses, paged lists."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import Depends, Query, Request, Response
from pydantic import BeforeValidator
from pydantic_core import PydanticCustomError

from actors.runtime import Runtime
from api.schemas import ErrorBody, ValidationErrorBody


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
# One spelling per number: no sign but a minus, no leading zero, no "_", space or decimal point.
WHOLE_NUMBER = re.compile(r"0|-?[1-9][0-9]*")


def _written_in_digits(value: object) -> object:
    # pydantic's lax parse takes "+5", "1_0", " 5 ", "05" and "5.0" too: one number with many
    # spellings in a URL is a cache key, a log line and a cursor that disagree with each other.
    if isinstance(value, str) and not WHOLE_NUMBER.fullmatch(value):
        raise PydanticCustomError("int_parsing", "Input should be a whole number written in digits")
    return value


# Every integer of a query string (bounds come with each parameter's Query).
QueryInt = Annotated[int, BeforeValidator(_written_in_digits)]
# Where a page of a list starts: the lists are ordered so that new rows do not shift earlier pages.
Offset = Annotated[QueryInt, Query(ge=0, le=1_000_000)]


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error answers a route may give (all ``{"detail": ...}``)."""
    meanings = {
        401: "Missing or invalid API key.",
        404: "No such object in your scope (another scope's objects look absent).",
        409: "The object's state does not allow this now.",
        413: "Request body over 1 MiB.",
        422: "Invalid request.",
        429: "A per-key limit is used up (see the detail); retry after freeing something.",
    }
    documented: dict[int | str, dict[str, Any]] = {
        code: {"model": ErrorBody, "description": meanings.get(code, "Error.")} for code in codes}
    if 422 in codes:
        documented[422] = {"model": ValidationErrorBody, "description": meanings[422]}
    return documented


# Every authenticated route may answer these.
COMMON = (401, 422)


def pages(what: str) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries of a list route that pages: its errors, and its ``Link`` header."""
    return {**errors(*COMMON, 404),
            200: {"headers": {"Link": {"description": f'While more {what} follow: `<next page URL>; rel="next"`.',
                                       "schema": {"type": "string"}}}}}


def link_next(request: Request, response: Response, route: str, **place: Any) -> None:
    """The next page's URL (this one's query, ``place`` where it goes on) in a ``Link`` header,
    relative to this one (RFC 8288 resolves it against the request's): behind a proxy, this host's
    own name and path for itself are not the client's."""
    following = request.url.remove_query_params("offset").include_query_params(**place)
    response.headers["Link"] = f'<{route}?{following.query}>; rel="next"'
