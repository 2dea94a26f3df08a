-- Canopy schema: what a new database gets, at the latest version. An existing database is
-- brought to the same schema by persistence/migrations/ (tests/persistence/test_migrations.py
-- checks that the two agree).
-- Every object is owned by a scope (user_id, app_id); composite foreign keys make
-- the database itself refuse rows that would cross a scope, a project or a tree.

CREATE TABLE schema_version (
    version     integer PRIMARY KEY,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- An API key: its scope, its life (expiry, revocation) and when it was last used (written at
-- most about once a minute per key). key_id names it to operators; only the hash authenticates.
CREATE TABLE api_keys (
    key_hash      text PRIMARY KEY,            -- sha256 of the key; the key itself is never stored
    user_id       text NOT NULL,
    app_id        text NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    key_id        uuid NOT NULL DEFAULT gen_random_uuid() UNIQUE,
    expires_at    timestamptz,
    last_used_at  timestamptz,
    revoked_at    timestamptz
);
-- API replicas cache keys they have checked; a revocation (or a new expiry, or a deletion)
-- tells every replica at once on canopy_keys, naming the key by its id.
CREATE FUNCTION canopy_notify_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('canopy_keys', OLD.key_id::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER api_keys_notify AFTER UPDATE OF revoked_at, expires_at OR DELETE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION canopy_notify_key();

-- The event streams a key holds open, across every API replica: a stream renews its row while
-- it is open and deletes it when it closes; a row past expires_at (its replica died) is ignored.
CREATE TABLE open_streams (
    stream_id   uuid PRIMARY KEY,
    key_id      uuid NOT NULL REFERENCES api_keys (key_id) ON DELETE CASCADE,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX open_streams_key ON open_streams (key_id, expires_at);
-- The live streams of every key, for the metrics gauge (rows past expires_at are ignored).
CREATE INDEX open_streams_expiry ON open_streams (expires_at);

-- One row per scope: the event cursor is a counter locked by its appender until commit,
-- so a reader at cursor N can never later see a smaller cursor commit.
CREATE TABLE scopes (
    user_id      text NOT NULL,
    app_id       text NOT NULL,
    last_cursor  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (user_id, app_id)
);

CREATE TABLE agents (
    app_id          text NOT NULL,
    agent_id        text NOT NULL CHECK (agent_id ~ '^[a-z0-9][a-z0-9_-]{0,63}$'),
    owner_user_id   text NOT NULL,
    name            text NOT NULL,
    description     text NOT NULL DEFAULT '',
    model           text NOT NULL,
    instructions    text NOT NULL DEFAULT '',
    tools           jsonb NOT NULL DEFAULT '[]',
    approval_mode   text NOT NULL DEFAULT 'auto' CHECK (approval_mode IN ('auto', 'ask')),
    shared          boolean NOT NULL DEFAULT false,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    -- Compact a session's history when a model call would send more tokens (NULL: the setting).
    compact_at_tokens integer CHECK (compact_at_tokens >= 1000),
    budget          jsonb,                   -- the default budget of a tree it starts: {max_tokens, ...}
    -- Where the agent's model calls go and the NAME of the key they use (never a key).
    api_base        text CHECK (api_base ~ '^https?://[^\s*]+$' AND length(api_base) <= 2000),
    api_key_ref     text CHECK (api_key_ref ~ '^[A-Z][A-Z0-9_]{0,63}$'),
    -- An id names an agent among its owner's (quotas.check_room counts by this key's prefix), and
    -- a shared one among the app's shared agents: another user's private agent never takes an id.
    PRIMARY KEY (app_id, owner_user_id, agent_id)
);
CREATE UNIQUE INDEX agents_shared_id ON agents (app_id, agent_id) WHERE shared;

CREATE TABLE projects (
    project_id  uuid PRIMARY KEY,
    user_id     text NOT NULL,
    app_id      text NOT NULL,
    name        text NOT NULL,
    workdir     text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (project_id, user_id, app_id),
    FOREIGN KEY (user_id, app_id) REFERENCES scopes (user_id, app_id)
);
CREATE INDEX projects_scope ON projects (user_id, app_id);  -- quotas.check_room

-- A tree's id is its root session's id. It owns the slot limit and the stop state.
CREATE TABLE trees (
    tree_id     uuid PRIMARY KEY,
    user_id     text NOT NULL,
    app_id      text NOT NULL,
    project_id  uuid NOT NULL,
    slot_limit  integer NOT NULL CHECK (slot_limit > 0),
    stopped     boolean NOT NULL DEFAULT false,
    stopped_at  timestamptz,
    archived    boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    -- Trees made by create_session(mode="root") form a lineage: the first tree of the chain and
    -- every tree spawned from it or its spawns, so limits (and budgets) cover the whole chain.
    lineage_id          uuid NOT NULL,
    spawned_by_tree_id  uuid,
    -- The spawning chain: the lineage's first tree, ..., the tree that spawned this one, this one.
    -- A budget covers its tree and every tree whose chain holds it (spawned from it, directly or not).
    spawn_chain         uuid[] NOT NULL,
    -- The tree's budget (NULL: no limit). A limit is reached when the usage of this tree and of the
    -- trees spawned from it is at or over it; from then on no model call of these trees starts.
    budget_tokens       bigint,
    budget_cost_usd     double precision,
    budget_seconds      double precision,   -- wall time since the first Run of these trees
    budget_model_calls  bigint,
    -- Why the tree is stopped (NULL while it is not): a human's Stop all, or a budget reached
    -- (stop_detail: which budget, which limit, its maximum and the usage).
    stop_reason         text,
    stop_detail         jsonb,
    UNIQUE (tree_id, user_id, app_id, project_id),
    FOREIGN KEY (project_id, user_id, app_id) REFERENCES projects (project_id, user_id, app_id),
    CONSTRAINT trees_lineage_fk FOREIGN KEY (lineage_id) REFERENCES trees (tree_id),
    CONSTRAINT trees_spawned_by_fk FOREIGN KEY (spawned_by_tree_id) REFERENCES trees (tree_id),
    CONSTRAINT trees_budget_positive CHECK (
        coalesce(budget_tokens, 1) > 0 AND coalesce(budget_cost_usd, 1) > 0 AND coalesce(budget_seconds, 1) > 0
        AND coalesce(budget_model_calls, 1) > 0),
    CONSTRAINT trees_stop_reason_check CHECK (stop_reason IN ('user', 'budget_exceeded'))
);
CREATE INDEX trees_lineage ON trees (lineage_id);
CREATE INDEX trees_project ON trees (project_id);  -- projects.delete_project
CREATE INDEX trees_scope_live ON trees (user_id, app_id) WHERE NOT archived;  -- quotas.check_room
-- The stopped trees, for the metrics gauge (persistence/metrics.py): never a scan of all trees.
CREATE INDEX trees_stopped ON trees (tree_id) WHERE stopped;

-- A tree's usage: the sum of its Runs' charges (tokens, cost, committed model replies), kept by
-- the statement that charges a Run (append_reply.sql), so it never drifts from the runs table;
-- first_run_at: when the tree's first Run got a slot (its budget's wall time counts from there).
CREATE TABLE tree_usage (
    tree_id             uuid PRIMARY KEY REFERENCES trees (tree_id),
    prompt_tokens       bigint NOT NULL DEFAULT 0,
    completion_tokens   bigint NOT NULL DEFAULT 0,
    cost_usd            double precision NOT NULL DEFAULT 0,
    model_calls         bigint NOT NULL DEFAULT 0,
    first_run_at        timestamptz,
    -- Calls litellm has no price for (an agent's own endpoint's model): their cost is not in
    -- cost_usd, so a cost budget cannot count them (canopy_budget_reached allows none under one).
    unpriced_calls      bigint NOT NULL DEFAULT 0
);

-- The first budget limit that the work of a tree has reached, or NULL. The budgets that cover a
-- tree are its own and those of the trees in its spawn chain; each counts the usage of its tree
-- and of every tree spawned from it, directly or not, so a spawned tree cannot escape the budget
-- of the tree that spawned it. A limit is reached when the usage is at or over it. One statement
-- (model_boundary.sql and every other check call it): the trees without a budget cost two
-- index lookups.
CREATE FUNCTION canopy_budget_reached(of_tree uuid) RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('budget_tree_id', b.tree_id, 'limit', l.name, 'max', l.max, 'used', l.used)
    FROM trees t
    JOIN trees b ON b.tree_id = ANY (t.spawn_chain)
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(u.prompt_tokens + u.completion_tokens), 0)::float8 AS tokens,
               coalesce(sum(u.cost_usd), 0)::float8 AS cost_usd,
               coalesce(sum(u.model_calls), 0)::float8 AS model_calls,
               coalesce(extract(epoch FROM now() - min(u.first_run_at)), 0)::float8 AS seconds,
               coalesce(sum(u.unpriced_calls), 0)::float8 AS unpriced_calls
        FROM trees d JOIN tree_usage u ON u.tree_id = d.tree_id
        WHERE d.lineage_id = t.lineage_id AND b.tree_id = ANY (d.spawn_chain)) used
    CROSS JOIN LATERAL (VALUES ('tokens', b.budget_tokens::float8, used.tokens),
                               ('cost_usd', b.budget_cost_usd, used.cost_usd),
                               ('model_calls', b.budget_model_calls::float8, used.model_calls),
                               ('seconds', b.budget_seconds, used.seconds),
                               -- A cost budget cannot count a call litellm has no price for: it allows
                               -- none (used is NULL, never reached, while there is none).
                               ('unpriced_calls', CASE WHEN b.budget_cost_usd IS NOT NULL THEN 0::float8 END,
                                nullif(used.unpriced_calls, 0))) AS l (name, max, used)
    WHERE t.tree_id = of_tree
      AND (b.budget_tokens IS NOT NULL OR b.budget_cost_usd IS NOT NULL OR b.budget_seconds IS NOT NULL
           OR b.budget_model_calls IS NOT NULL)
      AND l.max IS NOT NULL AND l.used >= l.max
    ORDER BY array_position(t.spawn_chain, b.tree_id), l.name
    LIMIT 1
