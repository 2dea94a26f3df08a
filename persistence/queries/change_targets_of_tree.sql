-- Whom a change to every member of a tree concerns (Stop all ends the Turns of any of them): the
-- tree, and the open waits that watch any member, from this tree or another.
SELECT ARRAY[%(tree_id)s::uuid] AS tree_ids,
       ARRAY(SELECT DISTINCT w.wait_id FROM sessions s JOIN wait_targets t ON t.session_id = s.session_id
             JOIN waits w ON w.wait_id = t.wait_id
             WHERE s.tree_id = %(tree_id)s AND w.status = 'open') AS wait_ids
