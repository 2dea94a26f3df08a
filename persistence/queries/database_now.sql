-- The database's clock (the transaction's start), which every due time is compared with.
SELECT now() AS now
