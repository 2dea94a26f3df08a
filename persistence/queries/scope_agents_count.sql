-- The agents one user owns in one app (shared or not): quotas.check_room.
SELECT count(*) AS held FROM agents WHERE owner_user_id = %(user_id)s AND app_id = %(app_id)s
