-- Which members of a tree were told that its workdir was lost: each member from before the loss
-- is told once, in the commit of the tool result that tells it (actors/sandbox_tools.py).
CREATE TABLE workdir_losses_told (
    session_id  uuid NOT NULL REFERENCES sessions (session_id),
    lost_at     timestamptz NOT NULL,
    PRIMARY KEY (session_id, lost_at)
);
