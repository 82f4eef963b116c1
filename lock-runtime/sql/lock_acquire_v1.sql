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
-- Reads and writes lock_holders (the name's slot 0, locked first: calls on
-- one name run one after the other; a hold takes a free slot, after any
-- renewal in flight of a lapsed one) and lock_waiters; keeps slot 0's busy
-- flag (lock_settle_v1); sweeps two expired names at most, and only when
-- one has expired. The client's fast path (a free name, not busy, a
-- writer) runs before this, in the same statement, and calls this only
-- when it took nothing. Leases end by the database's clock. Safe to send
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
    v_mine    boolean;
    v_slot    integer;
    v_next    integer;
    v_busy    boolean;
BEGIN
    status := 0;
    token := 0;
    queued_at := 0;
    INSERT INTO lock_holders AS h (name, slot, owner, kind, lease_end, fence, last, expires, busy)
    VALUES (p_name, 0, '', 'w', '-infinity', 0, CASE WHEN v_bump THEN v_us ELSE 0 END,
            v_now + v_ttl * 1.5, false)
    ON CONFLICT (name, slot) DO UPDATE
       SET last = CASE WHEN v_bump THEN greatest(h.last + 1, v_us) ELSE h.last END,
           expires = CASE WHEN h.expires < v_now + v_ttl THEN v_now + v_ttl * 1.5 ELSE h.expires END
    RETURNING h.last, h.busy INTO v_last, v_busy;

    -- A renewal in flight of a hold whose lease looks over: wait for it,
    -- so that the read below sees its new lease, and hold the row, so that
    -- a renewal after this finds the lease over (lock_renew_v1 checks
    -- again once it holds the row). This owner's own slot (a resend) is
    -- locked with them, in slot order as renewals lock, not after them.
    PERFORM 1 FROM lock_holders
     WHERE name = p_name AND (owner = p_owner OR (owner <> '' AND lease_end <= v_now))
     ORDER BY slot
       FOR NO KEY UPDATE;

    -- One read of the name's slots: the live holds by kind, whether this
    -- owner holds it already, and the slot a new hold takes (this owner's,
    -- else the first one free, else a new one).
    SELECT count(*) FILTER (WHERE kind = 'w' AND lease_end > v_now),
           count(*) FILTER (WHERE kind = 'r' AND lease_end > v_now),
           count(*) FILTER (WHERE kind = 's' AND lease_end > v_now),
           coalesce(max(fence) FILTER (WHERE kind = 'r' AND lease_end > v_now), 0),
           max(lease_end) FILTER (WHERE lease_end > v_now),
           min(lease_end) FILTER (WHERE lease_end > v_now),
           bool_or(owner = p_owner AND NOT kept AND lease_end > v_now),
           coalesce(min(slot) FILTER (WHERE owner = p_owner),
                    min(slot) FILTER (WHERE lease_end <= v_now)),
           coalesce(max(slot) + 1, 0)
      INTO v_writers, v_readers, v_permits, v_read, v_longest, v_first, v_mine, v_slot, v_next
      FROM lock_holders WHERE name = p_name;

    IF v_mine THEN
        UPDATE lock_holders SET lease_end = v_now + v_lease
         WHERE name = p_name AND slot = v_slot AND NOT kept AND lease_end > v_now
        RETURNING fence INTO token;
        IF FOUND THEN
            status := 2;
            IF p_rejoin OR p_stay_ms IS NOT NULL THEN
                DELETE FROM lock_waiters WHERE name = p_name AND owner = p_owner;
            END IF;
            IF v_busy THEN
                PERFORM lock_settle_v1(p_name, v_now);
            END IF;
            RETURN;
        END IF;
        token := 0;
    END IF;
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
                UPDATE lock_holders SET last = greatest(last + 1, v_us)
                 WHERE name = p_name AND slot = 0 RETURNING last INTO token;
            END IF;
        END IF;
        IF v_slot IS NULL THEN
            INSERT INTO lock_holders (name, slot, owner, kind, lease_end, fence)
            VALUES (p_name, v_next, p_owner, p_kind, v_now + v_lease, token);
        ELSE
            UPDATE lock_holders
               SET owner = p_owner, kind = p_kind, lease_end = v_now + v_lease, fence = token,
                   kept = false, handed_by = NULL
             WHERE name = p_name AND slot = v_slot AND (owner = p_owner OR lease_end <= v_now);
            IF NOT FOUND THEN
                -- The slot came back to life since the read: never take it.
                -- Sent again, the call reads the name afresh.
                RAISE EXCEPTION 'lock slot % of % taken meanwhile', v_slot, p_name
                      USING ERRCODE = 'serialization_failure';
            END IF;
        END IF;
        IF p_rejoin OR p_stay_ms IS NOT NULL THEN
            DELETE FROM lock_waiters WHERE name = p_name AND owner = p_owner;
        END IF;
        IF v_busy OR v_slot IS DISTINCT FROM 0 THEN
            PERFORM lock_settle_v1(p_name, v_now);
        END IF;
        status := 1;
        IF EXISTS (SELECT 1 FROM lock_holders WHERE slot = 0 AND expires < v_now) THEN
            PERFORM lock_sweep_v1(v_now, v_ttl);
        END IF;
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
    IF NOT v_busy THEN
        UPDATE lock_holders SET busy = true WHERE name = p_name AND slot = 0;
    END IF;
    queued_at := (extract(epoch FROM v_now) * 1000)::bigint;
    IF EXISTS (SELECT 1 FROM lock_holders WHERE slot = 0 AND expires < v_now) THEN
        PERFORM lock_sweep_v1(v_now, v_ttl);
    END IF;
END
$$;