$$;

CREATE TABLE sessions (
    session_id          uuid PRIMARY KEY,
    tree_id             uuid NOT NULL,
    user_id             text NOT NULL,
    app_id              text NOT NULL,
    project_id          uuid NOT NULL,
    parent_id           uuid,
    name                text NOT NULL CHECK (name ~ '^[A-Za-z0-9_-]{1,64}$'),
    path                text NOT NULL CHECK (length(path) <= 1024),
    depth               integer NOT NULL CHECK (depth >= 0),
    title               text NOT NULL DEFAULT '',
    agent_id            text,
    agent_config        jsonb NOT NULL,      -- frozen at creation: model, instructions, tools, approval_mode
    created_by_run_id   uuid,                -- the Run whose create_session made it (children and root mode)
    origin              jsonb NOT NULL DEFAULT '{"kind": "api"}',
    queue_paused        boolean NOT NULL DEFAULT false,
    archived            boolean NOT NULL DEFAULT false,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    -- A human asked for the history to be compacted at the session's next model call.
    compact_requested   boolean NOT NULL DEFAULT false,
    -- The last message (thread_messages.id) a summary was asked for up to, when it failed or could
    -- not be used: not asked again until the history has grown (actors/agent_loop.py).
    compaction_refused_until bigint,
    UNIQUE (session_id, tree_id),
    UNIQUE (session_id, user_id, app_id),
    CONSTRAINT sessions_tree_shape CHECK (
        (parent_id IS NULL AND session_id = tree_id AND path = '/root' AND depth = 0 AND name = 'root')
        OR (parent_id IS NOT NULL AND session_id <> tree_id AND depth > 0 AND path LIKE '/root/%')
    ),
    CONSTRAINT sessions_tree_scope_fk FOREIGN KEY (tree_id, user_id, app_id, project_id)
        REFERENCES trees (tree_id, user_id, app_id, project_id),
    CONSTRAINT sessions_parent_same_tree_fk FOREIGN KEY (parent_id, tree_id)
        REFERENCES sessions (session_id, tree_id),
    CONSTRAINT sessions_unique_sibling_name UNIQUE (parent_id, name),
    CONSTRAINT sessions_unique_path UNIQUE (tree_id, path)
);
-- A project's sessions by tree and path (the list_sessions tool's scope "project", a page at a time).
CREATE INDEX sessions_project ON sessions (project_id, tree_id, path);
-- A scope's live roots newest first (the sidebar's list), of the scope or of one project.
CREATE INDEX sessions_scope_live_roots ON sessions (user_id, app_id, created_at DESC, session_id DESC)
    WHERE parent_id IS NULL AND NOT archived;
