from persistence.db import Database


async def test_schema_version(db: Database) -> None:
    async with db.tx() as conn:
        cur = await conn.execute("SELECT max(version) AS v FROM schema_version")
        row = await cur.fetchone()
    assert row is not None and row["v"] == 1
