-- The sandboxes made or being made, least recently used first: the idle sweep's and a full
-- engine's candidates, and a scope's count of what it holds, without reading every tree's lease.
CREATE INDEX sandbox_leases_held ON sandbox_leases (last_used_at) WHERE state IN ('active', 'creating');