CREATE INDEX sessions_project_live_roots ON sessions (project_id, created_at DESC, session_id DESC)
    WHERE parent_id IS NULL AND NOT archived;
-- And with the archived ones (asked for), two ranges merged: an index of every root in their order
-- served a planner as well as these, and read a project's archived roots for a page of live ones.
CREATE INDEX sessions_scope_archived_roots ON sessions (user_id, app_id, created_at DESC, session_id DESC)
    WHERE parent_id IS NULL AND archived;
CREATE INDEX sessions_project_archived_roots ON sessions (project_id, created_at DESC, session_id DESC)
    WHERE parent_id IS NULL AND archived;
-- A scope's sessions, every tree's (the list_sessions tool's scope "all"): without them, every
-- tenant's. Partial, live and archived apart: given a key and the scope, a planner without fresh
-- statistics took a whole-scope index for the lookup of one session and read all of the scope's.
CREATE INDEX sessions_scope_live ON sessions (user_id, app_id, created_at DESC) WHERE NOT archived;
CREATE INDEX sessions_scope_archived ON sessions (user_id, app_id, created_at DESC) WHERE archived;

-- A member's usage: the sum of its Runs' charges, kept as its tree's is (append_reply.sql), so that
-- the tree summary reads a row per member, not every Run the tree ever had. A session its Runs never
-- charged has no row.
CREATE TABLE session_usage (
    tree_id             uuid NOT NULL,
    session_id          uuid NOT NULL,
    prompt_tokens       bigint NOT NULL DEFAULT 0,
    completion_tokens   bigint NOT NULL DEFAULT 0,
    cost_usd            double precision NOT NULL DEFAULT 0,
    model_calls         bigint NOT NULL DEFAULT 0,
    unpriced_calls      bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tree_id, session_id),
    CONSTRAINT session_usage_session_fk FOREIGN KEY (session_id, tree_id) REFERENCES sessions (session_id, tree_id)
);

