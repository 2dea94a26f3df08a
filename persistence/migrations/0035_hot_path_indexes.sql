-- Reads on hot paths that cost a session's or tree's whole history, each now one range of what it
-- looks for.
--
-- The waits watching a session: a change (every Turn's end, park, tool step) looked up every wait
-- that ever watched it, each then checked open in waits. A target row says whether its wait is open.
ALTER TABLE wait_targets ADD COLUMN open boolean NOT NULL DEFAULT true;
UPDATE wait_targets t SET open = false FROM waits w WHERE w.wait_id = t.wait_id AND w.status <> 'open';
DROP INDEX wait_targets_session;
CREATE INDEX wait_targets_open ON wait_targets (session_id) WHERE open;
-- A session's own interventions (on its children: the event goes to the parent) were found among
-- every event of the session.
CREATE INDEX events_interventions_session ON events (session_id, cursor) WHERE kind = 'user_intervention';
-- What wait_sessions counts as a target's update (persistence/events.py SESSION_UPDATE_KINDS) was
-- found among every event of the target after the wait's cursor: its messages and Runs too.
CREATE INDEX events_session_updates ON events (session_id, cursor)
    WHERE kind IN ('turn_completed', 'turn_failed', 'turn_cancelled', 'waiting_approval', 'waiting_answer',
                   'coop_message');
