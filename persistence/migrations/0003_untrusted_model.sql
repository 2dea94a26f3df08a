-- Limits and approvals for untrusted model output: tree lineages (root-mode spawns), a Turn's
-- approval mode, and sandbox command receipts that exist before the command's outcome.
ALTER TABLE trees ADD COLUMN lineage_id uuid;
UPDATE trees SET lineage_id = tree_id;
ALTER TABLE trees ALTER COLUMN lineage_id SET NOT NULL;
ALTER TABLE trees ADD COLUMN spawned_by_tree_id uuid;
ALTER TABLE trees ADD CONSTRAINT trees_lineage_fk FOREIGN KEY (lineage_id) REFERENCES trees (tree_id);
ALTER TABLE trees ADD CONSTRAINT trees_spawned_by_fk FOREIGN KEY (spawned_by_tree_id) REFERENCES trees (tree_id);
CREATE INDEX trees_lineage ON trees (lineage_id);

ALTER TABLE turns ADD COLUMN approval_mode text NOT NULL DEFAULT 'auto';
ALTER TABLE turns ADD CONSTRAINT turns_approval_mode_check CHECK (approval_mode IN ('auto', 'ask'));
-- Open Turns of ask sessions keep asking after the upgrade.
UPDATE turns t SET approval_mode = 'ask'
FROM sessions s WHERE s.session_id = t.session_id AND s.agent_config->>'approval_mode' = 'ask';

ALTER TABLE tool_receipts ALTER COLUMN result DROP NOT NULL;
ALTER TABLE tool_receipts ADD COLUMN state text NOT NULL DEFAULT 'done';
ALTER TABLE tool_receipts ADD CONSTRAINT tool_receipts_state_check CHECK (state IN ('started', 'done'));
ALTER TABLE tool_receipts ADD CONSTRAINT tool_receipts_result_when_done
    CHECK ((state = 'done') = (result IS NOT NULL));
