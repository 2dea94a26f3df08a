"""Request and response bodies of the HTTP API (SPEC §11): the shapes every client may rely on.

Every text a client sends is validated here, before any database work: at most 100,000
characters, no NUL character and valid Unicode (PostgreSQL stores neither NUL nor lone
surrogates, and a malformed body must be a 4xx, never a 500).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic_core import PydanticCustomError

from persistence.agents import API_BASE_MAX_CHARS, API_BASE_PATTERN, API_KEY_REF_PATTERN, DESCRIPTION_PREVIEW
from persistence.statuses import Activity, InputStatus, RequestKind, RequestStatus, TurnStatus, WaitingFor
from persistence.text import why_unstorable
from persistence.turns import MAX_TEXT
from persistence.usage import MAX_LIMIT
from persistence.views import INPUT_PREVIEW


def _storable(value: str) -> str:
    if (why := why_unstorable(value)) is not None:
        raise ValueError(why)
    return value


Text = Annotated[str, StringConstraints(min_length=1, max_length=MAX_TEXT), AfterValidator(_storable)]
OptionalText = Annotated[str, StringConstraints(max_length=MAX_TEXT), AfterValidator(_storable)]
ShortText = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_storable)]
# A title is in every line of a list of conversations (100 a page), and the UI's edit field takes 500.
MAX_TITLE = 500
Title = Annotated[str, StringConstraints(max_length=MAX_TITLE), AfterValidator(_storable)]
SCOPE_ID_PATTERN = r"^[A-Za-z0-9_.@:-]{1,128}$"
AGENT_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
ScopeId = Annotated[str, StringConstraints(pattern=SCOPE_ID_PATTERN)]
AgentId = Annotated[str, StringConstraints(pattern=AGENT_ID_PATTERN)]
ToolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_storable)]
ApiBase = Annotated[str, StringConstraints(pattern=API_BASE_PATTERN, max_length=API_BASE_MAX_CHARS)]
ApiKeyRef = Annotated[str, StringConstraints(pattern=API_KEY_REF_PATTERN)]
_API_BASE = "Where the agent's model calls go (an OpenAI-compatible server, a proxy); default: the provider's own."
_API_KEY_REF = ("The NAME of the variable or secret file that holds the key for the agent's calls (e.g. "
                "OPENAI_API_KEY), never the key itself; default: the provider's own variable, or no key with api_base.")
# May be null in a PATCH: null takes the agent back to its provider's default endpoint and key, or
# to the setting's compaction threshold.
_CLEARABLE = ("api_base", "api_key_ref", "compact_at_tokens")


# Past this many unknown fields a body's are one problem: a problem each cost pydantic and FastAPI
# ~4 ms of CPU per 1,000 (~0.2 s for the 50,000 a 1 MiB body holds), and a request may be sent
# again and again.
_UNKNOWN_FIELDS_EACH = 20
_UNKNOWN_FIELDS_NAMED = 5
_FIELD_NAME_SHOWN = 12  # five of them within the 100 characters a problem's message keeps


class RequestBody(BaseModel):
    """Unknown fields are refused: a typo must not silently do something else. Numbers and flags
    are strict (``strict=True``): JSON true is no 1-token budget, nor "60" a number of seconds."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _many_unknown_fields_are_one_problem(cls, data: Any) -> Any:
        if isinstance(data, dict) and len(data) > len(cls.model_fields) + _UNKNOWN_FIELDS_EACH:
            known = {*cls.model_fields, *(name for field in cls.model_fields.values()
                                           for name in (field.alias, field.validation_alias) if isinstance(name, str))}
            unknown = [key for key in data if key not in known]
            if len(unknown) > _UNKNOWN_FIELDS_EACH:
                named = ", ".join(str(key)[:_FIELD_NAME_SHOWN] for key in unknown[:_UNKNOWN_FIELDS_NAMED])
                raise PydanticCustomError("extra_forbidden", "{count} unknown fields: {named}, …",
                                          {"count": len(unknown), "named": named})
        return data


class ResponseBody(BaseModel):
    model_config = ConfigDict(extra="ignore", from_attributes=True)


# -- errors -----------------------------------------------------------------------------------------


class ErrorBody(BaseModel):
    detail: str = Field(description="A clear sentence saying what went wrong.")


