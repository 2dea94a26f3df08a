-- The conversations (trees, archived ones aside) of one (user, app): quotas.check_room.
SELECT count(*) AS held FROM trees WHERE user_id = %(user_id)s AND app_id = %(app_id)s AND NOT archived
