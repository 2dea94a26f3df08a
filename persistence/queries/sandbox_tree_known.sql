-- Is this tree one of this database's? A sandbox of an unknown tree belongs to another deployment.
SELECT EXISTS (SELECT 1 FROM trees WHERE tree_id = %(tree_id)s) AS known
