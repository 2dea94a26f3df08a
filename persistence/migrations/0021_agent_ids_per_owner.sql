-- An agent id names an agent among its owner's, and a shared one among the app's shared agents:
-- ids unique in the whole app let a user learn, by a refused create, the id of a private agent.
ALTER TABLE agents DROP CONSTRAINT agents_pkey;
ALTER TABLE agents ADD PRIMARY KEY (app_id, owner_user_id, agent_id);
CREATE UNIQUE INDEX agents_shared_id ON agents (app_id, agent_id) WHERE shared;
DROP INDEX agents_owner;
