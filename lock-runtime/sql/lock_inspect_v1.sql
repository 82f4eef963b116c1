-- What is held of one name, for an operator: the holders in their lease (a
-- hold left to its min_hold as "<owner>!"), the longest lease left in ms,
-- the waiters still within their stay, and the highest token of the holds
-- (0: none). Reads lock_holders and lock_waiters; writes nothing.
CREATE OR REPLACE FUNCTION lock_inspect_v1(p_name text,
    OUT holders text[], OUT ttl_ms bigint, OUT waiters integer, OUT fence bigint)
LANGUAGE sql AS $$
    SELECT coalesce(array_agg(CASE WHEN h.kept THEN h.owner || '!' ELSE h.owner END ORDER BY h.owner), '{}'),
           (extract(epoch FROM max(h.lease_end) - clock_timestamp()) * 1000)::bigint,
           (SELECT count(*)::integer FROM lock_waiters w
             WHERE w.name = p_name AND w.until > clock_timestamp()),
           coalesce(max(h.fence), 0)
      FROM lock_holders h
     WHERE h.name = p_name AND h.lease_end > clock_timestamp();
$$;
