-- End one hold of p_owner, or take p_owner out of the queue (a waiter that
-- gives up, an attempt taken back), and serve the queue: the first live
-- waiters get the lock in this same statement and are told by NOTIFY
-- (lock_serve_v1), only when someone waits.
-- Returns 1 released (also: an earlier send of this release handed the lock
-- over), 0 absent (lapsed, removed, or released by an earlier send), -1 held
-- by others.
-- p_forced: an operator's release run as the holder: it serves the queue as
-- any release does but is not recorded as the one that handed over, so that
-- the holder's own later release finds the lock lost; p_owner may then be a
-- hold left to its min_hold ("<owner>!", as inspect shows it).
-- A release that hands nothing over commits without waiting for the WAL
-- flush (synchronous_commit off for its transaction only): losing it loses
-- no safety, only the lock's time until its lease ends.
-- Reads and writes lock_holders (the name's slot 0, locked first; the
-- hold's slot is freed; slot 0's busy flag kept, lock_settle_v1) and
-- lock_waiters. The client's fast path (slot 0 its own, not busy) runs
-- before this, in the same statement, and calls this only when it freed
-- nothing. Safe to send twice: the second send finds the hold gone (0),
-- or handed over by this owner (1).
CREATE OR REPLACE FUNCTION lock_release_v1(p_name text, p_owner text, p_forced boolean)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    v_now   timestamptz := clock_timestamp();
    v_owner text := p_owner;
    v_kept  boolean := false;
    v_ended integer;
    v_kind  "char";
    v_busy  boolean;
BEGIN
    SELECT busy INTO v_busy FROM lock_holders WHERE name = p_name AND slot = 0 FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    IF p_forced AND right(p_owner, 1) = '!' THEN
        v_owner := left(p_owner, -1);
        v_kept := true;
    END IF;
    -- The owner's slot and the slots that look over (lock_settle_v1 and
    -- lock_serve_v1 lock those), in slot order as renewals lock them.
    PERFORM 1 FROM lock_holders
     WHERE name = p_name AND (owner = v_owner OR (owner <> '' AND lease_end <= v_now))
     ORDER BY slot
       FOR NO KEY UPDATE;
    -- Free the owner's slot; its fence keeps whether the hold ended in its
    -- lease (1) or after (0).
    UPDATE lock_holders
       SET owner = '', lease_end = '-infinity', kept = false, handed_by = NULL,
           fence = CASE WHEN lease_end > v_now THEN 1 ELSE 0 END
     WHERE name = p_name AND owner = v_owner AND kept = v_kept
    RETURNING fence INTO v_ended;
    IF FOUND THEN
        IF EXISTS (SELECT 1 FROM lock_waiters WHERE name = p_name) THEN
            PERFORM lock_serve_v1(p_name, v_now, CASE WHEN p_forced THEN NULL ELSE v_owner END);
            PERFORM lock_settle_v1(p_name, v_now);
            RETURN v_ended;
        END IF;
        IF v_busy THEN
            PERFORM lock_settle_v1(p_name, v_now);
        END IF;
        IF NOT p_forced THEN
            -- Nobody queued, nothing handed over: the commit need not wait
            -- for the WAL flush. Lost in a crash, this release leaves the
            -- lock held until its lease ends, as a crash of its holder
            -- would; any later commit that waits (a grant, a renewal)
            -- flushes it first.
            PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
        RETURN v_ended;
    END IF;
    DELETE FROM lock_waiters WHERE name = p_name AND owner = v_owner RETURNING kind INTO v_kind;
    IF FOUND THEN
        IF v_kind = 'w' THEN
            -- Readers queued only behind this writer join the readers now.
            PERFORM lock_serve_v1(p_name, v_now, NULL);
        END IF;
        PERFORM lock_settle_v1(p_name, v_now);
    END IF;
    IF NOT p_forced AND EXISTS (
        SELECT 1 FROM lock_holders WHERE name = p_name AND handed_by = v_owner) THEN
        RETURN 1;
    END IF;
    IF EXISTS (SELECT 1 FROM lock_holders WHERE name = p_name AND lease_end > v_now) THEN
        RETURN -1;
    END IF;
    RETURN 0;
END
$$;
