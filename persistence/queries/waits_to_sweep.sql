-- The open waits a sweep round re-evaluates: every one whose deadline has passed, soonest first, and
-- the next page of the others by id after the last round's (the caller wraps around). A page of the
-- soonest deadlines alone would leave a wait without one (a question to a human) unswept for good
-- once a page's worth of others is open.
(SELECT wait_id, true AS expired FROM waits
 WHERE status = 'open' AND deadline <= now() ORDER BY deadline LIMIT %(limit)s)
UNION ALL
(SELECT wait_id, false AS expired FROM waits
 WHERE status = 'open' AND wait_id > %(after)s ORDER BY wait_id LIMIT %(limit)s)