class ValidationErrorBody(BaseModel):
    detail: str = Field(description="Every problem in one sentence.")
    errors: list[dict[str, Any]] = Field(default_factory=list, description="Each problem: loc, msg, type.")


# -- health ------------------------------------------------------------------------------------------


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    database: str
    ray: str


class Identity(ResponseBody):
    """The scope the caller's API key maps to: every object the key reaches is this user's in this app."""

    user_id: str
    app_id: str


# -- admin -------------------------------------------------------------------------------------------


# The longest life a key can be given at creation (ten years).
MAX_KEY_SECONDS = 10 * 365 * 24 * 3600


class KeyCreate(RequestBody):
    user_id: ScopeId
    app_id: ScopeId
    expires_in_seconds: int | None = Field(default=None, ge=1, le=MAX_KEY_SECONDS, strict=True,
                                           description="The key expires this long after its creation.")
    expires_at: AwareDatetime | None = Field(default=None, description="The key expires at this instant.")

    @model_validator(mode="after")
    def _one_expiry(self) -> KeyCreate:
        if self.expires_in_seconds is not None and self.expires_at is not None:
            raise ValueError("give expires_in_seconds or expires_at, not both")
        now = dt.datetime.now(dt.UTC)
        if self.expires_at is not None and self.expires_at <= now:
            raise ValueError("expires_at must be in the future")
        if self.expires_at is not None and self.expires_at > now + dt.timedelta(seconds=MAX_KEY_SECONDS):
            raise ValueError("expires_at must be within ten years, as expires_in_seconds is")
        return self


class KeyInfo(ResponseBody):
    """An API key as operators see it: never the key, never its hash."""

    key_id: uuid.UUID = Field(description="Names the key (to revoke it); not a secret.")
    user_id: str
    app_id: str
    created_at: dt.datetime
    expires_at: dt.datetime | None
    last_used_at: dt.datetime | None = Field(description="Updated at most about once a minute.")
    revoked_at: dt.datetime | None


class KeyCreated(KeyInfo):
    api_key: str = Field(description="Shown once; only its hash is stored.")


# -- budgets and usage -------------------------------------------------------------------------------


class Budget(RequestBody):
    """A tree's budget: each limit optional (absent or null: no limit). It covers the tree and the
    trees spawned from it with create_session(mode="root"); once their usage reaches a limit no
    further model call starts and the tree is stopped (reason ``budget_exceeded``)."""

    max_tokens: int | None = Field(default=None, ge=1, le=MAX_LIMIT, strict=True,
                                   description="Tokens in and out, together.")
    max_cost_usd: float | None = Field(default=None, gt=0, le=MAX_LIMIT, allow_inf_nan=False, strict=True,
                                       description="Cost in USD, as the model gateway prices the calls.")
    max_seconds: float | None = Field(default=None, gt=0, le=MAX_LIMIT, allow_inf_nan=False, strict=True,
                                      description="Wall time since the first Run of these trees.")
    max_model_calls: int | None = Field(default=None, ge=1, le=MAX_LIMIT, strict=True,
                                        description="Model calls whose reply was committed.")


class BudgetUpdate(Budget):
    """Limits to change: a limit left out stays as it is, one given as null is removed."""


class BudgetLimits(ResponseBody):
    max_tokens: int | None
    max_cost_usd: float | None
    max_seconds: float | None
    max_model_calls: int | None


class BudgetReached(ResponseBody):
    budget_tree_id: uuid.UUID = Field(description="The tree whose budget it is: this one, or one that spawned it.")
    limit: Literal["tokens", "cost_usd", "seconds", "model_calls", "unpriced_calls"] = Field(
        description="unpriced_calls: a cost limit allows no model call litellm has no price for (max 0, used: "
                    "how many there were); remove the cost limit or price the model in the models file.")
    max: float
    used: float


class Usage(ResponseBody):
    """Usage summed from Runs: tokens in (prompt) and out (completion), cost and model calls."""

    prompt_tokens: int
    completion_tokens: int
    tokens: int = Field(description="prompt_tokens + completion_tokens")
    cost_usd: float
    model_calls: int = Field(description="Model calls whose reply was committed.")
    unpriced_calls: int = Field(description="Of model_calls, those litellm has no price for: their cost is not in "
                                            "cost_usd.")


class TreeUsage(Usage):
    first_run_at: dt.datetime | None = Field(description="When the tree's first Run got a slot.")


