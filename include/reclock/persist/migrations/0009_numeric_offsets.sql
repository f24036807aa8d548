-- Offsets wide enough for every source kind's FromTime mapped onto (partition, offset)
-- (reclock.sources.base): an integral numeric holds integers of any size exactly, so Kinesis's sequence
-- numbers (56 digits as AWS issues them, up to 129 by the API's pattern) fit beside Kafka's offsets and
-- Postgres's LSNs, which bigint held. A fraction is refused (scale 0).
-- The progress views over the column are dropped and created again with the same definitions (a column
-- a view uses cannot change its type); reclock.progress_as_of returns the wider type.
DO $$
DECLARE
    v record;
    names text[] := '{}';
    bodies text[] := '{}';
BEGIN
    FOR v IN
        SELECT DISTINCT format('%I.%I', n.nspname, c.relname) AS name, pg_get_viewdef(c.oid) AS body
        FROM pg_depend d
        JOIN pg_rewrite r ON r.oid = d.objid
        JOIN pg_class c ON c.oid = r.ev_class
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE d.classid = 'pg_rewrite'::regclass AND d.refobjid = 'reclock.remap_offsets'::regclass
          AND c.relkind = 'v'
    LOOP
        names := names || v.name;
        bodies := bodies || v.body;
        EXECUTE format('DROP VIEW %s', v.name);
    END LOOP;
    ALTER TABLE reclock.remap_offsets ALTER COLUMN "offset" TYPE numeric,
        ADD CONSTRAINT remap_offsets_offset_integral CHECK (scale("offset") = 0);
    FOR i IN 1 .. coalesce(array_length(names, 1), 0) LOOP
        EXECUTE format('CREATE VIEW %s AS %s', names[i], bodies[i]);
    END LOOP;
END $$;

DROP FUNCTION reclock.progress_as_of(text, bigint);
CREATE FUNCTION reclock.progress_as_of(src text, t bigint)
RETURNS TABLE (partition integer, "offset" numeric)
LANGUAGE sql STABLE AS $$
    SELECT o.partition, o."offset"
    FROM reclock.remap_offsets o
    WHERE o.source = src
      AND o.ts = (SELECT max(b.ts) FROM reclock.remap_bindings b WHERE b.source = src AND b.ts <= t)
    ORDER BY o.partition
$$;
