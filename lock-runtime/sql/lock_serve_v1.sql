-- Hand a free (or read-held, or semaphore) lock to the head of its queue:
-- a writer alone; a reader with every reader queued right behind it; permits
-- in order while the semaphore has room. Each waiter served gets its hold
-- (a fresh token if it asked for one) and leaves the queue, and its client
-- is told by NOTIFY on the waiter's channel: "<owner> <token> <server ms>
-- <name>". Waiters past their stay are dropped on the way, and so are
-- waiters whose client does not listen now (lock_listeners: the process
-- died, or it has not started listening yet and asks again): nobody would
-- hear their grant, and the lock would sit idle for their lease.
-- Reads lock_listeners and pg_stat_activity; reads and writes lock_holders
-- (each waiter served takes a slot as lock_acquire_v1 does), lock_waiters
-- and the name's slot 0 (its counter), which the caller has locked; the
-- caller then settles slot 0's busy flag. Called only by lock_release_v1,
-- inside its one statement: safe to repeat, since a waiter served leaves the
-- queue and is not served twice.
-- p_from: the owner whose release hands the lock over (NULL: a forced
-- release, or a waiter leaving). Returns how many waiters it served.
CREATE OR REPLACE FUNCTION lock_serve_v1(p_name text, p_now timestamptz, p_from text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_us      bigint := (extract(epoch FROM p_now) * 1000000)::bigint;
    v_ms      bigint := (extract(epoch FROM p_now) * 1000)::bigint;
    v_writers integer;
    v_readers integer;
    v_permits integer;
    v_read    bigint;
    v_token   bigint;
    v_served  integer := 0;
    v_slot    integer;
    q         record;
BEGIN
    -- As in lock_acquire_v1: a renewal in flight of a hold whose lease
    -- looks over is waited for, and the row held.
    PERFORM 1 FROM lock_holders
     WHERE name = p_name AND owner <> '' AND lease_end <= p_now
     ORDER BY slot
       FOR NO KEY UPDATE;
    SELECT count(*) FILTER (WHERE kind = 'w'), count(*) FILTER (WHERE kind = 'r'),
           count(*) FILTER (WHERE kind = 's'), coalesce(max(fence) FILTER (WHERE kind = 'r'), 0)
      INTO v_writers, v_readers, v_permits, v_read
      FROM lock_holders WHERE name = p_name AND lease_end > p_now;
    IF v_writers > 0 THEN
        RETURN 0;
    END IF;
    FOR q IN SELECT * FROM lock_waiters WHERE name = p_name ORDER BY seq LOOP
        IF q.until <= p_now THEN
            DELETE FROM lock_waiters WHERE name = p_name AND owner = q.owner;
            CONTINUE;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM lock_listeners l, pg_stat_get_activity(l.pid) a
                        WHERE l.channel = q.channel
                          AND (a.backend_start IS NULL OR a.backend_start = l.started)) THEN
            DELETE FROM lock_waiters WHERE name = p_name AND owner = q.owner;
            CONTINUE;
        END IF;
        IF q.kind = 'w' THEN
            EXIT WHEN v_readers > 0 OR v_permits > 0 OR v_served > 0;
        ELSIF q.kind = 'r' THEN
            EXIT WHEN v_permits > 0;
        ELSE
            EXIT WHEN v_readers > 0 OR v_permits >= q.permits;
        END IF;
        v_token := 0;
        IF q.fenced THEN
            IF q.kind = 'r' AND v_read > 0 THEN
                v_token := v_read;
            ELSE
                UPDATE lock_holders SET last = greatest(last + 1, v_us)
                 WHERE name = p_name AND slot = 0 RETURNING last INTO v_token;
                IF q.kind = 'r' THEN
                    v_read := v_token;
                END IF;
            END IF;
        END IF;
        -- The waiter's own slot, else the first free one, else a new one.
        SELECT slot INTO v_slot FROM lock_holders
         WHERE name = p_name AND (owner = q.owner OR lease_end <= p_now)
         ORDER BY owner = q.owner DESC, slot LIMIT 1;
        IF FOUND THEN
            UPDATE lock_holders
               SET owner = q.owner, kind = q.kind,
                   lease_end = p_now + q.lease_ms * interval '1 millisecond', fence = v_token,
                   kept = false, handed_by = p_from
             WHERE name = p_name AND slot = v_slot
               AND (owner = q.owner OR lease_end <= p_now);
            IF NOT FOUND THEN
                RAISE EXCEPTION 'lock slot % of % taken meanwhile', v_slot, p_name
                      USING ERRCODE = 'serialization_failure';
            END IF;
        ELSE
            INSERT INTO lock_holders (name, slot, owner, kind, lease_end, fence, handed_by)
            SELECT p_name, coalesce(max(slot) + 1, 0), q.owner, q.kind,
                   p_now + q.lease_ms * interval '1 millisecond', v_token, p_from
              FROM lock_holders WHERE name = p_name;
        END IF;
        DELETE FROM lock_waiters WHERE name = p_name AND owner = q.owner;
        PERFORM pg_notify(q.channel, q.owner || ' ' || v_token || ' ' || v_ms || ' ' || p_name);
        v_served := v_served + 1;
        IF q.kind = 'w' THEN
            EXIT;
        ELSIF q.kind = 'r' THEN
            v_readers := v_readers + 1;
        ELSE
            v_permits := v_permits + 1;
        END IF;
    END LOOP;
    RETURN v_served;
END
$$;
