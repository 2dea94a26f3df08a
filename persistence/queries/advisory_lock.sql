-- A transaction-scoped advisory lock, held until commit or rollback. Taken in a statement of its
-- own: a statement's snapshot is taken when it starts, so a count in the statement that waited
-- for the lock would miss what the previous holder committed meanwhile.
SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0))
