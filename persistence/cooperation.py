"""The side-effecting cooperation tools as transactions, each keyed by (source Turn, tool call id).

Every function here is called by an executing Run: it is fenced by the Run's lease,
replays return the stored receipt, and a refused call writes nothing (one transaction).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from persistence import agents, receipts, usage
from persistence.db import Connection, query
from persistence.errors import Conflict, InvalidArgument, LimitReached, shown
from persistence.events import append_event
from persistence.messages import insert_coop_message
from persistence.records import Row, RunRef, Scope
from persistence.sessions import Spawn, check_name, create_child, create_root, get_session_row, resolve_target
from persistence.settings import get_settings
from persistence.statuses import MessageKind
from persistence.turns import cancel_turn as cancel_turn_row
from persistence.turns import check_text, submit_first_input
from persistence.turns import submit_input as submit_input_row

CREATE_MODES = ("child", "root")


@dataclasses.dataclass(frozen=True)
class Dispatcher:
    """What a calling Turn passes on to the work it causes: its approval mode (work an ask Turn
    causes runs under ask) and its effective tool names (a session it creates, and a Turn its input
    starts, never gets a tool it lacks)."""

    approval_mode: str
    tools: frozenset[str]


@dataclasses.dataclass(frozen=True)
class CreateLimits:
    max_depth: int
    max_members: int
    max_spawned_trees: int
    slot_limit: int


async def _origin(conn: Connection, caller: Row, run: RunRef, dispatcher: Dispatcher) -> dict[str, Any]:
    """Who gave an input, and what the work it causes may do: the Turn it starts asks if the giver's
    asks, and has only the tools the giver's has too (a session allowed only ``submit_input`` must
    not have another session run what it may not; actors/agent_loop.py ``turn_tools``); and how many
    inputs models gave each other before it, refused past ``CANOPY_MAX_INPUT_HOPS`` (Turns handing
    work back and forth, or each to itself, would otherwise go on for ever)."""
    cur = await conn.execute(query("turn_input_hops"), {"turn_id": run.turn_id})
    hops = (await cur.fetchone() or {"hops": 0})["hops"] + 1
    limit = get_settings().max_input_hops
    if hops > limit:
        raise LimitReached(f"this would be input {hops} of a chain that models give each other (the Turn each one "
                           f"starts giving the next); the limit is {limit} (CANOPY_MAX_INPUT_HOPS): finish with "
                           "your answer instead")
    return {"kind": "session", "session_id": str(caller["session_id"]), "path": caller["path"],
            "tree_id": str(caller["tree_id"]), "run_id": str(run.run_id), "turn_id": str(run.turn_id),
            "approval_mode": dispatcher.approval_mode, "tools": sorted(dispatcher.tools), "hops": hops}


async def _child_config(conn: Connection, scope: Scope, caller: Row, agent_id: str | None,
                        dispatcher: Dispatcher) -> dict[str, Any]:
    """Inherit the dispatcher's config, or freeze the named agent's, re-authorised for this user.

    It asks when the dispatcher's Turn asks or the named agent does (a human chose ask for that
    agent; an auto creator does not waive it), and the tools are the named agent's that the
    dispatcher has too (all of the dispatcher's when the agent names none).
    """
    if agent_id is None:
        config = dict(caller["agent_config"])
        config["tools"] = sorted(dispatcher.tools)
    else:
        config = agents.frozen_config(await agents.get_agent(conn, scope, agent_id))
        wanted = set(config["tools"]) or set(dispatcher.tools)
        tools = sorted(wanted & dispatcher.tools)
        if not tools:
            raise InvalidArgument(
                f"agent {agent_id!r} has no tool that this session has ({', '.join(sorted(dispatcher.tools))}); "
                "a session cannot create one with tools it lacks")
        config["tools"] = tools
    config["approval_mode"] = "ask" if "ask" in (dispatcher.approval_mode, config.get("approval_mode")) else "auto"
    return config


async def create_session(
    conn: Connection, run: RunRef, call_id: str, *, name: str, description: str, agent_id: str | None = None,
    mode: str = "child", limits: CreateLimits, dispatcher: Dispatcher,
) -> Row:
    args = {"name": name, "description": description, "agent_id": agent_id, "mode": mode}
    if (stored := await receipts.begin_call(conn, run, call_id, "create_session", args)) is not None:
        return stored
    if mode not in CREATE_MODES:
        raise InvalidArgument(f"mode must be one of {', '.join(CREATE_MODES)}")
    check_name(name)
    check_text(description, "description")
    caller = await get_session_row(conn, run.scope, run.session_id, lock=True)
    config = await _child_config(conn, run.scope, caller, agent_id, dispatcher)
    effective_agent = agent_id or caller["agent_id"]
    origin = await _origin(conn, caller, run, dispatcher)
    if mode == "child":
        created = await create_child(conn, caller, name=name, agent_id=effective_agent, agent_config=config,
                                     max_depth=limits.max_depth, max_members=limits.max_members,
                                     created_by_run_id=run.run_id)
    else:
        root_id = await create_root(conn, run.scope, project_id=caller["project_id"], agent_id=effective_agent,
                                    agent_config=config, slot_limit=limits.slot_limit, title=name,
                                    origin=origin, created_by_run_id=run.run_id,
                                    spawned_by=Spawn(run.tree_id, limits.max_spawned_trees),
                                    budget=config.get("budget"))
        created = {"session_id": root_id, "name": "root", "path": "/root", "parent_session_id": None,
                   "tree_id": root_id}
    receipt = await submit_first_input(conn, run.scope, created["session_id"], created["tree_id"], description,
                                       origin)
    result = {
        "session_id": str(created["session_id"]), "name": created["name"], "path": created["path"],
        "parent_session_id": str(created["parent_session_id"]) if created["parent_session_id"] else None,
        "tree_id": str(created["tree_id"]), "input_id": str(receipt["input_id"]),
        "turn_id": str(receipt["turn_id"]) if receipt["turn_id"] else None, "status": receipt["status"],
    }
    await receipts.store_result(conn, run, call_id, "create_session", args, result)
    return result


async def submit_input(conn: Connection, run: RunRef, call_id: str, *, target: str, text: str,
                       dispatcher: Dispatcher) -> Row:
    args = {"target": target, "text": text}
    if (stored := await receipts.begin_call(conn, run, call_id, "submit_input", args)) is not None:
        return stored
    caller = await get_session_row(conn, run.scope, run.session_id)
    session = await resolve_target(conn, run.scope, run.tree_id, target)
    if session["tree_id"] != run.tree_id and (
            budget := await usage.budget_left_behind(conn, run.tree_id, session["tree_id"])) is not None:
        raise Conflict(f"this tree works under the budget of tree {budget}, which does not cover tree "
                       f"{session['tree_id']}: work submitted there would escape it. Hand it to a session of "
                       "this tree, or of a tree it spawned (create_session mode=root)")
    origin = await _origin(conn, caller, run, dispatcher)
    receipt = await submit_input_row(conn, run.scope, session["session_id"], text, origin)
    result = {"session_id": str(receipt["session_id"]), "input_id": str(receipt["input_id"]),
              "turn_id": str(receipt["turn_id"]) if receipt["turn_id"] else None, "status": receipt["status"]}
    await receipts.store_result(conn, run, call_id, "submit_input", args, result)
    return result


async def send_message(conn: Connection, run: RunRef, call_id: str, *, target: str, text: str) -> Row:
    args = {"target": target, "text": text}
    if (stored := await receipts.begin_call(conn, run, call_id, "send_message", args)) is not None:
        return stored
    sender = await get_session_row(conn, run.scope, run.session_id)
    receiver = await resolve_target(conn, run.scope, run.tree_id, target)
    if receiver["session_id"] == run.session_id:
        raise InvalidArgument("a session cannot send a message to itself")
    if receiver["archived"]:  # it takes no input, so never reads a message
        raise Conflict(f"session {receiver['path']} is archived: it reads no message")
    message_id = await insert_coop_message(conn, run.scope, kind=MessageKind.MESSAGE, receiver=receiver, body=text,
                                           sender=sender, run=run, tool_call_id=call_id)
    result = {"status": "received", "message_id": str(message_id), "session_id": str(receiver["session_id"])}
    await receipts.store_result(conn, run, call_id, "send_message", args, result)
    return result


async def cancel_turn(conn: Connection, run: RunRef, call_id: str, *, target: str, turn_id: str) -> Row:
    args = {"target": target, "turn_id": turn_id}
    if (stored := await receipts.begin_call(conn, run, call_id, "cancel_turn", args)) is not None:
        return stored
    session = await resolve_target(conn, run.scope, run.tree_id, target)
    try:
        turn_uuid = uuid.UUID(str(turn_id))
    except ValueError:
        raise InvalidArgument(f"turn_id {shown(turn_id)} is not a turn id") from None
    if turn_uuid == run.turn_id:
        raise InvalidArgument("a turn cannot cancel itself; finish with a final answer instead")
    cancelled = await cancel_turn_row(conn, run.scope, session["session_id"], turn_uuid, reason="cancelled by "
                                      f"session {run.session_id}")
    # A Turn that had ended is left as it ended: the caller learns so, and reads its result.
    result = {"status": "accepted" if cancelled is not None else "already_ended",
              "session_id": str(session["session_id"]), "turn_id": str(turn_uuid)}
    await receipts.store_result(conn, run, call_id, "cancel_turn", args, result)
    return result


INTERVENTION_PREVIEW = 500  # characters of a steer's or an input's text in its intervention event


async def record_intervention(conn: Connection, scope: Scope, session_id: uuid.UUID, action: str,
                              details: dict[str, Any] | None = None, *, text: str | None = None) -> None:
    """A human acted directly on a member (``action``: input, steer, answer, cancel): tell its parent
    (this starts no work). The event carries the member and, cut to a preview, the ``text`` the
    human gave, so both conversations can show what was done."""
    session = await get_session_row(conn, scope, session_id)
    if session["parent_id"] is None:
        return
    payload = {"member_session_id": str(session_id), "path": session["path"], "action": action, **(details or {})}
    if text is not None:
        payload.update(text=text[:INTERVENTION_PREVIEW], truncated=len(text) > INTERVENTION_PREVIEW)
    await append_event(conn, scope, "user_intervention", session_id=session["parent_id"],
                       tree_id=session["tree_id"], payload=payload)


async def interventions(conn: Connection, scope: Scope, session_id: uuid.UUID, *, after: int = 0,
                        limit: int = 200) -> list[Row]:
    """A human's interventions that concern a session, oldest first: those on the session itself (as
    a member) and those on its children (their events go to it, the parent). NotFound outside the
    scope."""
    await get_session_row(conn, scope, session_id)
    cur = await conn.execute(query("interventions"), {"user_id": scope.user_id, "app_id": scope.app_id,
                                                      "session_id": session_id, "after": after, "limit": limit})
    return await cur.fetchall()
