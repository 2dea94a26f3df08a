"""A hostile model cannot use tools its session lacks, nor grow a tree without bound, nor break the
gateway with the shape of its tool calls.

Every test drives the real runtime (Ray, PostgreSQL, the scripted model through litellm, or a
provider's replies from tests/actors/replay_server.py) with the replies a hostile model would give,
then reads back what the tree left behind.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from actors.runtime import Runtime
from actors.scripted import SCRIPT_MARKER, call, create, say, script
from actors.tools import LIST_PAGE, PROJECT_PAGE
from persistence import agents
from persistence.databases import rows
from persistence.errors import InvalidArgument
from persistence.records import Scope
from persistence.turns import TOOL_RESULT_OUTPUT_CHARS
from tests.actors.helpers import eventually
from tests.actors.replay_server import ReplayServer, calls
from tests.actors.replay_server import say as replay_say
from tests.hostile.helpers import footprint, model_requests

_NOTHING_ELSE = {"receipts": [], "requests": [], "sandbox_leases": [], "files": []}


async def test_a_session_runs_only_its_agents_tools(runtime: Runtime, scope: Scope) -> None:
    await runtime.create_agent(scope, {"agent_id": "lister", "name": "Lister", "model": "canopy/scripted",
                                       "tools": ["list_agents"]})
    text = script(call(create("spawned", script(say("hi"))),
                       ("run_command", {"command": "echo pwned > pwned.txt"}),
                       ("write_file", {"path": "pwned2.txt", "content": "x"}),
                       ("list_agents", {})),
                  say("${0.error}|${1.error}|${2.error}|${3.agents.0.id}"))
    created = await runtime.create_root(scope, input_text=text, agent_id="lister")
    tree_id = created["session"]["session_id"]
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    *errors, listed = result["output"].split("|")
    for name, error in zip(("create_session", "run_command", "write_file"), errors, strict=True):
        assert f"tool '{name}' is not available to this session; its tools are: list_agents" in error
    assert listed == "lister"  # the allowed tool ran
    assert await footprint(runtime, tree_id) == {"sessions": ["/root"], "spawned_trees": 0, **_NOTHING_ELSE}
    offered = [{tool["function"]["name"] for tool in request["tools"]} for request in model_requests(runtime, tree_id)]
    assert offered and all(names == {"list_agents"} for names in offered)


async def test_a_child_never_gets_a_tool_its_creator_lacks(runtime: Runtime, scope: Scope) -> None:
    await runtime.create_agent(scope, {"agent_id": "boss", "name": "Boss", "model": "canopy/scripted",
                                       "tools": ["create_session", "wait_inputs"]})
    await runtime.create_agent(scope, {"agent_id": "anything", "name": "Anything", "model": "canopy/scripted"})
    worker = script(call(("run_command", {"command": "echo pwned > pwned.txt"})), say("$${0.error}"))
    text = script(call(("create_session", {"name": "w", "description": worker, "agent_id": "anything"})),
                  call(("wait_inputs", {"input_ids": ["${0.input_id}"]})), say("${1.results.0.output}"))
    created = await runtime.create_root(scope, input_text=text, agent_id="boss")
    tree_id = created["session"]["session_id"]
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert "tool 'run_command' is not available to this session; its tools are: create_session, wait_inputs" \
        in result["output"]
    child = await rows(runtime.db, "SELECT agent_config FROM sessions WHERE tree_id = %s AND path = '/root/w'",
                       tree_id)
    assert child[0]["agent_config"]["tools"] == ["create_session", "wait_inputs"]
    assert await footprint(runtime, tree_id) == {"sessions": ["/root", "/root/w"], "spawned_trees": 0,
                                                 **_NOTHING_ELSE, "receipts": [("create_session", "done")]}


async def test_work_a_session_hands_on_never_runs_a_tool_that_session_lacks(runtime: Runtime, scope: Scope) -> None:
    """A session allowed only ``submit_input`` handed the root a task that ran a command: the root's
    Turn had all of the root's tools. The Turn an input starts has only the tools its giver has too,
    as it asks when its giver asks."""
    await runtime.create_agent(scope, {"agent_id": "courier", "name": "Courier", "model": "canopy/scripted",
                                       "tools": ["submit_input"]})
    task = script(call(("run_command", {"command": "echo pwned > pwned.txt"})), say("ran"))
    courier = script(call(("submit_input", {"target": "/root", "text": task})), say("handed on"))
    text = script(call(("create_session", {"name": "c", "description": courier, "agent_id": "courier"})),
                  say("root done"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    assert (await runtime.wait_result(scope, created["input"]["input_id"], timeout=60))["output"] == "root done"
    await runtime.wait_tree_idle(scope, tree_id, timeout=90)
    results = await rows(runtime.db, "SELECT content FROM thread_messages WHERE session_id = %s AND role = 'tool' "
                         "ORDER BY id", tree_id)
    assert "tool 'run_command' is not available to this session; its tools are: submit_input" in \
        results[-1]["content"], results
    assert (await footprint(runtime, tree_id))["files"] == []


async def test_an_agent_naming_an_unknown_tool_is_refused(runtime: Runtime, scope: Scope) -> None:
    with pytest.raises(InvalidArgument, match="unknown tool"):
        await runtime.create_agent(scope, {"agent_id": "odd", "name": "Odd", "model": "canopy/scripted",
                                           "tools": ["list_agents", "rm_rf"]})
    assert await rows(runtime.db, "SELECT 1 FROM agents WHERE app_id = %s", scope.app_id) == []


async def test_a_reply_with_500_creates_runs_none_of_them(runtime: Runtime, scope: Scope) -> None:
    bomb = [create(f"b{i}", script(say("boom"))) for i in range(500)]
    text = script(call(*bomb), say("${0.error}|${31.error}"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=90)
    first, last = result["output"].split("|")
    assert first == last
    assert "this reply made 500 tool calls; the limit is 32 per reply (setting CANOPY_MAX_TOOL_CALLS_PER_REPLY)" \
        in first
    assert await footprint(runtime, tree_id) == {"sessions": ["/root"], "spawned_trees": 0, **_NOTHING_ELSE}
    # The reply keeps its first 32 calls, each answered: a flood of calls costs the limit's rows, not one
    # row per call (a model's 20,000 calls were 20,000 answers, each written and sent back at every call).
    stored = await rows(runtime.db, "SELECT role, jsonb_array_length(tool_calls) AS calls FROM thread_messages "
                        "WHERE session_id = %s AND (role = 'tool' OR tool_calls IS NOT NULL) ORDER BY id", tree_id)
    assert [row["role"] for row in stored] == ["assistant"] + ["tool"] * 32 and stored[0]["calls"] == 32, stored


async def test_numbers_and_lists_past_what_the_database_takes_are_refused_not_a_crashed_run(
        runtime: Runtime, scope: Scope) -> None:
    """An offset or cursor past bigint failed the reading tool's statement, and with it the Run's
    transaction: the Run crashed and was recovered, the model asked again, until the Turn failed. A
    wait on thousands of targets resolved each one under the Run's lock. Each is a refusal now."""
    past_bigint = 2**63
    text = script(call(("list_sessions", {"scope": "all", "offset": past_bigint}),
                       ("wait_sessions", {"targets": ["/root"], "after_cursor": past_bigint, "timeout_seconds": 1}),
                       ("wait_sessions", {"targets": ["/root"] * 5000, "timeout_seconds": 1}),
                       ("list_sessions", {"scope": "all", "offset": past_bigint - 1})),
                  say("${0.error}|${1.error}|${2.error}|${3.sessions}"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["status"] == "completed", result
    offset, cursor, targets, last_page = result["output"].split("|")
    assert last_page == "[]"  # the largest offset a page may start at reads nothing, and fails nothing
    assert "offset" in offset and "less than or equal to" in offset
    assert "after_cursor" in cursor and "less than or equal to" in cursor
    assert "targets" in targets and "at most 100 items" in targets
    runs = await rows(runtime.db, "SELECT count(*) AS n FROM runs WHERE session_id = %s", tree_id)
    assert runs[0]["n"] == 1  # no Run crashed and was recovered
    assert await footprint(runtime, tree_id) == {"sessions": ["/root"], "spawned_trees": 0, **_NOTHING_ELSE}


async def _two_pages(runtime: Runtime, scope: Scope, tool: str, key: str, page: int) -> list[list[Any]]:
    """A model's two calls of a paged list tool, the second from where the first page ends: each
    page as the tool result committed it; the first says where the second starts, the second that
    it is the last."""
    text = script(call((tool, {})), call((tool, {"offset": page})), say("${0.next_offset}|${1.next_offset}"))
    created = await runtime.create_root(scope, input_text=text)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["output"] == f"{page}|null", result
    pages = await rows(runtime.db, "SELECT content FROM thread_messages WHERE session_id = %s AND role = 'tool' "
                       "ORDER BY id", created["session"]["session_id"])
    return [json.loads(row["content"])[key] for row in pages]


async def test_a_projects_sessions_come_a_page_at_a_time(runtime: Runtime, scope: Scope) -> None:
    """``list_sessions`` of a project listed every session of it in one tool result, which every
    later model call sends again: a project may hold 10,000 conversations and their members. It
    pages now, as the whole history does, ``PROJECT_PAGE`` sessions a page."""
    for index in range(PROJECT_PAGE + 4):
        await runtime.create_root(scope, title=f"idle {index}")
    listed = [[entry["session_id"] for entry in page]
              for page in await _two_pages(runtime, scope, "list_sessions", "sessions", PROJECT_PAGE)]
    assert [len(page) for page in listed] == [PROJECT_PAGE, 5]
    assert len({*listed[0], *listed[1]}) == PROJECT_PAGE + 5  # every session once


async def test_the_agents_come_a_page_at_a_time_with_the_beginning_of_their_descriptions(
        runtime: Runtime, scope: Scope) -> None:
    """``list_agents`` listed every agent of the app in one tool result, each description whole: a
    colleague's 1,000 shared agents of 100,000 characters each went into every later model call."""
    colleague = Scope("colleague", scope.app_id)
    async with runtime.db.tx() as conn:
        for index in range(LIST_PAGE + 2):
            await agents.create_agent(conn, colleague, {"agent_id": f"agent-{index:02}", "name": f"A{index}",
                                                        "model": "canopy/scripted", "shared": True,
                                                        "description": "x" * 100_000})
    listed = await _two_pages(runtime, scope, "list_agents", "agents", LIST_PAGE)
    assert [len(page) for page in listed] == [LIST_PAGE, 2]
    assert {len(agent["description"]) for page in listed for agent in page} == {agents.DESCRIPTION_PREVIEW}


def _spawn_chain(creates: int) -> str:
    """A root whose task makes a root-mode tree whose task does the same, ``creates`` times down;
    each level says back the error its create got, if any. A level's text passes through the
    scripted model of every level above it first, and each pass unescapes one ``$``."""
    text = script(say("the last one"))
    for level in reversed(range(creates)):
        text = script(call(("create_session", {"name": f"s{level}", "description": text, "mode": "root"})),
                      say("$" * level + "${0.error}"), task=f"level {level}")
    return text


async def test_a_chain_of_root_mode_spawns_stops_at_the_limit(runtime: Runtime, scope: Scope) -> None:
    limit = runtime.settings.max_spawned_trees
    created = await runtime.create_root(scope, input_text=_spawn_chain(limit + 1))
    tree_id = created["session"]["session_id"]

    async def settled() -> list[dict[str, object]] | None:
        trees = await rows(runtime.db, "SELECT tree_id, spawned_by_tree_id FROM trees WHERE lineage_id = %s", tree_id)
        done = await rows(runtime.db, "SELECT count(*) AS n FROM turns t JOIN trees r ON r.tree_id = t.session_id "
                          "WHERE r.lineage_id = %s AND t.status IN ('completed', 'failed', 'cancelled')", tree_id)
        return trees if len(trees) == limit + 1 and done[0]["n"] == limit + 1 else None

    trees = await eventually(settled, timeout=120)
    spawners = {tree["spawned_by_tree_id"] for tree in trees}
    last = [tree["tree_id"] for tree in trees if tree["tree_id"] not in spawners]
    outputs = await rows(runtime.db, "SELECT r.output FROM turns t JOIN runs r ON r.run_id = t.result_run_id "
                         "WHERE t.session_id = %s", last[0])
    assert f"the limit is {limit} (setting CANOPY_MAX_SPAWNED_TREES)" in outputs[0]["output"]
    assert (await footprint(runtime, tree_id))["spawned_trees"] == limit  # the first tree's lineage, no more


async def test_a_turn_stops_after_its_model_call_limit(runtime: Runtime, scope: Scope) -> None:
    limit = runtime.settings.max_model_calls_per_turn
    text = script(*[call(("list_agents", {})) for _ in range(limit + 5)], say("never"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=120)
    assert result["status"] == "failed"
    assert f"the turn made {limit} model calls, the limit per turn (setting CANOPY_MAX_MODEL_CALLS_PER_TURN)" \
        in result["error"]
    replies = await rows(runtime.db, "SELECT count(*) AS n FROM thread_messages WHERE session_id = %s "
                         "AND role = 'assistant'", tree_id)
    assert replies[0]["n"] == limit
    assert len(model_requests(runtime, tree_id)) == limit


async def test_tool_calls_whose_arguments_are_not_a_json_object_run_nothing_and_are_answered(
        runtime: Runtime, scope: Scope, replay: ReplayServer) -> None:
    """Broken JSON, a list, and an object nested 900 levels deep (Ray could not carry that reply out
    of the gateway, whose process died, and the call was asked again) from a provider through real
    litellm: none runs, each is answered with what was wrong, and the Turn goes on."""
    model = f"hostile-{uuid.uuid4().hex[:8]}"
    await runtime.create_agent(scope, {"agent_id": model, "name": model, "model": f"openai/{model}",
                                       "api_base": replay.base_url, "api_key_ref": "OPENAI_API_KEY"})
    deep = '{"agent_id": ' + "[" * 900 + "]" * 900 + "}"
    replay.script(model, calls(("list_agents", '{"agent_id": "a", oops'), ("list_agents", "[1, 2]"),
                               ("create_session", deep)), replay_say("corrected"))

    created = await runtime.create_root(scope, input_text="Look around.", agent_id=model)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert (result["status"], result["output"]) == ("completed", "corrected")
    _, second = replay.requests_for(model)
    answers = [json.loads(m["content"])["error"] for m in second.body["messages"] if m["role"] == "tool"]
    expected = "the arguments of {} are not a JSON object nested at most 32 levels deep with no NUL character " \
               "(U+0000) or lone surrogate in its strings, whose numbers written out in full add at most 10,000 " \
               "characters: {}; call it again with its arguments as one JSON object"
    assert answers == [expected.format("list_agents", repr('{"agent_id": "a", oops')),
                       expected.format("list_agents", repr("[1, 2]")),
                       expected.format("create_session", repr(deep[:200]) + f"... ({len(deep)} characters)")]
    tree = await footprint(runtime, created["session"]["session_id"])
    assert (tree["sessions"], tree["spawned_trees"]) == (["/root"], 0)
    assert {key: tree[key] for key in _NOTHING_ELSE} == _NOTHING_ELSE


async def test_text_postgresql_cannot_store_from_a_model_or_a_command_never_reaches_it(
        runtime: Runtime, scope: Scope, replay: ReplayServer) -> None:
    """PostgreSQL cannot store a NUL character (U+0000) or a lone surrogate, which a provider's JSON
    may carry in any string, and a command prints NULs with any binary file. The reply's text and a
    command's output are kept with U+FFFD in their place (a tool name with "_": see the next test); a
    call whose arguments carry one runs nothing and is answered; the Turn goes on."""
    model = f"hostile-{uuid.uuid4().hex[:8]}"
    await runtime.create_agent(scope, {"agent_id": model, "name": model, "model": f"openai/{model}",
                                       "api_base": replay.base_url, "api_key_ref": "OPENAI_API_KEY"})
    refused = [{"path": "nul.txt", "content": "x\u0000y"}, {"path": "surrogate.txt", "content": "x\ud800y"}]
    replay.script(model, calls(("run_command", {"command": r"printf 'a\000b'; printf 'c\000d' >&2"}),
                               *(("write_file", args) for args in refused), ("list\u0000agents", {})),
                  replay_say("done\u0000!\udfff"))

    created = await runtime.create_root(scope, input_text="Look at a binary file.", agent_id=model)
    tree_id = created["session"]["session_id"]
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert (result["status"], result["output"]) == ("completed", "done\ufffd!\ufffd")
    _, second = replay.requests_for(model)
    ran, *answers, unknown = [json.loads(m["content"]) for m in second.body["messages"] if m["role"] == "tool"]
    assert ran == {"exit_code": 0, "stdout": "a\ufffdb", "stderr": "c\ufffdd"}
    assert answers == [{"error": "the arguments of write_file are not a JSON object nested at most 32 levels deep "
                                 "with no NUL character (U+0000) or lone surrogate in its strings, whose numbers "
                                 "written out in full add at most 10,000 characters: "
                                 f"{json.dumps(args)!r}; call it again with its arguments as one JSON object"}
                       for args in refused]
    assert unknown["error"].startswith("unknown tool 'invalid_name_list_agents'"), unknown
    stored = await rows(runtime.db, "SELECT tool_calls FROM thread_messages WHERE session_id = %s "
                        "AND tool_calls IS NOT NULL", tree_id)
    assert [c["name"] for c in stored[0]["tool_calls"]] == ["run_command", "write_file", "write_file",
                                                            "invalid_name_list_agents"]
    tree = await footprint(runtime, tree_id)
    assert (tree["receipts"], tree["files"]) == ([("run_command", "done")], [])


async def test_tool_call_ids_a_provider_repeats_or_omits_still_run_each_call_once(
        runtime: Runtime, scope: Scope, replay: ReplayServer) -> None:
    """Some OpenAI-compatible servers number their tool calls per reply ("call_0" again in the next
    one), a hostile one repeats an id within a reply or sends none or a huge one. A call is known by
    its id (its receipt, its answer, its wait): each call still runs once and gets its own answer."""
    model = f"hostile-{uuid.uuid4().hex[:8]}"
    await runtime.create_agent(scope, {"agent_id": model, "name": model, "model": f"openai/{model}",
                                       "api_base": replay.base_url, "api_key_ref": "OPENAI_API_KEY"})
    replay.script(model, calls(("run_command", {"command": "echo a > a.txt"}, "call_0"),
                               ("run_command", {"command": "echo b > b.txt"}, "call_0")),
                  calls(("run_command", {"command": "echo c > c.txt"}, "call_0"),
                        ("run_command", {"command": "echo d > d.txt"}, ""),
                        ("run_command", {"command": "echo e > e.txt"}, "x" * 10_000)),
                  replay_say("done"))

    created = await runtime.create_root(scope, input_text="Write five files.", agent_id=model)
    tree_id = created["session"]["session_id"]
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert (result["status"], result["output"]) == ("completed", "done")
    tree = await footprint(runtime, tree_id)
    assert tree["files"] == ["a.txt", "b.txt", "c.txt", "d.txt", "e.txt"]
    assert tree["receipts"] == [("run_command", "done")] * 5
    replies = await rows(runtime.db, "SELECT tool_calls FROM thread_messages WHERE session_id = %s "
                         "AND role = 'assistant' ORDER BY id", tree_id)
    ids = [call["id"] for reply in replies for call in reply["tool_calls"] or []]
    assert len(set(ids)) == 5 and max(map(len, ids)) <= 64, ids
    last = replay.requests_for(model)[-1].body["messages"]
    assert {m["tool_call_id"] for m in last if m["role"] == "tool"} == set(ids)

    # The next Turn's reply says "call_0" again: every id of the history sent stays unique (Anthropic
    # refuses a request that repeats one anywhere).
    replay.script(model, calls(("run_command", {"command": "echo f > f.txt"}, "call_0")), replay_say("again"))
    again = await runtime.submit_input(scope, tree_id, "One more.")
    assert (await runtime.wait_result(scope, again["input_id"], timeout=60))["output"] == "again"
    sent = [call["id"] for m in replay.requests_for(model)[-1].body["messages"] if m["role"] == "assistant"
            for call in m.get("tool_calls") or []]
    assert len(sent) == len(set(sent)) == 6, sent


async def test_a_provider_that_reports_no_usage_cannot_spend_a_token_budget_uncounted(
        runtime: Runtime, scope: Scope, replay: ReplayServer) -> None:
    """A provider whose replies carry no usage (some OpenAI-compatible servers; or one that would rather
    not be counted) is counted by litellm's estimate: the tree's token budget stops it."""
    model = f"hostile-{uuid.uuid4().hex[:8]}"
    await runtime.create_agent(scope, {"agent_id": model, "name": model, "model": f"openai/{model}",
                                       "api_base": replay.base_url, "api_key_ref": "OPENAI_API_KEY"})
    replay.script(model, then={**calls(("list_agents", {})), "usage": None})  # looks around forever

    created = await runtime.create_root(scope, input_text="Look around. " * 100, agent_id=model,
                                        budget={"max_tokens": 3_000})
    tree_id = created["session"]["session_id"]

    async def stopped() -> dict[str, Any] | None:
        summary = await runtime.tree_summary(scope, tree_id)
        return summary if summary["stopped"] else None

    summary = await eventually(stopped, timeout=60)
    assert (summary["stop_reason"], summary["stop_detail"]["limit"]) == ("budget_exceeded", "tokens")
    used = await rows(runtime.db, "SELECT sum(prompt_tokens) AS prompt, sum(completion_tokens) AS completion, "
                      "sum(model_calls) AS calls FROM runs WHERE tree_id = %s", tree_id)
    prompt, completion, calls_made = used[0]["prompt"], used[0]["completion"], used[0]["calls"]
    assert prompt + completion >= 3_000 and completion > 0 and calls_made < 20, used


async def test_tool_names_and_call_ids_no_provider_would_take_back_are_answered_and_the_session_goes_on(
        runtime: Runtime, scope: Scope, replay: ReplayServer) -> None:
    """OpenAI and Anthropic refuse a request whose history names a tool outside [A-Za-z0-9_-]{1,64}
    (a model's "functions.run_command", a local model's "run command"), Anthropic a call id outside
    it: kept as they came, every later request of the session would fail. Such a name is answered
    as unknown (never run, even when it is a tool's name once cleaned up) and the history the
    provider gets back holds only names and ids it takes."""
    model = f"hostile-{uuid.uuid4().hex[:8]}"
    await runtime.create_agent(scope, {"agent_id": model, "name": model, "model": f"openai/{model}",
                                       "api_base": replay.base_url, "api_key_ref": "OPENAI_API_KEY"})
    replay.script(model, calls(("functions.run_command", {"command": "echo x > x.txt"}, "call:1"),
                               ("run command", {"command": "echo y > y.txt"}, "call 1"),
                               ("list_agents", {}, "call.1")),
                  replay_say("done"))

    created = await runtime.create_root(scope, input_text="Look around.", agent_id=model)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert (result["status"], result["output"]) == ("completed", "done")
    _, second = replay.requests_for(model)
    history = second.body["messages"]
    sent = [c for m in history if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert [c["function"]["name"] for c in sent] == ["invalid_name_functions_run_command",
                                                     "invalid_name_run_command", "list_agents"]
    assert [c["id"] for c in sent] == ["call_1", "call_1_2", "call_1_3"]
    answers = {m["tool_call_id"]: json.loads(m["content"]) for m in history if m["role"] == "tool"}
    assert answers["call_1"]["error"].startswith("unknown tool 'invalid_name_functions_run_command'")
    assert answers["call_1_2"]["error"].startswith("unknown tool 'invalid_name_run_command'")
    assert "agents" in answers["call_1_3"]
    tree = await footprint(runtime, created["session"]["session_id"])
    assert (tree["receipts"], tree["files"]) == ([], [])


def _unescaped_script(*steps: dict[str, Any]) -> str:
    """``script`` with its text as written, not ASCII-escaped: an input holds at most 100,000
    characters, and an escaped CJK character takes 6."""
    return f"task\n{SCRIPT_MARKER}\n" + json.dumps(list(steps), ensure_ascii=False)


async def test_outputs_a_tool_result_carries_are_cut_to_a_share_and_read_on_from_an_offset(
        runtime: Runtime, scope: Scope) -> None:
    """A final reply may hold a million characters, and one wait_inputs result a hundred of them, each
    stored whole and sent again with every later model call of the waiting Turn (a reply of 32 such
    calls made gigabytes). A tool result now carries TOOL_RESULT_OUTPUT_CHARS of outputs, an equal
    share each, and says where get_result reads on; the text is stored as written, not escaped
    (a CJK character took 6). The waiting call resumes here, the reads answer at once; a human's
    result (the API's) stays whole."""
    long = "界" * 95_000
    sources = [await runtime.create_root(scope, input_text=_unescaped_script(say(long, delay_ms=3000)))
               for _ in range(3)]
    ids = [str(source["input"]["input_id"]) for source in sources]
    share = TOOL_RESULT_OUTPUT_CHARS // 3
    text = script(call(("wait_inputs", {"input_ids": ids, "timeout_seconds": 120})),
                  call(("get_result", {"input_id": ids[0], "offset": share})),
                  call(("get_result", {"input_id": ids[1]})), say("read"))
    reader = await runtime.create_root(scope, input_text=text)
    result = await runtime.wait_result(scope, reader["input"]["input_id"], timeout=120)
    assert result["status"] == "completed", result

    stored = await rows(runtime.db, "SELECT content FROM thread_messages WHERE session_id = %s AND role = 'tool' "
                        "ORDER BY id", reader["session"]["session_id"])
    waited, rest, whole = (json.loads(row["content"]) for row in stored)
    assert [(r["output"], r["output_chars"], r["output_next_offset"]) for r in waited["results"]] == \
        [("界" * share, 95_000, share)] * 3
    assert len(stored[0]["content"]) < TOOL_RESULT_OUTPUT_CHARS + 3_000  # as written: 6 x that escaped
    assert rest["output"] == "界" * (95_000 - share) and "output_next_offset" not in rest, rest.keys()
    assert whole["output"] == long and "output_chars" not in whole
    assert (await runtime.wait_result(scope, ids[0], timeout=10))["output"] == long
    runs = await rows(runtime.db, "SELECT kind, status FROM runs WHERE session_id = %s ORDER BY queued_at",
                      reader["session"]["session_id"])
    assert [(r["kind"], r["status"]) for r in runs] == [("start", "interrupted"), ("resume", "completed")], runs


async def test_what_a_model_is_sent_again_is_the_size_it_was_written(runtime: Runtime, scope: Scope) -> None:
    """Two ways the text of a step came back to the model several times its size, in every later
    request of the Turn: a tool call's arguments were sent back ASCII-escaped (a CJK character
    6 characters, an emoji 12), and a control character in a tool result (a terminal's colour codes,
    a binary file's bytes, a Turn's output) was written as JSON's 6-character escape. Arguments go
    back as written; a control character in a result stands as its Control Picture (U+2400 + n)."""
    child = _unescaped_script(say("\x1b[1m" * 4_000 + "界" * 15_000))
    text = _unescaped_script(call(create("c", child)), call(("wait_inputs", {"input_ids": ["${0.input_id}"]})),
                             say("done"))
    created = await runtime.create_root(scope, input_text=text)
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["status"] == "completed", result

    last = model_requests(runtime, created["session"]["session_id"])[-1]["messages"]
    arguments = next(m["tool_calls"][0]["function"]["arguments"] for m in last if m.get("tool_calls"))
    assert json.loads(arguments)["description"] == child
    assert len(arguments) < len(json.dumps(child, ensure_ascii=False)) + 100, len(arguments)  # escaped: 75,000 more
    waited = next(m["content"] for m in last if m["role"] == "tool" and "results" in m["content"])
    assert "␛[1m" * 4_000 + "界" * 15_000 in waited  # ESC's picture
    assert len(waited) < 31_000 + 1_000, len(waited)  # escaped: 20,000 characters more


async def test_arguments_that_grow_what_is_stored_or_sent_are_refused_in_a_few_words(
        runtime: Runtime, scope: Scope) -> None:
    """Three arguments a model's reply of a few kilobytes turned into megabytes, or into a command no
    process could start: thousands of extra keys, each repeated in the error the model got back;
    numbers that jsonb writes out in full (1e308 comes back as 309 characters); and a command of
    100,000 characters that is more bytes than one argument of a process may hold (after a human
    might have been asked to approve it). Each is refused, in a few words, and nothing is made."""
    keys = {f"k{i}": 0 for i in range(3000)}
    text = _unescaped_script(call(("list_agents", keys), ("list_agents", {"offset": [1e308] * 1000}),
                                  ("run_command", {"command": "echo " + "界" * 44_000})),
                             say("${0.error}|${1.error}|${2.error}"))
    created = await runtime.create_root(scope, input_text=text)
    tree_id = created["session"]["session_id"]
    result = await runtime.wait_result(scope, created["input"]["input_id"], timeout=60)
    assert result["status"] == "completed", result
    extra, numbers, command = result["output"].split("|")
    assert extra.startswith("invalid arguments for list_agents: k0: Extra inputs are not permitted; k1: ")
    assert extra.endswith("; and 2995 more") and len(extra) < 400, extra
    assert numbers.startswith("the arguments of list_agents are not a JSON object") and "10,000" in numbers
    assert len(numbers) < 600, numbers
    assert "the command is 132,005 bytes in UTF-8; a process takes one of at most 131,071" in command, command
    sizes = await rows(runtime.db, "SELECT max(octet_length(content)) AS tool, (SELECT octet_length(tool_calls::text) "
                       "FROM thread_messages WHERE session_id = %s AND tool_calls IS NOT NULL) AS calls "
                       "FROM thread_messages WHERE session_id = %s AND role = 'tool'", tree_id, tree_id)
    assert sizes[0]["tool"] < 1_000 and sizes[0]["calls"] < 250_000, sizes
    assert await footprint(runtime, tree_id) == {"sessions": ["/root"], "spawned_trees": 0, **_NOTHING_ELSE}
