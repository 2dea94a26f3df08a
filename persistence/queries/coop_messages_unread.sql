-- What waits unread for a session, up to one message past the count limit (the partial index
-- coop_messages_unprocessed); octet_length reads a stored body's size without reading the body.
SELECT count(*) AS messages, coalesce(sum(octet_length(body)), 0) AS bytes
FROM (SELECT body FROM coop_messages
      WHERE receiver_session_id = %(session_id)s AND processed_at IS NULL
      LIMIT %(limit)s) unread