class SpawnedUsage(Usage):
    trees: int = Field(description="Trees spawned from this one with create_session(mode=\"root\"), directly or not.")


# -- agents ------------------------------------------------------------------------------------------


class AgentCreate(RequestBody):
    agent_id: AgentId
    name: ShortText
    description: OptionalText = ""
    model: ModelName | None = Field(default=None, description="A litellm model string; default: the system model.")
    instructions: OptionalText = ""
    tools: list[ToolName] = Field(default_factory=list, max_length=64,
                                  description="Tool names the agent may use; empty means every tool.")
    approval_mode: Literal["auto", "ask"] = "auto"
    shared: bool = Field(default=False, strict=True, description="Visible to every user of the same app.")
    compact_at_tokens: int | None = Field(
        default=None, ge=1000, le=10_000_000, strict=True,
        description="Compact a session's history when a model call would send more tokens (default: the setting).")
    budget: Budget | None = Field(default=None, description="The default budget of a tree this agent starts.")
    api_base: ApiBase | None = Field(default=None, description=_API_BASE)
    api_key_ref: ApiKeyRef | None = Field(default=None, description=_API_KEY_REF)


class AgentUpdate(RequestBody):
    name: ShortText | None = None
    description: OptionalText | None = None
    model: ModelName | None = None
    instructions: OptionalText | None = None
    tools: list[ToolName] | None = Field(default=None, max_length=64)
    approval_mode: Literal["auto", "ask"] | None = None
    shared: bool | None = Field(default=None, strict=True)
    compact_at_tokens: int | None = Field(default=None, ge=1000, le=10_000_000, strict=True,
                                          description="null: the setting (CANOPY_COMPACT_AT_TOKENS).")
    budget: Budget | None = Field(default=None, description="The default budget of a tree this agent starts "
                                                            "(an empty object: none).")
    api_base: ApiBase | None = Field(default=None, description=_API_BASE + " null: the default.")
    api_key_ref: ApiKeyRef | None = Field(default=None, description=_API_KEY_REF + " null: the default.")

    @model_validator(mode="before")
    @classmethod
    def _no_nulls(cls, data: Any) -> Any:
        # A PATCH leaves out what it does not change; an explicit null would erase a required field.
        if isinstance(data, dict):
            nulls = sorted(key for key, value in data.items() if value is None and key not in _CLEARABLE)
            if nulls:
                # ascii(): a key may hold a lone surrogate (a JSON escape), which no error message can encode.
                raise ValueError(f"omit a field instead of sending null: {', '.join(map(ascii, nulls))}")
        return data


class _AgentShown(ResponseBody):
    """What every view of an agent shows; its ``id`` is its ``agent_id``."""

    id: str
    agent_id: str
    name: str
    model: str
    approval_mode: str
    shared: bool
    owner_user_id: str
    updated_at: dt.datetime

    @model_validator(mode="before")
    @classmethod
    def _id(cls, data: Any) -> Any:
        if isinstance(data, dict) and "id" not in data and "agent_id" in data:
            return {**data, "id": data["agent_id"]}
        return data


class AgentSummary(_AgentShown):
    """An agent as a list shows it: no instructions, and the description's beginning."""

    description: str = Field(description=f"Its first {DESCRIPTION_PREVIEW} characters; the whole agent is at "
                                         "GET /agents/{id}.")
    description_truncated: bool


class Agent(_AgentShown):
    description: str
    instructions: str
    tools: list[str]
    compact_at_tokens: int | None = None
    created_at: dt.datetime
    budget: dict[str, Any] | None = Field(default=None, description="The default budget of a tree it starts.")
    api_base: str | None = None
    api_key_ref: str | None = Field(default=None, description="The name of the key's variable or file, not the key.")


# -- projects ----------------------------------------------------------------------------------------


class ProjectCreate(RequestBody):
    name: ShortText


class Project(ResponseBody):
    project_id: uuid.UUID
    name: str
    workdir: str
    created_at: dt.datetime


# -- sessions, inputs, results -----------------------------------------------------------------------


class SessionCreate(RequestBody):
    agent_id: AgentId | None = None
    project_id: uuid.UUID | None = None
    title: Title | None = None
    input: Text | None = Field(default=None, description="Submitted at once as the root's first input.")
    budget: Budget | None = Field(default=None, description="The tree's budget (absent: the agent's, if any; an "
                                                            "empty object: none, whatever the agent's).")


