-- The server's PostgreSQL version, as it spells it.
SHOW server_version
