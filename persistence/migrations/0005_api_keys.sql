-- API keys get an id operators can name, an optional expiry, a last use and a revocation;
-- revocations notify the API replicas; open event streams are counted per key.
ALTER TABLE api_keys ADD COLUMN key_id uuid NOT NULL DEFAULT gen_random_uuid() UNIQUE;
ALTER TABLE api_keys ADD COLUMN expires_at timestamptz;
ALTER TABLE api_keys ADD COLUMN last_used_at timestamptz;
ALTER TABLE api_keys ADD COLUMN revoked_at timestamptz;

CREATE FUNCTION canopy_notify_key() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('canopy_keys', OLD.key_id::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER api_keys_notify AFTER UPDATE OF revoked_at, expires_at OR DELETE ON api_keys
    FOR EACH ROW EXECUTE FUNCTION canopy_notify_key();

CREATE TABLE open_streams (
    stream_id   uuid PRIMARY KEY,
    key_id      uuid NOT NULL REFERENCES api_keys (key_id) ON DELETE CASCADE,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX open_streams_key ON open_streams (key_id, expires_at);
