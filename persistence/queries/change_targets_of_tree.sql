-- Whom a change to every member of a tree concerns (Stop all ends the Turns of any of them): the
-- tree, and the open waits that watch any member, from this tree or another (found as
-- change_targets.sql finds them).
SELECT ARRAY[%(tree_id)s::uuid] AS tree_ids,
       ARRAY(SELECT DISTINCT t.wait_id FROM sessions s JOIN wait_targets t ON t.session_id = s.session_id
             WHERE s.tree_id = %(tree_id)s AND t.open
               AND (SELECT w.status FROM waits w WHERE w.wait_id = t.wait_id) = 'open') AS wait_ids
