"""Usage per session and per tree, and tree budgets.

A Run's tokens, cost and committed model replies are charged in the statement that commits
the reply (``append_reply.sql``), and the same statement adds them to its tree's usage row and
its session's: each is the sum of its Runs' by construction, read in one index lookup (a tree's
members' in one range of ``session_usage``, whatever the tree's size).

A budget belongs to a tree and covers the trees spawned from it with
``create_session(mode="root")``, directly or not (their spawn chain holds it): a spawned tree
cannot escape the budget of the tree that spawned it. Its limits — tokens (in + out), cost in
USD, model calls, and wall time since the first Run of those trees — are checked where a model
call starts (the model boundary, in the statement the Run reads there anyway) and when a Run
starts; once the usage reaches a limit no model call of those trees starts, and the tree whose
Run found it is stopped as Stop all stops it (``trees.stop_for_budget``). A limit is reached
when the usage is at or over it.

Overshoot: the charges are committed when replies arrive, so calls already under way when the
limit is crossed still finish and count. A tree's overshoot is at most one model call per Run
that was executing, that is ``slot_limit`` calls, plus those of the other trees of the budget's
lineage that were under way at the same moment.
"""

from __future__ import annotations

import uuid
from typing import Any

from persistence.db import Connection, query
from persistence.errors import Conflict, InvalidArgument, NotFound
from persistence.events import append_event
from persistence.records import Row, Scope

# A budget's limits, as the API and agent configs name them, and the trees columns holding them.
LIMIT_COLUMNS = {
    "max_tokens": "budget_tokens",
    "max_cost_usd": "budget_cost_usd",
    "max_seconds": "budget_seconds",
    "max_model_calls": "budget_model_calls",
}
_INTEGER_LIMITS = ("max_tokens", "max_model_calls")
# How canopy_budget_reached names a limit, and how a person reads it.
_LIMIT_NAMES = {"tokens": "tokens", "cost_usd": "cost (USD)", "seconds": "wall time (s)", "model_calls": "model calls"}
# unpriced_calls: those of model_calls litellm has no price for (their cost is not in cost_usd).
USAGE_FIELDS = ("prompt_tokens", "completion_tokens", "cost_usd", "model_calls", "unpriced_calls")
MAX_LIMIT = 2**62  # far beyond any real budget (no budget at all), within bigint


def check_budget(budget: dict[str, Any] | None) -> dict[str, Any]:
    """Every limit of a budget (None: no limit), checked: a limit is a positive finite number, an
    integer for tokens and model calls; anything else, or an unknown limit, is InvalidArgument."""
    budget = dict(budget or {})
    unknown = sorted(set(budget) - set(LIMIT_COLUMNS))
    if unknown:
        raise InvalidArgument(f"unknown budget limit(s) {', '.join(unknown)}; a budget has "
                              f"{', '.join(LIMIT_COLUMNS)}")
    checked: dict[str, Any] = {}
    for name in LIMIT_COLUMNS:
        value = budget.get(name)
        if value is not None:
            # The range alone: NaN and infinities fall outside it, and math.isfinite overflows on an
            # integer too large for a float.
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_LIMIT:
                raise InvalidArgument(f"budget limit {name} must be a positive number (got {value!r})")
            if name in _INTEGER_LIMITS and value != int(value):
                raise InvalidArgument(f"budget limit {name} must be a whole number (got {value!r})")
            value = int(value) if name in _INTEGER_LIMITS else float(value)
        checked[name] = value
    return checked


def budget_columns(budget: dict[str, Any] | None) -> dict[str, Any]:
    """A budget's limits as the trees columns (query parameters) that hold them."""
    checked = check_budget(budget)
    return {column: checked[name] for name, column in LIMIT_COLUMNS.items()}


def budget_of(tree: Row) -> dict[str, Any]:
    """A trees row's budget, every limit named (None: no limit)."""
    return {name: tree[column] for name, column in LIMIT_COLUMNS.items()}


async def refuse_if_used_up(conn: Connection, tree_id: uuid.UUID, doing: str) -> None:
    """Conflict, naming the limit and the route that raises it, while a budget that covers the tree
    is used up: the work ``doing`` would start could not run (its first model call would stop the
    tree again)."""
    reached = await budget_reached(conn, tree_id)
    if reached is not None:
        owner = "this tree's budget" if reached["budget_tree_id"] == str(tree_id) else \
            f"the budget of tree {reached['budget_tree_id']}, which spawned it,"
        route = f"PATCH /trees/{reached['budget_tree_id']}/budget"
        fix = (f"remove its cost limit ({route} with max_cost_usd null: a tokens limit counts such calls) or give "
               "the model a price in the models file" if reached["limit"] == "unpriced_calls"
               else f"raise it ({route})")
        raise Conflict(f"{owner} is used up ({describe_reached(reached)}); {fix} before {doing}")


def calls(count: int, noun: str = "call") -> str:
    """``1 call``, ``2,000 calls``."""
    return f"{count:,} {noun}{'s' if count != 1 else ''}"


