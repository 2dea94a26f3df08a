-- Whether a tree is archived, its row shared until the transaction ends: an archive (which holds
-- it for update) is waited for, so what it committed is what this reads.
SELECT archived FROM trees WHERE tree_id = %(tree_id)s FOR SHARE
