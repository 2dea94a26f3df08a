-- A Turn's replies: the timeline expands the tool calls of the Turns a read keeps, not every reply.
CREATE INDEX thread_messages_replies ON thread_messages (turn_id) WHERE role = 'assistant';
