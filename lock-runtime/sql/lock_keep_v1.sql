-- min_hold: end p_owner's hold but leave the lock taken until p_left_ms from
-- now at most (never longer than its lease already runs). The hold is marked
-- kept: renewals of p_owner no longer extend it, its release no longer
-- finds it, and inspect shows it as "<owner>!". Returns 1 if p_owner held
-- it, else 0. Reads and writes p_owner's lock_holders row only. Safe to send
-- twice: the second send finds the hold kept already and changes nothing.
CREATE OR REPLACE FUNCTION lock_keep_v1(p_name text, p_owner text, p_left_ms bigint)
RETURNS integer LANGUAGE sql AS $$
    WITH kept AS (
        UPDATE lock_holders
           SET kept = true,
               lease_end = least(lease_end, clock_timestamp() + p_left_ms * interval '1 millisecond')
         WHERE name = p_name AND owner = p_owner AND NOT kept AND lease_end > clock_timestamp()
        RETURNING 1)
    SELECT count(*)::integer FROM kept;
$$;
