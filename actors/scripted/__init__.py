"""The built-in scripted model (SPEC §13): an OpenAI-compatible endpoint for offline runs.

Canopy reaches it through litellm exactly like a real provider (``canopy/scripted`` is
routed to ``openai/scripted`` with the endpoint as ``api_base``), so tests, demos and
benchmarks exercise the real model path without a network.

Behaviour, decided only from the request messages so that it is deterministic and a
replayed Run gets the same answers:

* The Turn's Input is the last ``user`` message that is not a Canopy injection
  (``<canopy:message ...>`` / ``<canopy:steer>``); the step index is the number of
  ``assistant`` messages after it.
* If the Input has a line ``#!script`` followed by a JSON list, element ``step`` is the reply:
  ``{"call": [{"name", "args"}, ...]}``, ``{"say": text}`` or ``{"fail": text}``, each with an
  optional ``delay_ms``: the latency from the request's arrival to the reply's start, this
  model's own work included (as in a real provider's latency). A streamed reply may also take
  ``stream_ms``, spread evenly between its chunks, as a real model's text arrives over time
  (an extension of SPEC §13, which leaves streaming pace open); each at most 600,000 ms. Past
  the end of the list the model says :data:`FINAL_TEXT`.
* Strings inside ``args``/``say`` may reference tool results of this Turn as
  ``${N.dotted.path}``; ``${N}`` is the whole result as JSON text. A string that is exactly
  one reference takes the referenced value's type. ``$${...}`` stands for a literal ``${...}``
  (a nested script handed to a child keeps its own references).
* Without a script it runs the demo: a root fans out to two or three children with
  ``create_session``, waits with ``wait_inputs`` and summarises; a child answers its task. A
  session's identity (``name:``, ``role:``) is read from its system prompt.
* Its input is untrusted: every parse is linear in the request's size, and a request body, a
  script or a reply's expansion beyond :class:`Limits` is refused with HTTP 400.

Modules: :mod:`.builders` (``script``, ``say``, ``call``, ``create``: the public way to write
scripts, re-exported here), :mod:`.script` (parsing steps and references), :mod:`.model` (the
reply to a request) and :mod:`.server` (the HTTP endpoint, which only the ModelGateway starts:
importing this package does not import FastAPI or uvicorn).
"""

from actors.scripted.builders import call, create, say, script
from actors.scripted.model import FINAL_TEXT, MODEL_ID, Limits
from actors.scripted.script import SCRIPT_MARKER, ScriptError

__all__ = ["FINAL_TEXT", "MODEL_ID", "SCRIPT_MARKER", "Limits", "ScriptError", "call", "create", "say", "script"]
