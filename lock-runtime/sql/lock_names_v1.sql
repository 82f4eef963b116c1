-- Every lock name held or waited for now that starts with p_prefix (the
-- caller filters by pattern). Reads lock_holders and lock_waiters; writes
-- nothing.
CREATE OR REPLACE FUNCTION lock_names_v1(p_prefix text)
RETURNS SETOF text LANGUAGE sql AS $$
    SELECT name FROM lock_holders
     WHERE starts_with(name, p_prefix) AND lease_end > clock_timestamp()
    UNION
    SELECT name FROM lock_waiters
     WHERE starts_with(name, p_prefix) AND until > clock_timestamp();
$$;
