-- How many trees a budget has stopped now: the stopped trees (the partial index trees_stopped, the
-- few rows in that state, as every gauge of metric_gauges.sql reads them) whose reason is a budget.
SELECT count(*) AS n FROM trees WHERE stopped AND stop_reason = 'budget_exceeded'
