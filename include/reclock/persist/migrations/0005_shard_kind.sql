-- A shard's kind, registered with it: readers keep a shard's own columns by its kind, never by its name
-- (a source named like "login_errors" has a data shard whose name ends in "_errors").
ALTER TABLE reclock.shards ADD COLUMN kind text NOT NULL DEFAULT 'data' CHECK (kind IN ('data', 'errors'));
-- shards registered before: a source's output 1 is its error collection
UPDATE reclock.shards SET kind = 'errors' WHERE source IS NOT NULL AND output = 1;
