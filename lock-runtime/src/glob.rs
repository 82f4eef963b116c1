//! Redis glob patterns (`*`, `?`, `[abc]`, `[^a-z]`, `\x`), as `SCAN MATCH`
//! reads them: listing locks matches keys with the same rules on every
//! deployment, the in-memory one included.

/// Whether `key` matches `pattern` (the rules of Redis' `stringmatchlen`).
pub(crate) fn matches(pattern: &str, key: &str) -> bool {
    let (p, s) = (pattern.as_bytes(), key.as_bytes());
    let (mut pi, mut si) = (0, 0);
    // The last `*` seen: the pattern after it, and where in `key` it
    // started matching; on a mismatch it swallows one byte more.
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if p.get(pi) == Some(&b'*') {
            pi += 1;
            star = Some((pi, si));
            continue;
        }
        if let Some(next) = (pi < p.len()).then(|| one(p, pi, s[si])).flatten() {
            pi = next;
            si += 1;
            continue;
        }
        match star {
            Some((after, from)) => {
                pi = after;
                si = from + 1;
                star = Some((after, from + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// If the pattern element at `pi` matches the byte `c`: where the next
/// element starts.
fn one(p: &[u8], pi: usize, c: u8) -> Option<usize> {
    match p[pi] {
        b'?' => Some(pi + 1),
        b'\\' if pi + 1 < p.len() => (p[pi + 1] == c).then_some(pi + 2),
        b'[' => class(p, pi + 1, c),
        x => (x == c).then_some(pi + 1),
    }
}

/// A `[...]` class starting at `i` (after the `[`): where the pattern goes
/// on if `c` is in it. An unclosed class ends with the pattern, as in Redis.
fn class(p: &[u8], mut i: usize, c: u8) -> Option<usize> {
    let negated = p.get(i) == Some(&b'^');
    if negated {
        i += 1;
    }
    let mut hit = false;
    while let Some(&a) = p.get(i) {
        if a == b']' {
            i += 1;
            break;
        }
        if a == b'\\' && i + 1 < p.len() {
            hit |= p[i + 1] == c;
            i += 2;
        } else if p.get(i + 1) == Some(&b'-') && i + 2 < p.len() {
            let (lo, hi) = (a.min(p[i + 2]), a.max(p[i + 2]));
            hit |= (lo..=hi).contains(&c);
            i += 3;
        } else {
            hit |= a == c;
            i += 1;
        }
    }
    (hit != negated).then_some(i)
}

/// `s` with every glob character escaped, to match itself only.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_glob_rules() {
        let yes = [
            ("*", ""),
            ("*", "order:42"),
            ("order:*", "order:42"),
            ("order:?2", "order:42"),
            ("*:42", "order:42"),
            ("o*r*2", "order:42"),
            ("order:[0-9]*", "order:42"),
            ("order:[^a-z]2", "order:42"),
            ("order:[a4]2", "order:42"),
            ("a\\*b", "a*b"),
            ("[\\]]", "]"),
            ("[9-0]", "5"),
        ];
        for (p, k) in yes {
            assert!(matches(p, k), "{p:?} should match {k:?}");
        }
        let no = [
            ("order:*", "order"),
            ("order:?", "order:42"),
            ("order:[^0-9]2", "order:42"),
            ("a\\*b", "axb"),
            ("*:43", "order:42"),
            ("", "x"),
        ];
        for (p, k) in no {
            assert!(!matches(p, k), "{p:?} should not match {k:?}");
        }
    }

    #[test]
    fn an_escaped_string_matches_itself_only() {
        let prefix = "l*ck[1]?\\";
        assert!(matches(&escape(prefix), prefix));
        assert!(!matches(&escape(prefix), "lock[1]?\\"));
    }
}
