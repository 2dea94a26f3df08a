-- Whether a project holds a tree, asked when it is deleted (projects.delete_project): never a scan of all trees.
CREATE INDEX trees_project ON trees (project_id);