CREATE TABLE inputs (
    input_id            uuid PRIMARY KEY,
    session_id          uuid NOT NULL,
    user_id             text NOT NULL,
    app_id              text NOT NULL,
    seq                 bigint GENERATED ALWAYS AS IDENTITY,
    text                text NOT NULL,
    status              text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'consumed', 'cancelled')),
    origin              jsonb NOT NULL,      -- {"kind": human|session|api|schedule, "session_id", "path", "run_id"}
    created_at          timestamptz NOT NULL DEFAULT now(),
    ended_at            timestamptz,
    UNIQUE (input_id, session_id),
    FOREIGN KEY (session_id, user_id, app_id) REFERENCES sessions (session_id, user_id, app_id)
);
CREATE INDEX inputs_pending ON inputs (session_id, seq) WHERE status = 'pending';
-- A session's inputs in queue order, whatever their state: the pages of its input list.
CREATE INDEX inputs_session ON inputs (session_id, seq);

CREATE TABLE turns (
    turn_id         uuid PRIMARY KEY,
    session_id      uuid NOT NULL,
    input_id        uuid NOT NULL UNIQUE,
    status          text NOT NULL DEFAULT 'running'
                    CHECK (status IN ('running', 'waiting', 'cancelling', 'completed', 'failed', 'cancelled')),
    waiting_for     text CHECK (waiting_for IN ('cooperation', 'approval', 'answer')),
    result_run_id   uuid,
    created_at      timestamptz NOT NULL DEFAULT now(),
    ended_at        timestamptz,
    -- ask: every side-effecting sandbox call of this Turn waits for a human's approval. Set when
    -- the Turn starts (its session's mode, or its input came from an ask Turn) and raised to ask
    -- when it takes in a message from an ask Turn: work an ask session causes runs under ask.
    approval_mode   text NOT NULL DEFAULT 'auto',
    -- Why the Turn ended, as its Result says (NULL when completed; before migration 0033, its result Run's).
    error           text,
    CONSTRAINT turns_waiting_for_only_when_waiting CHECK ((status = 'waiting') = (waiting_for IS NOT NULL)),
    CONSTRAINT turns_approval_mode_check CHECK (approval_mode IN ('auto', 'ask')),
    UNIQUE (turn_id, session_id),
    FOREIGN KEY (input_id, session_id) REFERENCES inputs (input_id, session_id)
);
-- At most one non-terminal Turn per session.
CREATE UNIQUE INDEX turns_one_open_per_session ON turns (session_id)
    WHERE status IN ('running', 'waiting', 'cancelling');
-- A session's latest Turn (summaries, lists): without it every member scans all turns.
CREATE INDEX turns_session ON turns (session_id, created_at DESC);
-- A member's Turns still open or ended after a moment (the timeline's "since" read): an open Turn
-- sorts as the end of time, so that is one range per member, not every Turn it ever ran.
CREATE INDEX turns_ended ON turns (session_id, (coalesce(ended_at, 'infinity'::timestamptz)));
-- The sessions with a Turn that asked (turn_insert.sql): each new Turn of theirs asks too.
CREATE INDEX turns_asked ON turns (session_id) WHERE approval_mode = 'ask';

CREATE TABLE runs (
    run_id              uuid PRIMARY KEY,
    turn_id             uuid NOT NULL,
    session_id          uuid NOT NULL,
    tree_id             uuid NOT NULL,
    kind                text NOT NULL CHECK (kind IN ('start', 'resume')),
    resumes_run_id      uuid UNIQUE,         -- a Run is resumed at most once
    -- pending: waiting in the tree's FIFO for a slot; running: holds a slot.
    status              text NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'running', 'interrupted', 'completed', 'failed', 'cancelled')),
    queued_at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    owner               text,                -- lease owner: one actor incarnation
    lease_expires_at    timestamptz,
    started_at          timestamptz,
    ended_at            timestamptz,
    output              text,
    error               text,
    prompt_tokens       bigint NOT NULL DEFAULT 0,
    completion_tokens   bigint NOT NULL DEFAULT 0,
    cost_usd            double precision NOT NULL DEFAULT 0,
    model_calls         integer NOT NULL DEFAULT 0,  -- model replies committed (charged) by this Run
    unpriced_calls      integer NOT NULL DEFAULT 0,  -- of those, calls litellm has no price for
    UNIQUE (run_id, turn_id),
    CONSTRAINT runs_turn_fk FOREIGN KEY (turn_id, session_id) REFERENCES turns (turn_id, session_id),
    CONSTRAINT runs_session_tree_fk FOREIGN KEY (session_id, tree_id) REFERENCES sessions (session_id, tree_id),
    CONSTRAINT runs_resume_same_turn_fk FOREIGN KEY (resumes_run_id, turn_id) REFERENCES runs (run_id, turn_id),
    CONSTRAINT runs_resume_shape CHECK ((kind = 'resume') = (resumes_run_id IS NOT NULL))
);
CREATE INDEX runs_tree_running ON runs (tree_id) WHERE status = 'running';
CREATE INDEX runs_tree_pending ON runs (tree_id, queued_at) WHERE status = 'pending';
-- A Turn's Runs, its latest first (a session's state reads it; a Turn has a Run per wait it resumed from).
CREATE INDEX runs_turn ON runs (turn_id, queued_at DESC);
-- A session's running Runs, among them the one no incarnation has taken yet (every activation, drain
-- and sweep asks): a session has one at most. Not on owner or lease_expires_at: every acquisition and
-- heartbeat would then write every index of the row (a heap-only update writes none).
CREATE INDEX runs_session_running ON runs (session_id) WHERE status = 'running';

