-- The live schedules of one (user, app) (ended ones are deleted): quotas.check_room.
SELECT count(*) AS held FROM schedules WHERE user_id = %(user_id)s AND app_id = %(app_id)s AND deleted_at IS NULL
