-- The projects of one (user, app): quotas.check_room.
SELECT count(*) AS held FROM projects WHERE user_id = %(user_id)s AND app_id = %(app_id)s