ALTER TABLE turns ADD CONSTRAINT turns_result_run_fk
    FOREIGN KEY (result_run_id, turn_id) REFERENCES runs (run_id, turn_id);

-- The conversation history the model sees, one row per message.
CREATE TABLE thread_messages (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    session_id      uuid NOT NULL REFERENCES sessions (session_id),
    turn_id         uuid,
    run_id          uuid,
    role            text NOT NULL CHECK (role IN ('user', 'assistant', 'tool')),
    content         text,
    tool_calls      jsonb,
    tool_call_id    text,
    origin          jsonb NOT NULL DEFAULT '{}',
    created_at      timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (run_id, turn_id) REFERENCES runs (run_id, turn_id)
);
CREATE INDEX thread_messages_session ON thread_messages (session_id, id);
CREATE UNIQUE INDEX thread_messages_one_result_per_call ON thread_messages (turn_id, tool_call_id)
    WHERE role = 'tool';
-- A Turn's replies: the timeline expands the tool calls of the Turns a read keeps, not every reply.
CREATE INDEX thread_messages_replies ON thread_messages (turn_id) WHERE role = 'assistant';
-- A session's compaction summaries: a Run starts from the latest (persistence/messages.py).
CREATE INDEX thread_messages_compactions ON thread_messages (session_id, id) WHERE origin->>'kind' = 'compaction';

-- Cooperation messages and steers: read by a running receiver at its next model boundary.
CREATE TABLE coop_messages (
    message_id          uuid PRIMARY KEY,
    user_id             text NOT NULL,
    app_id              text NOT NULL,
    kind                text NOT NULL CHECK (kind IN ('message', 'steer')),
    sender_session_id   uuid,
    receiver_session_id uuid NOT NULL,
    source_run_id       uuid,
    source_turn_id      uuid,
    tool_call_id        text,
    body                text NOT NULL CHECK (length(body) <= 100000),
    received_at         timestamptz NOT NULL DEFAULT now(),
    processed_at        timestamptz,
    processed_run_id    uuid,
    FOREIGN KEY (receiver_session_id, user_id, app_id) REFERENCES sessions (session_id, user_id, app_id),
    FOREIGN KEY (sender_session_id, user_id, app_id) REFERENCES sessions (session_id, user_id, app_id)
);
CREATE INDEX coop_messages_unprocessed ON coop_messages (receiver_session_id, received_at)
    WHERE processed_at IS NULL;

CREATE TABLE events (
    user_id     text NOT NULL,
    app_id      text NOT NULL,
    cursor      bigint NOT NULL,
    kind        text NOT NULL,
    session_id  uuid,
    tree_id     uuid,
    turn_id     uuid,
    run_id      uuid,
    payload     jsonb NOT NULL DEFAULT '{}',
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, app_id, cursor),
    FOREIGN KEY (user_id, app_id) REFERENCES scopes (user_id, app_id)
);
CREATE INDEX events_session ON events (session_id, cursor);
CREATE INDEX events_tree ON events (tree_id, cursor);
-- A tree's stops and continues (its timeline), not its whole history.
CREATE INDEX events_tree_stops ON events (tree_id, cursor) WHERE kind IN ('tree_stopped', 'tree_continued');
-- A human's interventions on a member, found from the member (the event itself goes to its parent).
CREATE INDEX events_interventions ON events ((payload->>'member_session_id'), cursor)
    WHERE kind = 'user_intervention';
