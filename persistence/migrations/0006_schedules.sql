-- Scheduled inputs.
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
CREATE TABLE schedule_firings (
    schedule_id     uuid NOT NULL REFERENCES schedules (schedule_id),
    due_at          timestamptz NOT NULL,
    input_id        uuid REFERENCES inputs (input_id),
    error           text,
    fired_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule_id, due_at)
);
