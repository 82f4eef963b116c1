-- Drop what is kept of up to two lock names whose slot 0 has expired
-- (fence_ttl after their last acquisition) and that nobody holds or waits
-- for any more: their slots and lapsed waiters. A name still in use gets
-- its expiry moved on instead. Names another call has locked, and names
-- with a renewal in flight, are skipped: this never waits for a row lock
-- (its caller holds one of its own name's).
-- Reads and writes lock_holders, lock_waiters. Called by lock_acquire_v1 in
-- its one statement, and by the client's fast path after a take, when a
-- name has expired:
-- sent twice, it only finds less to do.
CREATE OR REPLACE FUNCTION lock_sweep_v1(p_now timestamptz, p_ttl interval)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r      record;
    v_all  integer;
    v_held integer;
BEGIN
    FOR r IN SELECT name FROM lock_holders WHERE slot = 0 AND expires < p_now
              ORDER BY expires LIMIT 2 FOR UPDATE SKIP LOCKED LOOP
        -- A hold that looks over, its renewal in flight (its row locked):
        -- the name is in use. The others are locked, so none is renewed
        -- after the check below.
        SELECT count(*) INTO v_all FROM lock_holders
         WHERE name = r.name AND owner <> '' AND lease_end <= p_now;
        SELECT count(*) INTO v_held FROM (
            SELECT 1 FROM lock_holders
             WHERE name = r.name AND owner <> '' AND lease_end <= p_now
               FOR NO KEY UPDATE SKIP LOCKED) x;
        CONTINUE WHEN v_held < v_all;
        IF EXISTS (SELECT 1 FROM lock_holders WHERE name = r.name AND lease_end > p_now)
           OR EXISTS (SELECT 1 FROM lock_waiters WHERE name = r.name AND until > p_now) THEN
            UPDATE lock_holders SET expires = p_now + p_ttl WHERE name = r.name AND slot = 0;
        ELSE
            DELETE FROM lock_holders WHERE name = r.name;
            DELETE FROM lock_waiters WHERE name = r.name;
        END IF;
    END LOOP;
END
$$;