-- A session's own interventions (on its children), not among every event of the session.
CREATE INDEX events_interventions_session ON events (session_id, cursor) WHERE kind = 'user_intervention';
-- What wait_sessions counts as a target's update (persistence/events.py SESSION_UPDATE_KINDS), not
-- among every event of the target after the wait's cursor.
CREATE INDEX events_session_updates ON events (session_id, cursor)
    WHERE kind IN ('turn_completed', 'turn_failed', 'turn_cancelled', 'waiting_approval', 'waiting_answer',
                   'coop_message');
-- Live streams: every committed event wakes the API replicas that LISTEN on canopy_events.
-- The payload names only where to look (scope, session, tree); readers always re-read the
-- committed rows, so a lost or folded notification delays a stream but never loses an event.
CREATE FUNCTION canopy_notify_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    payload text := json_build_array(NEW.user_id, NEW.app_id, NEW.session_id, NEW.tree_id)::text;
BEGIN
    -- A NOTIFY payload must stay under 8000 bytes: an oversized one wakes every reader instead.
    IF octet_length(payload) > 4000 THEN
        payload := '[]';
    END IF;
    PERFORM pg_notify('canopy_events', payload);
    RETURN NULL;
END
$$;
CREATE TRIGGER events_notify AFTER INSERT ON events FOR EACH ROW EXECUTE FUNCTION canopy_notify_event();

-- A parked Turn: what it waits for, until when, and the Run that resumed it.
CREATE TABLE waits (
    wait_id         uuid PRIMARY KEY,
    session_id      uuid NOT NULL,
    tree_id         uuid NOT NULL,
    turn_id         uuid NOT NULL,
    run_id          uuid NOT NULL UNIQUE,    -- the interrupted Run
    tool_call_id    text NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('inputs', 'sessions', 'approval', 'answer')),
    condition       jsonb NOT NULL,
    deadline        timestamptz,
    status          text NOT NULL DEFAULT 'open' CHECK (status IN ('open', 'resumed', 'cancelled')),
    resumed_run_id  uuid,
    created_at      timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (run_id, turn_id) REFERENCES runs (run_id, turn_id),
    FOREIGN KEY (turn_id, session_id) REFERENCES turns (turn_id, session_id)
);
CREATE INDEX waits_open ON waits (deadline) WHERE status = 'open';
-- The open waits in id order: the sweep's page of them (waits_to_sweep.sql), past the closed ones.
CREATE INDEX waits_open_id ON waits (wait_id) WHERE status = 'open';
-- A Turn's waits: its open one, found by the deadlock check's walk along the waits (wait_graph.sql),
-- and its latest resumed one, whose outcome a resume Run delivers (persistence/waits.py).
CREATE INDEX waits_turn ON waits (turn_id, created_at);

-- The Turns a cooperation wait is stuck behind, one row per target in target order (NULL for a
-- target that is free: ended, idle, or starting as soon as it can). An input waits for its own
-- open Turn, or, while it is queued, for the open Turn of its session ahead of it (FIFO); a session
-- for its open Turn. The deadlock check walks the waits along these (wait_graph.sql). Each target is
-- looked up by its key, so a call costs its targets' index lookups whatever the tables' statistics.
CREATE FUNCTION canopy_wait_on(of_kind text, of_condition jsonb, of_user text, of_app text)
RETURNS TABLE (target_position bigint, blocker uuid) LANGUAGE sql STABLE AS $$
    SELECT target.position,
           (SELECT CASE WHEN own.status IN ('running', 'waiting', 'cancelling') THEN own.turn_id
                        WHEN i.status = 'pending' THEN ahead.turn_id END
            FROM inputs i
            LEFT JOIN turns own ON own.input_id = i.input_id
            LEFT JOIN turns ahead ON ahead.session_id = i.session_id
                                 AND ahead.status IN ('running', 'waiting', 'cancelling')
            WHERE i.input_id = target.id::uuid AND i.user_id = of_user AND i.app_id = of_app)
    FROM jsonb_array_elements_text(of_condition -> 'input_ids') WITH ORDINALITY AS target (id, position)
    WHERE of_kind = 'inputs'
  UNION ALL
    SELECT target.position,
           (SELECT t.turn_id
            FROM (SELECT * FROM sessions WHERE session_id = target.id::uuid OFFSET 0) s
            JOIN turns t ON t.session_id = s.session_id AND t.status IN ('running', 'waiting', 'cancelling')
            WHERE s.user_id = of_user AND s.app_id = of_app)
    FROM jsonb_array_elements_text(of_condition -> 'targets') WITH ORDINALITY AS target (id, position)
    WHERE of_kind = 'sessions'
