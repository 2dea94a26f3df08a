"""Terminal renderings with ``rich``: a tree's members, agents, sessions and API keys as tables.

What a model or a tenant wrote (titles, names, a Turn's output or error) reaches an operator's
terminal through :func:`plain` only: rich reads a table cell's string as markup (a title of
``[link=…]`` became a hyperlink), and passes escape sequences through, which a terminal acts on
(OSC 52 writes the clipboard, cursor moves overwrite what was printed above)."""

from __future__ import annotations

import datetime
import re
from typing import Any

from rich.table import Table
from rich.text import Text

from persistence import usage
from persistence.records import Row
from persistence.statuses import Activity, TurnStatus

ACTIVITY_STYLES = {
    Activity.IDLE: "dim",
    Activity.QUEUED: "yellow",
    Activity.RUNNING: "bold green",
    Activity.WAITING_COOPERATION: "cyan",
    Activity.WAITING_APPROVAL: "bold magenta",
    Activity.WAITING_ANSWER: "bold magenta",
    Activity.CANCELLING: "red",
}
STATUS_STYLES = {TurnStatus.COMPLETED: "green", TurnStatus.FAILED: "bold red", TurnStatus.CANCELLED: "red",
                 TurnStatus.RUNNING: "green", TurnStatus.WAITING: "cyan", TurnStatus.CANCELLING: "red"}


# C0 and C1 controls but newline and tab, and DEL: a terminal acts on each (ESC and CSI start
# sequences, CR and BS write over what is on the line).
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(value: Any) -> Text:
    """``value`` as text for the terminal: never markup, every control character shown as its code
    point (``⟨U+001B⟩``), as the web UI shows what it would hide."""
    text = "" if value is None else str(value)
    return Text(_CONTROLS.sub(lambda found: f"⟨U+{ord(found.group()):04X}⟩", text))


def _styled(value: Any, styles: dict[str, str]) -> Text:
    text = "" if value is None else str(value)
    return Text(text, style=styles.get(text, ""))


_LIMIT_UNITS = {"max_tokens": "tokens", "max_cost_usd": "USD", "max_seconds": "s", "max_model_calls": "calls"}


def _cost(spent: Row) -> str:
    unpriced = spent.get("unpriced_calls")
    return f"${spent['cost_usd']:.4f}" + (f" (+ {usage.calls(unpriced)} with no price)" if unpriced else "")


def usage_line(summary: Row) -> str:
    """The tree's usage (and its spawned trees', and its budget) in one line of rich markup."""
    spent = summary["usage"]
    line = (f"tokens {spent['tokens']:,} ({spent['prompt_tokens']:,} in / {spent['completion_tokens']:,} out)"
            f"  ·  model calls {spent['model_calls']:,}  ·  {_cost(spent)}")
    spawned = summary.get("spawned_usage") or {}
    if spawned.get("trees"):
        line += (f"  ·  spawned trees ({spawned['trees']}): tokens {spawned['tokens']:,}, "
                 f"model calls {spawned['model_calls']:,}, {_cost(spawned)}")
    limits = [f"{value:,g} {_LIMIT_UNITS[name]}" for name, value in (summary.get("budget") or {}).items()
              if value is not None]
    if limits:
        line += f"  ·  budget {', '.join(limits)}"
    return line


def _stopped(summary: Row) -> str:
    detail = summary.get("stop_detail")
    if summary.get("stop_reason") == "budget_exceeded" and detail:
        return f"[red]stopped: budget exceeded ({usage.describe_reached(detail)})[/red]"
    return "[red]stopped[/red]"


def tree_table(summary: Row, *, elapsed: float | None = None, status: str | None = None) -> Table:
    """Members (indented by depth), their activity, Turn and tokens, plus the tree's slots, usage,
    budget, why it stopped and the elapsed time."""
    heading = [f"tree {summary['tree_id']}", f"slots {summary['slots_in_use']}/{summary['slot_limit']}"]
    if summary.get("stopped"):
        heading.append(_stopped(summary))
    if elapsed is not None:
        heading.append(f"{elapsed:.1f} s")
    if status:
        heading.append(status)
    title = "  ·  ".join(heading)
    if "usage" in summary:
        title += "\n" + usage_line(summary)
    table = Table(title=title, title_justify="left", expand=False)
    table.add_column("member")
    table.add_column("activity")
    table.add_column("turn")
    table.add_column("queued", justify="right")
    table.add_column("tokens", justify="right")
    table.add_column("title", overflow="ellipsis", max_width=48)
    for member in summary["members"]:
        indent = "  " * member["depth"]
        name = "/root" if member["depth"] == 0 else member["name"]
        tokens = (member.get("usage") or {}).get("tokens")
        table.add_row(plain(f"{indent}{name}"), _styled(member["activity"], ACTIVITY_STYLES),
                      _styled(member["turn_status"], STATUS_STYLES), str(member["pending_inputs"] or ""),
                      f"{tokens:,}" if tokens else "", plain(member["title"]))
    return table


def agents_table(agents: list[Row]) -> Table:
    table = Table(title="agents", title_justify="left")
    for column in ("id", "name", "model", "approval", "shared", "owner"):
        table.add_column(column)
    for agent in agents:
        table.add_row(plain(agent["agent_id"]), plain(agent["name"]), plain(agent["model"]), agent["approval_mode"],
                      "yes" if agent["shared"] else "", plain(agent["owner_user_id"]))
    return table


def sessions_table(sessions: list[Row]) -> Table:
    table = Table(title="root sessions (newest first)", title_justify="left")
    for column in ("session_id", "activity", "turn", "created", "title"):
        table.add_column(column)
    for session in sessions:
        table.add_row(str(session["session_id"]), _styled(session["activity"], ACTIVITY_STYLES),
                      _styled(session["turn_status"], STATUS_STYLES),
                      session["created_at"].strftime("%Y-%m-%d %H:%M:%S"), plain(session["title"]))
    return table


KEY_STATE_STYLES = {"live": "green", "expired": "yellow", "revoked": "red"}


def _when(value: Any, missing: str) -> str:
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S") if value is not None else missing


def keys_table(keys: list[Row]) -> Table:
    """API keys for operators: ids, scopes, state and dates (UTC), never the keys."""
    table = Table(title="API keys (UTC)", title_justify="left")
    for column in ("key id", "user", "app", "state", "created", "expires", "last used", "revoked"):
        table.add_column(column, no_wrap=True)
    now = datetime.datetime.now(datetime.UTC)
    for key in keys:
        state = ("revoked" if key["revoked_at"] is not None
                 else "expired" if key["expires_at"] is not None and key["expires_at"] <= now else "live")
        table.add_row(str(key["key_id"]), plain(key["user_id"]), plain(key["app_id"]), _styled(state, KEY_STATE_STYLES),
                      _when(key["created_at"], ""), _when(key["expires_at"], "never"),
                      _when(key["last_used_at"], "never"), _when(key["revoked_at"], "-"))
    return table
