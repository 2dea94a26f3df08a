-- A closed stream frees its place at once.
DELETE FROM open_streams WHERE stream_id = %(stream_id)s