$$;

-- The sessions a wait watches, so a finishing target finds its waiters by index; ``open`` while the
-- wait is (closed with it: persistence/waits.py), so that is one range of the open ones, not every
-- wait that ever watched the session.
CREATE TABLE wait_targets (
    wait_id     uuid NOT NULL REFERENCES waits (wait_id),
    session_id  uuid NOT NULL REFERENCES sessions (session_id),
    open        boolean NOT NULL DEFAULT true,
    PRIMARY KEY (wait_id, session_id)
);
CREATE INDEX wait_targets_open ON wait_targets (session_id) WHERE open;

-- Side-effecting tool calls, keyed by (source Turn, tool call id): replay returns the stored result.
CREATE TABLE tool_receipts (
    turn_id         uuid NOT NULL REFERENCES turns (turn_id),
    tool_call_id    text NOT NULL,
    tool_name       text NOT NULL,
    arguments       jsonb NOT NULL,
    result          jsonb,
    first_run_id    uuid NOT NULL REFERENCES runs (run_id),
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- started: a sandbox command was about to start and has no outcome yet (its Run may have died
    -- with it running); done: result holds the outcome.
    state           text NOT NULL DEFAULT 'done',
    CONSTRAINT tool_receipts_unique_call PRIMARY KEY (turn_id, tool_call_id),
    CONSTRAINT tool_receipts_state_check CHECK (state IN ('started', 'done')),
    CONSTRAINT tool_receipts_result_when_done CHECK ((state = 'done') = (result IS NOT NULL))
);

-- HTTP writes with an Idempotency-Key header.
CREATE TABLE http_idempotency (
    user_id         text NOT NULL,
    app_id          text NOT NULL,
    idempotency_key text NOT NULL,
    request_hash    text NOT NULL,
    status_code     integer NOT NULL,
    response        jsonb NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, app_id, idempotency_key)
);

-- Human in the loop: approvals of sandbox commands and ask_user questions.
CREATE TABLE requests (
    request_id      uuid PRIMARY KEY,
    user_id         text NOT NULL,
    app_id          text NOT NULL,
    tree_id         uuid NOT NULL,
    session_id      uuid NOT NULL,
    turn_id         uuid NOT NULL,
    run_id          uuid NOT NULL,
    wait_id         uuid NOT NULL UNIQUE REFERENCES waits (wait_id),
    kind            text NOT NULL CHECK (kind IN ('approval', 'question')),
    payload         jsonb NOT NULL,
    status          text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'answered', 'cancelled')),
    response        jsonb,
    created_at      timestamptz NOT NULL DEFAULT now(),
    answered_at     timestamptz,
    FOREIGN KEY (session_id, user_id, app_id) REFERENCES sessions (session_id, user_id, app_id),
    FOREIGN KEY (session_id, tree_id) REFERENCES sessions (session_id, tree_id)
);
CREATE INDEX requests_tree_pending ON requests (tree_id, created_at) WHERE status = 'pending';

-- Model calls, counted each time (at-least-once), whether or not the reply was committed.
CREATE TABLE model_calls (
    id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id              uuid NOT NULL,
    model               text NOT NULL,
    prompt_tokens       bigint NOT NULL DEFAULT 0,
    completion_tokens   bigint NOT NULL DEFAULT 0,
    cost_usd            double precision DEFAULT 0,  -- NULL: litellm has no price for the model
    latency_ms          double precision NOT NULL,
    error               text,
    created_at          timestamptz NOT NULL DEFAULT now(),
    node_id             text  -- the Ray node whose gateway made the call (one gateway per node)
);
CREATE INDEX model_calls_run ON model_calls (run_id);

