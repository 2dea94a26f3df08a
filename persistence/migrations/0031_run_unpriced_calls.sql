-- A member's usage says how many of its calls had no price, as its tree's does (0028).
ALTER TABLE runs ADD COLUMN unpriced_calls integer NOT NULL DEFAULT 0;
