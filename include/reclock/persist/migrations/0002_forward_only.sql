-- Defence in depth for *definite*: whatever code runs against this schema, a shard's or a remap
-- collection's upper and since only ever move forward, and a part's timestamps lie inside its batch's
-- description [lower, upper).

CREATE FUNCTION reclock.forbid_going_backwards() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    who text := coalesce(to_jsonb(OLD) ->> 'id', to_jsonb(OLD) ->> 'source');
BEGIN
    IF NEW.upper < OLD.upper THEN
        RAISE EXCEPTION '%: upper may not go backwards (from % to %)', who, OLD.upper, NEW.upper
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.since < OLD.since THEN
        RAISE EXCEPTION '%: since may not go backwards (from % to %)', who, OLD.since, NEW.since
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER shards_forward_only
    BEFORE UPDATE OF upper, since ON reclock.shards
    FOR EACH ROW EXECUTE FUNCTION reclock.forbid_going_backwards();

CREATE TRIGGER remap_collections_forward_only
    BEFORE UPDATE OF upper, since ON reclock.remap_collections
    FOR EACH ROW EXECUTE FUNCTION reclock.forbid_going_backwards();

ALTER TABLE reclock.shard_batches
    ADD CONSTRAINT shard_batches_ts_inside_description CHECK (
        (min_ts IS NULL OR (min_ts >= lower AND min_ts < upper))
        AND (max_ts IS NULL OR (max_ts >= lower AND max_ts < upper))
        AND (min_ts IS NULL OR max_ts IS NULL OR min_ts <= max_ts));

-- GC asks "is any batch referencing a path under this prefix?"; C-ordered so a prefix range can use it
CREATE INDEX shard_batches_path_prefix ON reclock.shard_batches (path COLLATE "C");
