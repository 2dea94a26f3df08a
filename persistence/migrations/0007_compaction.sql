-- Durable context compaction: summaries stand for older messages in what the model is sent.
CREATE INDEX thread_messages_compactions ON thread_messages (session_id, id) WHERE origin->>'kind' = 'compaction';
ALTER TABLE sessions ADD COLUMN compact_requested boolean NOT NULL DEFAULT false;
ALTER TABLE agents ADD COLUMN compact_at_tokens integer CHECK (compact_at_tokens >= 1000);
