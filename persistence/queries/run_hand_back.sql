-- A Run that its incarnation hands back between two model steps: still running and holding its
-- slot, owned by nobody, so the session's next incarnation acquires it and goes on from the
-- committed history. Fenced like every write of a Run; the lease is the time the Run has to be
-- acquired again before the sweep recovers it as abandoned.
UPDATE runs SET owner = NULL, lease_expires_at = now() + make_interval(secs => %(lease)s)
WHERE run_id = %(run_id)s AND owner = %(owner)s AND status = 'running' AND lease_expires_at > now()