-- The per-tree shared sandbox. Claims and releases decide under this row's lock, then build
-- (creating) or remove (releasing) the sandbox with no transaction open (sandbox_leases.py).
CREATE TABLE sandbox_leases (
    tree_id         uuid PRIMARY KEY REFERENCES trees (tree_id),
    backend         text NOT NULL,
    handle          text,                    -- container id or local sandbox dir
    state           text NOT NULL CHECK (state IN ('active', 'creating', 'releasing', 'released')),
    last_used_at    timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),  -- when the state began
    node_id         text,        -- the Ray node holding the sandbox and its workdir (actors/sandbox_hosts.py)
    workdir_lost_at timestamptz  -- when a command last found that node gone and moved the tree to a new one
);
-- The address of every Ray node that held sandboxes: a node's id is new with every start of Ray, so
-- a lease naming a node of an earlier life of the cluster is followed to the live node of the same
-- machine, whose disk still holds the workdir (actors/sandbox_hosts.py).
CREATE TABLE ray_nodes (
    node_id     text PRIMARY KEY,
    address     text NOT NULL,
    seen_at     timestamptz NOT NULL DEFAULT now()
);
-- The sandboxes made or being made, least recently used first (the idle sweep, a full engine, a
-- scope's count), without reading every tree's lease.
CREATE INDEX sandbox_leases_held ON sandbox_leases (last_used_at) WHERE state IN ('active', 'creating');
-- The sweeps' releases and lost nodes: the leases not released, not one row per tree that ever had one.
CREATE INDEX sandbox_leases_unreleased ON sandbox_leases (state) WHERE state <> 'released';
-- The commands killed by id (sandbox/manager.py kill_command), so that a start of one still on its
-- way never runs, whether or not the tree had a sandbox to leave a tombstone in at the kill (it
-- was being made, or released). Checked after each claim, before the command starts.
CREATE TABLE killed_commands (
    tree_id     uuid NOT NULL REFERENCES trees (tree_id),
    command_id  text NOT NULL,
    killed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tree_id, command_id)
);
-- Which members of a tree were told that its workdir was lost: each member from before the loss
-- is told once, in the commit of the tool result that tells it (actors/sandbox_tools.py).
CREATE TABLE workdir_losses_told (
    session_id  uuid NOT NULL REFERENCES sessions (session_id),
    lost_at     timestamptz NOT NULL,
    PRIMARY KEY (session_id, lost_at)
);

-- Trees whose live model text someone watches (an API stream that asked for deltas). The
-- ModelGateway streams a model call only while its tree is watched here: an unwatched call
-- is not streamed at all. Watchers refresh their row while connected; a row past its time is
-- ignored, and the sweeper deletes it.
CREATE TABLE stream_watchers (
    tree_id         uuid PRIMARY KEY REFERENCES trees (tree_id),
    watched_until   timestamptz NOT NULL
);

-- Scheduled inputs: each due time of a schedule submits one input to its session, exactly once
-- (schedule_firings' key), whatever the number of sweepers and restarts.
CREATE TABLE schedules (
    schedule_id         uuid PRIMARY KEY,
    user_id             text NOT NULL,
    app_id              text NOT NULL,
    session_id          uuid NOT NULL,
    cron                text,
    interval_seconds    double precision CHECK (interval_seconds > 0),
    input_text          text NOT NULL CHECK (length(input_text) <= 100000),
    -- What a schedule does about due times missed while nothing ran: fire once for them (once),
    -- fire each of them (all), or fire none of them (skip).
    catch_up            text NOT NULL DEFAULT 'once' CHECK (catch_up IN ('once', 'all', 'skip')),
    next_due_at         timestamptz NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    deleted_at          timestamptz,
    CONSTRAINT schedules_one_rule CHECK ((cron IS NULL) <> (interval_seconds IS NULL)),
    FOREIGN KEY (session_id, user_id, app_id) REFERENCES sessions (session_id, user_id, app_id)
);
CREATE INDEX schedules_due ON schedules (next_due_at) WHERE deleted_at IS NULL;
CREATE INDEX schedules_session ON schedules (session_id) WHERE deleted_at IS NULL;
-- What one scope holds of each kind with a quota, counted at each create (persistence/quotas.py).
CREATE INDEX schedules_scope ON schedules (user_id, app_id) WHERE deleted_at IS NULL;
CREATE TABLE schedule_firings (
    schedule_id     uuid NOT NULL REFERENCES schedules (schedule_id),
    due_at          timestamptz NOT NULL,
    input_id        uuid REFERENCES inputs (input_id),
    error           text,
    fired_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule_id, due_at)
);
-- The inputs a schedule gave, latest first: how many of them still wait is read at each firing.
CREATE INDEX schedule_firings_inputs ON schedule_firings (schedule_id, due_at DESC) WHERE input_id IS NOT NULL;
-- How many of a schedule's latest inputs (up to up_to) still wait in its session's queue. Inputs
-- are taken in FIFO, so a schedule's waiting inputs are its latest (persistence/schedules.py).
CREATE FUNCTION canopy_schedule_inputs_waiting(of_schedule uuid, up_to int) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT count(*)
    FROM (SELECT f.input_id FROM schedule_firings f
          WHERE f.schedule_id = of_schedule AND f.input_id IS NOT NULL
          ORDER BY f.due_at DESC LIMIT up_to) latest
    JOIN inputs i ON i.input_id = latest.input_id
    WHERE i.status = 'pending'
$$;

-- Counters of things that happen (persistence/metrics.py): one row per metric and label set, so
-- the table stays as small as the bounded label sets. Each process adds its gathered counts
-- about once a second; a scrape reads the rows as they are.
CREATE TABLE metric_counters (
    name    text NOT NULL,
    labels  jsonb NOT NULL DEFAULT '{}',
    value   double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (name, labels)
);
