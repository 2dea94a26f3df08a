-- Releases and creations whose process died (releasing or creating for longer than the bound): the
-- sweep finishes them, so that a tree nobody claims again neither stays releasing (which holds up
-- archiving it) nor keeps a place of its scope's sandboxes as creating.
SELECT tree_id
FROM sandbox_leases
WHERE state IN ('releasing', 'creating')
  AND updated_at < now() - make_interval(secs => %(stale_seconds)s)
  AND (%(node_id)s::text IS NULL OR node_id IS NULL OR node_id = %(node_id)s)
ORDER BY updated_at
LIMIT %(limit)s
