-- The sessions with a Turn that asked (turn_insert.sql): each new Turn of theirs asks too.
CREATE INDEX turns_asked ON turns (session_id) WHERE approval_mode = 'ask';
