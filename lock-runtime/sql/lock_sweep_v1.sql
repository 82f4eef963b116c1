-- Drop what is kept of up to two lock names whose fence row has expired
-- (fence_ttl after their last acquisition) and that nobody holds or waits
-- for any more: their fence row, their slots and lapsed waiters. A name
-- still in use gets its fence row's expiry moved on instead. Rows another
-- call has locked are skipped, so this never waits.
-- Reads and writes lock_fences, lock_holders, lock_waiters. Called by
-- lock_acquire_v1 in its one statement: sent twice, it only finds less to do.
CREATE OR REPLACE FUNCTION lock_sweep_v1(p_now timestamptz, p_ttl interval)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT name FROM lock_fences WHERE expires < p_now
              ORDER BY expires LIMIT 2 FOR UPDATE SKIP LOCKED LOOP
        -- A renewal in flight of a hold that looks over is waited for.
        PERFORM 1 FROM lock_holders
         WHERE name = r.name AND owner <> '' AND lease_end <= p_now
           FOR NO KEY UPDATE;
        IF EXISTS (SELECT 1 FROM lock_holders WHERE name = r.name AND lease_end > p_now)
           OR EXISTS (SELECT 1 FROM lock_waiters WHERE name = r.name AND until > p_now) THEN
            UPDATE lock_fences SET expires = p_now + p_ttl WHERE name = r.name;
        ELSE
            DELETE FROM lock_holders WHERE name = r.name;
            DELETE FROM lock_waiters WHERE name = r.name;
            DELETE FROM lock_fences WHERE name = r.name;
        END IF;
    END LOOP;
END
$$;
