-- An agent may name its own endpoint and the NAME of the key it uses (never a key).
ALTER TABLE agents ADD COLUMN api_base text CHECK (api_base ~ '^https?://[^\s*]+$' AND length(api_base) <= 2000);
ALTER TABLE agents ADD COLUMN api_key_ref text CHECK (api_key_ref ~ '^[A-Z][A-Z0-9_]{0,63}$');
