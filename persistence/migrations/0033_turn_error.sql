-- A Turn's Result says why it ended: its own error, not its result Run's (a Run that parked, or whose
-- owner died, keeps its own account of that).
ALTER TABLE turns ADD COLUMN error text;
