-- One acquire attempt of one owner: take the lock (status 1, its token),
-- find it already this owner's (status 2, the same token: an earlier send of
-- this attempt ran, or a release handed it over), or find it busy (status
-- 0, the lease left in ms; with p_stay_ms, this owner now waits in the
-- name's queue until then, and queued_at is the server's clock in ms).
-- p_kind 'w' a writer, 'r' a reader, 's' a permit of a semaphore of
-- p_permits; a lock and a semaphore on one name are busy to each other and
-- do not queue behind each other. Readers share a hold unless a live writer
-- waits; a permit is admitted while fewer than p_permits hold the name and
-- no live waiter is queued before it.
-- Reads and writes lock_fences (the name's row, locked first: calls on one
-- name run one after the other), lock_holders and lock_waiters; sweeps two
-- expired names at most. Leases end by the database's clock. Safe to send
-- twice: the owner id is unique per acquisition, and a second send finds
-- its hold (status 2) or its queue entry (kept in place, its stay renewed).
CREATE OR REPLACE FUNCTION lock_acquire_v1(
    p_name text, p_owner text, p_kind "char", p_permits integer, p_lease_ms bigint,
    p_stay_ms bigint, p_rejoin boolean, p_fence boolean, p_channel text, p_fence_ttl_ms bigint,
    OUT status integer, OUT token bigint, OUT ttl_ms bigint, OUT queued_at bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_now     timestamptz := clock_timestamp();
    v_us      bigint := (extract(epoch FROM v_now) * 1000000)::bigint;
    v_ttl     interval := p_fence_ttl_ms * interval '1 millisecond';
    v_lease   interval := p_lease_ms * interval '1 millisecond';
    v_bump    boolean := p_fence AND p_kind <> 'r';
    v_last    bigint;
    v_writers integer;
    v_readers integer;
    v_permits integer;
    v_read    bigint;
    v_longest timestamptz;
    v_first   timestamptz;
    v_seq     bigint;
    v_free    boolean;
BEGIN
    status := 0;
    token := 0;
    queued_at := 0;
    INSERT INTO lock_fences AS f (name, last, expires)
    VALUES (p_name, CASE WHEN v_bump THEN v_us ELSE 0 END, v_now + v_ttl * 1.5)
    ON CONFLICT (name) DO UPDATE
       SET last = CASE WHEN v_bump THEN greatest(f.last + 1, v_us) ELSE f.last END,
           expires = CASE WHEN f.expires < v_now + v_ttl THEN v_now + v_ttl * 1.5 ELSE f.expires END
    RETURNING f.last INTO v_last;

    UPDATE lock_holders SET lease_end = v_now + v_lease
     WHERE name = p_name AND owner = p_owner AND NOT kept AND lease_end > v_now
    RETURNING fence INTO token;
    IF FOUND THEN
        status := 2;
        IF p_rejoin OR p_stay_ms IS NOT NULL THEN
            DELETE FROM lock_waiters WHERE name = p_name AND owner = p_owner;
        END IF;
        RETURN;
    END IF;
    token := 0;

    DELETE FROM lock_holders WHERE name = p_name AND lease_end <= v_now;
    SELECT count(*) FILTER (WHERE kind = 'w'), count(*) FILTER (WHERE kind = 'r'),
           count(*) FILTER (WHERE kind = 's'), coalesce(max(fence) FILTER (WHERE kind = 'r'), 0),
           max(lease_end), min(lease_end)
      INTO v_writers, v_readers, v_permits, v_read, v_longest, v_first
      FROM lock_holders WHERE name = p_name;

    IF p_kind = 'w' THEN
        v_free := v_writers + v_readers + v_permits = 0;
    ELSIF p_kind = 'r' THEN
        v_free := v_writers + v_permits = 0 AND (v_readers = 0 OR NOT EXISTS (
            SELECT 1 FROM lock_waiters
             WHERE name = p_name AND kind = 'w' AND until > v_now AND owner <> p_owner));
    ELSE
        SELECT seq INTO v_seq FROM lock_waiters WHERE name = p_name AND owner = p_owner;
        v_free := v_writers + v_readers = 0 AND v_permits < p_permits AND NOT EXISTS (
            SELECT 1 FROM lock_waiters
             WHERE name = p_name AND until > v_now AND owner <> p_owner
               AND (v_seq IS NULL OR seq < v_seq));
    END IF;

    IF v_free THEN
        IF p_fence THEN
            IF p_kind <> 'r' THEN
                token := v_last;
            ELSIF v_read > 0 THEN
                token := v_read;
            ELSE
                UPDATE lock_fences SET last = greatest(last + 1, v_us)
                 WHERE name = p_name RETURNING last INTO token;
            END IF;
        END IF;
        INSERT INTO lock_holders (name, owner, kind, lease_end, fence)
        VALUES (p_name, p_owner, p_kind, v_now + v_lease, token)
        ON CONFLICT (name, owner) DO UPDATE
           SET kind = EXCLUDED.kind, lease_end = EXCLUDED.lease_end, fence = EXCLUDED.fence,
               kept = false, handed_by = NULL;
        IF p_rejoin OR p_stay_ms IS NOT NULL THEN
            DELETE FROM lock_waiters WHERE name = p_name AND owner = p_owner;
        END IF;
        status := 1;
        PERFORM lock_sweep_v1(v_now, v_ttl);
        RETURN;
    END IF;

    IF p_kind = 's' THEN
        ttl_ms := (extract(epoch FROM v_first - v_now) * 1000)::bigint;
    ELSE
        ttl_ms := (extract(epoch FROM v_longest - v_now) * 1000)::bigint;
    END IF;
    IF p_stay_ms IS NULL OR (p_kind = 's' AND v_writers + v_readers > 0)
       OR (p_kind <> 's' AND v_permits > 0) THEN
        RETURN;
    END IF;
    INSERT INTO lock_waiters AS w (name, owner, kind, permits, lease_ms, fenced, channel, until)
    VALUES (p_name, p_owner, p_kind, p_permits, p_lease_ms, p_fence, p_channel,
            v_now + p_stay_ms * interval '1 millisecond')
    ON CONFLICT (name, owner) DO UPDATE SET until = EXCLUDED.until, channel = EXCLUDED.channel;
    queued_at := (extract(epoch FROM v_now) * 1000)::bigint;
    PERFORM lock_sweep_v1(v_now, v_ttl);
END
$$;