class SessionUpdate(RequestBody):
    title: Title


class InputCreate(RequestBody):
    text: Text
    origin: Literal["human", "api"] = Field(
        default="human", description="human: a person's input (unpauses a stopped member, tells its parent).")


class SteerCreate(RequestBody):
    text: Text


class AnswerCreate(RequestBody):
    decision: Literal["approve", "deny"] | None = None
    answer: Text | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> AnswerCreate:
        if (self.decision is None) == (self.answer is None):
            raise ValueError("give exactly one of decision (for an approval) and answer (for a question)")
        return self

    def response(self) -> dict[str, str]:
        return {"decision": self.decision} if self.decision is not None else {"answer": str(self.answer)}


class Session(ResponseBody):
    session_id: uuid.UUID
    tree_id: uuid.UUID
    parent_id: uuid.UUID | None
    name: str
    path: str
    depth: int
    title: str
    agent_id: str | None
    project_id: uuid.UUID
    status: Literal["active", "archived"]
    activity: Activity
    current_turn_id: uuid.UUID | None
    queue_paused: bool
    pending_inputs: int
    origin: dict[str, Any]
    created_at: dt.datetime
    updated_at: dt.datetime
    # Beyond the SPEC's shape:
    turn_id: uuid.UUID | None = Field(default=None, description="The latest Turn, open or not.")
    turn_status: TurnStatus | None = None
    waiting_for: WaitingFor | None = None
    archived: bool = False


class TreeAttention(ResponseBody):
    """How many members of a tree are in each state that may need a look (the root included)."""

    members: int
    running: int
    queued: int
    waiting_cooperation: int
    waiting_approval: int
    waiting_answer: int
    cancelling: int
    failed: int = Field(description="Members whose latest Turn failed.")


class RootSession(Session):
    attention: TreeAttention = Field(description="Member counts of the root's whole tree.")


class InputSummary(ResponseBody):
    seq: int = Field(description="Its place in the session's queue order (a page's `after`).")
    input_id: uuid.UUID
    session_id: uuid.UUID
    status: InputStatus
    text: str = Field(description=f"The input's text, cut to a preview of {INPUT_PREVIEW} characters.")
    truncated: bool = Field(description="The text was longer than its preview.")
    origin: dict[str, Any] = Field(description="Who submitted it: {kind: human|session|api|schedule, ...}.")
    turn_id: uuid.UUID | None = Field(description="The Turn it became (none while pending or once cancelled).")
    created_at: dt.datetime
    ended_at: dt.datetime | None


class InputReceipt(ResponseBody):
    input_id: uuid.UUID
    session_id: uuid.UUID
    status: Literal["started", "queued"]
    turn_id: uuid.UUID | None


class SessionCreated(BaseModel):
    session: Session
    input: InputReceipt | None


class SteerAccepted(ResponseBody):
    status: Literal["accepted"] = "accepted"
    message_id: uuid.UUID
    session_id: uuid.UUID
    turn_id: uuid.UUID


class TurnCancelAccepted(BaseModel):
    status: Literal["accepted"] = "accepted"
    session_id: uuid.UUID
    turn_id: uuid.UUID


class InputCancelled(ResponseBody):
    input_id: uuid.UUID
    session_id: uuid.UUID
    status: Literal["cancelled"]


class Result(ResponseBody):
    session_id: uuid.UUID
    input_id: uuid.UUID
    input_status: InputStatus
    turn_id: uuid.UUID | None
    status: TurnStatus | InputStatus = Field(description="The Turn's status, or the input's while it has no Turn.")
    terminal: bool
    result_run_id: uuid.UUID | None
    output: str | None
    error: str | None


class Message(ResponseBody):
    id: int
    role: Literal["user", "assistant", "tool"]
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    tool_call_id: str | None
    turn_id: uuid.UUID | None
    run_id: uuid.UUID | None
    origin: dict[str, Any]
    created_at: dt.datetime


# -- trees -------------------------------------------------------------------------------------------


class MemberPlace(ResponseBody):
    """Who a member is and where it sits in its tree."""

    session_id: uuid.UUID
    parent_id: uuid.UUID | None
    name: str
    path: str
    depth: int
    title: str


class Member(MemberPlace):
    activity: Activity
    turn_id: uuid.UUID | None
    turn_status: TurnStatus | None
    waiting_for: WaitingFor | None
    pending_inputs: int
    queue_paused: bool
    usage: Usage = Field(description="This member's usage, summed from its Runs.")


