-- The cheapest round trip: the database answers.
SELECT 1