def describe_reached(reached: dict[str, Any]) -> str:
    """A budget limit reached, in a sentence's words: ``tokens 1,204 of 1,000``."""
    if reached["limit"] == "unpriced_calls":
        unpriced = calls(int(reached["used"]), "model call")
        return f"its cost cannot be counted: {unpriced} to a model litellm has no price for"

    def number(value: float) -> str:
        return f"{value:,.0f}" if reached["limit"] != "cost_usd" else f"{value:,.4f}"

    return (f"{_LIMIT_NAMES.get(reached['limit'], reached['limit'])} {number(reached['used'])} of "
            f"{number(reached['max'])}")


async def budget_reached(conn: Connection, tree_id: uuid.UUID) -> dict[str, Any] | None:
    """The first budget limit the work of this tree has reached (its own budget or that of a tree
    in its spawn chain), as ``{budget_tree_id, limit, max, used}``; None while there is room."""
    cur = await conn.execute(query("budget_reached"), {"tree_id": tree_id})
    row = await cur.fetchone()
    return row["reached"] if row else None


async def budget_left_behind(conn: Connection, caller_tree: uuid.UUID, target_tree: uuid.UUID) -> uuid.UUID | None:
    """The tree whose budget covers ``caller_tree`` but not ``target_tree`` (nearest first), or None:
    a budget counts the work of its tree and of the trees it spawned, not of another tree's queue."""
    cur = await conn.execute(query("budget_left_behind"), {"caller": caller_tree, "target": target_tree})
    row = await cur.fetchone()
    return row["tree_id"] if row else None


async def set_budget(conn: Connection, scope: Scope, tree_id: uuid.UUID, changes: dict[str, Any]) -> dict[str, Any]:
    """Change some limits of a tree's budget (a limit given as None is removed; the others stay).
    Returns the whole budget. A raised budget does not restart a stopped tree: continue does."""
    cur = await conn.execute(query("tree_budget_lock"),
                             {"tree_id": tree_id, "user_id": scope.user_id, "app_id": scope.app_id})
    tree = await cur.fetchone()
    if tree is None:
        raise NotFound(f"no tree {tree_id}")
    budget = check_budget({**budget_of(tree), **changes})
    await conn.execute(query("tree_budget_update"), {"tree_id": tree_id, **budget_columns(budget)})
    await append_event(conn, scope, "tree_budget_changed", session_id=tree_id, tree_id=tree_id,
                       payload={"budget": budget})
    return budget


def _usage(row: Row, prefix: str = "") -> dict[str, Any]:
    figures = {field: row[f"{prefix}{field}"] for field in USAGE_FIELDS}
    figures["tokens"] = figures["prompt_tokens"] + figures["completion_tokens"]
    return figures


NO_USAGE: dict[str, Any] = {"prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0, "model_calls": 0,
                            "unpriced_calls": 0, "tokens": 0}


async def tree_head(conn: Connection, scope: Scope, tree_id: uuid.UUID) -> Row:
    """A tree's state, stop reason, slots, budget and usage (its own, and that of the trees spawned
    from it, ``USAGE_FIELDS``), the budget
    limit reached if any, and ``member_usage`` (session id → usage; members
    no Run of which was charged are absent): one statement whatever the tree's size. NotFound outside the scope."""
    cur = await conn.execute(query("tree_summary_head"),
                             {"tree_id": tree_id, "user_id": scope.user_id, "app_id": scope.app_id})
    row = await cur.fetchone()
    if row is None:
        raise NotFound(f"no tree {tree_id}")
    head = {key: row[key] for key in ("tree_id", "slot_limit", "slots_in_use", "stopped", "stopped_at", "stop_reason",
                                       "stop_detail", "archived", "lineage_id", "spawned_by_tree_id", "budget_reached")}
    members = {uuid.UUID(session_id): _usage(dict(zip(USAGE_FIELDS, figures, strict=True)))
               for session_id, figures in (row["member_usage"] or {}).items()}
    return {**head, "budget": budget_of(row),
            "usage": {**_usage(row), "first_run_at": row["first_run_at"]},
            "spawned_usage": {**_usage(row, "spawned_"), "trees": row["spawned_trees"]},
            "member_usage": members}


async def budget_stopped_trees(conn: Connection) -> int:
    """How many trees are stopped because a budget was reached, for a metrics gauge (one partial
    index, as the other gauges read: ``trees_stopped``). Tokens, cost and model calls are counted
    per model by the metrics module already; per tree they are in the tree summary, not metrics (a
    label per tree would be unbounded)."""
    cur = await conn.execute(query("budget_stopped_trees"))
    row = await cur.fetchone()
    return int(row["n"]) if row else 0


async def record_model_calls(conn: Connection, calls: list[tuple[Any, ...]]) -> None:
    """Account for model calls, each as (run_id, model, prompt_tokens, completion_tokens, cost_usd,
    latency_ms, error, created_at, node_id)."""
    async with conn.cursor() as cur:
        await cur.executemany(query("model_call_insert"), calls)