class TreeSummary(ResponseBody):
    tree_id: uuid.UUID
    stopped: bool
    archived: bool = False
    slot_limit: int
    slots_in_use: int
    event_cursor: int = Field(description="The latest event cursor when this summary was read: stream "
                                          "`/trees/{tree_id}/events?after=<event_cursor>` to follow it without loss.")
    members: list[Member]
    # Beyond the SPEC's shape:
    stopped_at: dt.datetime | None = Field(description="When the tree was last stopped.")
    stop_reason: Literal["user", "budget_exceeded"] | None = Field(
        description="Why it is stopped: a human's Stop all, or a budget reached (see stop_detail).")
    stop_detail: BudgetReached | None = Field(description="The budget limit that stopped it.")
    budget: BudgetLimits = Field(description="This tree's own budget.")
    budget_reached: BudgetReached | None = Field(
        description="The budget limit its work has reached now (its own budget or that of a tree that spawned it); "
                    "continue is refused while there is one.")
    usage: TreeUsage = Field(description="The tree's usage: the sum of its Runs.")
    spawned_usage: SpawnedUsage = Field(description="The usage of the trees spawned from it (its lineage below it).")
    lineage_id: uuid.UUID = Field(description="The first tree of its lineage (itself unless it was spawned).")
    spawned_by_tree_id: uuid.UUID | None


class TreeStopAccepted(BaseModel):
    status: Literal["stopping"] = "stopping"
    tree_id: uuid.UUID
    signalled_sessions: list[uuid.UUID] = Field(description="Members whose running Turn is being cancelled.")


class TreeBudget(ResponseBody):
    tree_id: uuid.UUID
    budget: BudgetLimits
    budget_reached: BudgetReached | None
    usage: TreeUsage
    spawned_usage: SpawnedUsage
    stopped: bool
    stop_reason: Literal["user", "budget_exceeded"] | None


class TreeContinued(BaseModel):
    status: Literal["continued"] = "continued"
    tree_id: uuid.UUID
    started_sessions: list[uuid.UUID] = Field(description="Members whose next pending input started.")


# -- human in the loop -------------------------------------------------------------------------------


class HumanRequest(ResponseBody):
    """A pending approval or question. A session's requests (``GET /sessions/{id}/requests``) are
    whole; the tree's inbox (``GET /trees/{id}/requests``) holds summaries, whose long payload
    fields are cut: read a request whole from its session before approving it."""

    id: uuid.UUID
    kind: RequestKind
    session_id: uuid.UUID
    path: str = Field(description="Where in the tree the request comes from.")
    turn_id: uuid.UUID
    payload: dict[str, Any] = Field(description=(
        "What is asked: {tool, command, tool_call_id} or {tool, path, bytes, content, tool_call_id} for an "
        "approval, {question} for a question. In the tree's inbox a field longer than 500 characters holds "
        "its first 500, and `<field>_chars` (e.g. `command_chars`) its whole length."))
    truncated: bool = Field(default=False, description="Some payload field was cut (only in the tree's inbox).")
    status: RequestStatus
    created_at: dt.datetime


class AnswerAccepted(BaseModel):
    status: Literal["answered"] = "answered"
    request_id: uuid.UUID
    session_id: uuid.UUID
    turn_id: uuid.UUID


class Intervention(ResponseBody):
    """A human acted directly on a member session (SPEC §5): its event went to the member's parent."""

    cursor: int = Field(description="The event's cursor.")
    parent_session_id: uuid.UUID
    member_session_id: uuid.UUID
    path: str = Field(description="The member's path.")
    action: str = Field(description="input, steer, answer or cancel.")
    payload: dict[str, Any] = Field(description="The event's payload: ids, and a preview of the text given.")
    created_at: dt.datetime


# -- events ------------------------------------------------------------------------------------------


class Event(ResponseBody):
    cursor: int
    kind: str
    session_id: uuid.UUID | None
    tree_id: uuid.UUID | None = None
    turn_id: uuid.UUID | None
    run_id: uuid.UUID | None
    payload: dict[str, Any]
    created_at: dt.datetime


# -- timeline and trace ------------------------------------------------------------------------------


