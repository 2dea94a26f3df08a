-- The timeline's "what changed since" read expands only a member's Turns still open or ended after
-- a moment; by turns_session it read every Turn the member ever ran to find them. An open Turn
-- (no end) sorts as the end of time, so that read is one range of this index per member.
CREATE INDEX turns_ended ON turns (session_id, (coalesce(ended_at, 'infinity'::timestamptz)));
