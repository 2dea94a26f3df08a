-- A kill that found no sandbox to leave its tombstone in (the tree's first sandbox being made, or
-- one being released) let the command start afterwards: the kill is now kept in the database.
CREATE TABLE killed_commands (
    tree_id     uuid NOT NULL REFERENCES trees (tree_id),
    command_id  text NOT NULL,
    killed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tree_id, command_id)
);