class TimelineInterval(ResponseBody):
    kind: Literal["run", "queued", "wait", "approval", "question", "model_call", "tool_call"] = Field(
        description="run: holds a slot; queued: waits in the tree's FIFO for a slot; wait: a parked Turn; "
                    "approval / question: a human request pending; model_call and tool_call: inside a Run.")
    id: str = Field(description="Unique per kind: the run, wait, request or model call id; a tool call is "
                                "`<turn_id>:<tool_call_id>`.")
    session_id: uuid.UUID
    path: str
    start: dt.datetime
    end: dt.datetime | None = Field(description="None while the interval is still open.")
    status: str | None = Field(description="run: the Run's status; queued: granted, pending or cancelled; "
                                           "wait: open, resumed or cancelled; request: pending, answered or "
                                           "cancelled; model_call / tool_call: ok, error (tool_call also open "
                                           "or abandoned).")
    error: str | None = None
    name: str | None = Field(default=None, description="run / queued: start or resume; wait: what it waits for "
                                                       "(inputs, sessions, approval, answer); model_call: the "
                                                       "model; tool_call: the tool.")
    run_id: uuid.UUID | None = None
    turn_id: uuid.UUID | None = None
    wait_id: uuid.UUID | None = None
    request_id: uuid.UUID | None = None
    waits_on: list[uuid.UUID] = Field(default_factory=list, description="wait: the sessions it watches.")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = Field(default=0.0, description="model_call: null when litellm has no price for "
                                                            "the model.")


class TimelineInstant(ResponseBody):
    kind: Literal["stop", "continue"]
    id: str = Field(description="The event cursor of the moment.")
    session_id: uuid.UUID
    at: dt.datetime


class Timeline(ResponseBody):
    tree_id: uuid.UUID
    as_of: dt.datetime = Field(description="When this read (its first page) began: pass it as `since` to read "
                                           "only what changed after it.")
    members: list[MemberPlace] = Field(description="Every member, a parent right before its subtree.")
    intervals: list[TimelineInterval] = Field(description="Ordered by (start, kind, id).")
    instants: list[TimelineInstant]
    next_cursor: str | None = Field(description="Pass as `since` for the next page; None after the last page.")


class TraceEvent(BaseModel):
    """One Chrome trace event (the JSON format chrome://tracing and Perfetto open)."""

    name: str
    ph: Literal["X", "i", "M"] = Field(description="X: complete (ts + dur); i: instant; M: metadata (lane names "
                                                  "and order).")
    ts: float = Field(description="Microseconds since the Unix epoch (0 for metadata).")
    pid: int = Field(description="One process per member.")
    tid: int = Field(description="The member's lanes: 1 slots and waits, 2 model calls, 3 tool calls.")
    cat: str | None = None
    dur: float | None = Field(default=None, description="X only: microseconds.")
    s: Literal["g", "p", "t"] | None = Field(default=None, description="i only: the instant's scope.")
    args: dict[str, Any] | None = None


class TraceMore(BaseModel):
    next_cursor: str = Field(description="More of the timeline follows: pass this as `since` for the next page.")


class Trace(BaseModel):
    # The format's own field names (``otherData``: metadata a viewer shows and otherwise ignores).
    traceEvents: list[TraceEvent]
    displayTimeUnit: Literal["ms"] = "ms"
    otherData: TraceMore | None = None


# -- schedules ---------------------------------------------------------------------------------------


class ScheduleCreate(RequestBody):
    cron: str | None = Field(default=None, max_length=200,
                             description="A cron expression (five fields, UTC); give this or every_seconds.")
    every_seconds: float | None = Field(default=None, ge=1, le=366 * 24 * 3600, strict=True,
                                        description="A fixed interval in seconds; give this or cron.")
    text: Text = Field(description="The input submitted at each due time.")
    catch_up: Literal["once", "all", "skip"] = Field(
        default="once", description="Due times missed while nothing ran: fire once for them, each, or none.")


class Schedule(ResponseBody):
    schedule_id: uuid.UUID
    session_id: uuid.UUID
    cron: str | None
    every_seconds: float | None = Field(validation_alias="interval_seconds")
    text: str = Field(validation_alias="input_text")
    catch_up: str
    next_due_at: dt.datetime
    last_due_at: dt.datetime | None = None
    created_at: dt.datetime


class CompactionRequested(ResponseBody):
    session_id: uuid.UUID
    status: Literal["requested"] = "requested"
