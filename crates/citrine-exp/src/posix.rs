//! POSIX regular expressions (the reference compiles `[7, flags, pattern,
//! string]` with `regcomp`) translated into the `regex` crate's syntax.
//!
//! Flags (POSIX values, as clients send them): 1 `REG_EXTENDED` (ERE; basic
//! BRE otherwise), 2 `REG_ICASE`, 4 `REG_NOSUB` (nothing to do: only
//! whether there is a match is asked), 8 `REG_NEWLINE` (`.` and negated
//! brackets stop at newlines, `^`/`$` match at line ends).
//!
//! Matching is on bytes in the C locale: ASCII classes and case folding,
//! `.` matches any byte. Whether a string matches does not depend on
//! POSIX's leftmost-longest rule, so the crate's leftmost-first engine
//! answers the same. GNU extensions glibc accepts are kept: `\w \W \s \S
//! \b \B \< \> \` \'` and, in BREs, `\+ \? \|`. An escaped character with no
//! meaning stands for itself. Like `regcomp` on a C string, a pattern ends
//! at its first NUL.
//!
//! Invariants: [`compile`] never panics; a pattern the translation or the
//! crate refuses is an error (the reference answers PARAMETER when
//! `regcomp` fails).

use regex::bytes::{Regex, RegexBuilder};

pub(crate) const REG_EXTENDED: i64 = 1;
pub(crate) const REG_ICASE: i64 = 2;
pub(crate) const REG_NEWLINE: i64 = 8;

/// Compiled patterns are bounded (the crate's own default is 10 MiB).
const SIZE_LIMIT: usize = 4 << 20;

/// Compiles a POSIX pattern under POSIX flags.
pub(crate) fn compile(pattern: &[u8], flags: i64) -> Result<Regex, ()> {
    let pattern = match pattern.iter().position(|&b| b == 0) {
        Some(nul) => &pattern[..nul],
        None => pattern,
    };
    let newline = flags & REG_NEWLINE != 0;
    let translated = translate(pattern, flags & REG_EXTENDED != 0, newline)?;
    RegexBuilder::new(&translated)
        .unicode(false)
        .case_insensitive(flags & REG_ICASE != 0)
        .multi_line(newline)
        .dot_matches_new_line(!newline)
        .size_limit(SIZE_LIMIT)
        .dfa_size_limit(SIZE_LIMIT)
        .build()
        .map_err(|_| ())
}

/// A byte as a literal in the crate's syntax (non-ASCII as `\xHH`).
fn literal(out: &mut String, b: u8) {
    if b.is_ascii_alphanumeric() || b == b'_' || b == b' ' {
        out.push(char::from(b));
    } else {
        out.push_str(&format!("\\x{b:02x}"));
    }
}

/// Rewrites a POSIX pattern (BRE unless `extended`) in the crate's syntax.
fn translate(pattern: &[u8], extended: bool, newline: bool) -> Result<String, ()> {
    let mut out = String::with_capacity(pattern.len() * 2);
    let mut i = 0;
    // Whether the next token starts an expression (where a BRE `*` is a
    // literal and `^` an anchor).
    let mut at_start = true;
    while i < pattern.len() {
        let b = pattern[i];
        let was_start = at_start;
        at_start = false;
        match b {
            b'\\' => {
                let Some(&next) = pattern.get(i + 1) else {
                    // A trailing backslash is an error for regcomp.
                    return Err(());
                };
                i += 2;
                match next {
                    b'{' if !extended => i = interval(pattern, i, false, &mut out)?,
                    b'(' | b')' | b'}' | b'|' | b'+' | b'?' if !extended => {
                        // BRE: the escaped forms are the operators.
                        out.push(char::from(next));
                        at_start = matches!(next, b'(' | b'|');
                    }
                    b'w' | b'W' | b's' | b'S' | b'b' | b'B' | b'<' | b'>' => {
                        out.push('\\');
                        out.push(char::from(next));
                    }
                    b'`' => out.push_str("\\A"),
                    b'\'' => out.push_str("\\z"),
                    b'1'..=b'9' => return Err(()), // back-references
                    _ => literal(&mut out, next),
                }
                continue;
            }
            b'[' => {
                i = bracket(pattern, i, newline, &mut out)?;
                continue;
            }
            b'(' | b')' | b'{' | b'}' | b'|' | b'+' | b'?' if !extended => literal(&mut out, b),
            b'(' | b'|' => {
                out.push(char::from(b));
                at_start = true;
            }
            b'{' => {
                i = interval(pattern, i + 1, true, &mut out)?;
                continue;
            }
            b'*' if was_start && !extended => literal(&mut out, b),
            b'^' if !extended && !was_start => literal(&mut out, b),
            b'$' if !extended && !bre_end(pattern, i + 1) => literal(&mut out, b),
            b'^' | b'$' | b'.' | b'*' | b')' | b'}' | b'+' | b'?' => {
                out.push(char::from(b));
                at_start = b == b'^';
            }
            _ => literal(&mut out, b),
        }
        i += 1;
    }
    Ok(out)
}

/// Copies the bounds of an interval `{m}`, `{m,}`, `{m,n}` whose opening
/// brace ended just before `pattern[i]`; answers the index after its
/// closing brace (`}` in an ERE, `\}` in a BRE).
fn interval(pattern: &[u8], mut i: usize, extended: bool, out: &mut String) -> Result<usize, ()> {
    out.push('{');
    loop {
        match (pattern.get(i), pattern.get(i + 1)) {
            (Some(b'}'), _) if extended => {
                out.push('}');
                return Ok(i + 1);
            }
            (Some(b'\\'), Some(b'}')) if !extended => {
                out.push('}');
                return Ok(i + 2);
            }
            (Some(&b), _) if b.is_ascii_digit() || b == b',' => {
                out.push(char::from(b));
                i += 1;
            }
            _ => return Err(()),
        }
    }
}

/// Whether position `i` of a BRE ends an expression (where `$` anchors).
fn bre_end(pattern: &[u8], i: usize) -> bool {
    matches!(pattern.get(i..), Some([]) | Some([b'\\', b')' | b'|', ..]))
}

/// Translates the bracket expression starting at `pattern[start] == b'['`;
/// answers the index after it.
fn bracket(pattern: &[u8], start: usize, newline: bool, out: &mut String) -> Result<usize, ()> {
    let mut i = start + 1;
    out.push('[');
    let negated = pattern.get(i) == Some(&b'^');
    if negated {
        out.push('^');
        i += 1;
        if newline {
            // REG_NEWLINE: a non-matching list never matches a newline.
            out.push_str("\\n");
        }
    }
    let mut first = true;
    loop {
        let &b = pattern.get(i).ok_or(())?;
        if b == b']' && !first {
            out.push(']');
            return Ok(i + 1);
        }
        first = false;
        if b == b'[' && matches!(pattern.get(i + 1), Some(b':' | b'.' | b'=')) {
            let kind = pattern[i + 1];
            let close = [kind, b']'];
            let body_start = i + 2;
            let len = pattern
                .get(body_start..)
                .and_then(|rest| rest.windows(2).position(|w| w == close))
                .ok_or(())?;
            let body = &pattern[body_start..body_start + len];
            if kind == b':' {
                // The POSIX class names, which the crate knows too.
                const CLASSES: [&[u8]; 12] = [
                    b"alpha", b"digit", b"alnum", b"upper", b"lower", b"space", b"blank", b"punct",
                    b"print", b"graph", b"cntrl", b"xdigit",
                ];
                if !CLASSES.contains(&body) {
                    return Err(());
                }
                out.push_str("[:");
                out.push_str(std::str::from_utf8(body).map_err(|_| ())?);
                out.push_str(":]");
            } else {
                // Collating symbols and equivalence classes of one
                // character are that character.
                match body {
                    [one] => literal(out, *one),
                    _ => return Err(()),
                }
            }
            i = body_start + len + 2;
            continue;
        }
        // Range dashes pass; everything else is a literal (a backslash is
        // one inside POSIX brackets).
        if b == b'-' {
            out.push('-');
        } else {
            literal(out, b);
        }
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, flags: i64, subject: &str) -> bool {
        compile(pattern.as_bytes(), flags)
            .expect("compiles")
            .is_match(subject.as_bytes())
    }

    #[test]
    fn extended_syntax() {
        assert!(matches("^a(b|c)+d$", REG_EXTENDED, "abcbd"));
        assert!(!matches("^a(b|c)+d$", REG_EXTENDED, "ad"));
        assert!(matches("x{2,3}", REG_EXTENDED, "axxb"));
        assert!(matches(".*bob.*", REG_EXTENDED, "hi bob!"));
        assert!(matches("[[:digit:]]+", REG_EXTENDED, "a1"));
        assert!(!matches("[[:digit:]]+", REG_EXTENDED, "ab"));
    }

    #[test]
    fn basic_syntax_swaps_the_operators() {
        // In a BRE `+`, `?`, `(`, `|` and `{` are literals ...
        assert!(matches("a+", 0, "a+"));
        assert!(!matches("a+", 0, "aa"));
        assert!(matches("(x)", 0, "(x)"));
        // ... and their escaped forms the operators (GNU).
        assert!(matches("^a\\(b\\|c\\)\\+$", 0, "abcb"));
        assert!(matches("x\\{2\\}", 0, "xx"));
        // A leading `*` is a literal.
        assert!(matches("*a", 0, "*a"));
        assert!(matches("ab*c", 0, "ac"));
        // `^` anchors only at the start, `$` only at the end.
        assert!(matches("a^b$", 0, "a^b"));
        assert!(matches("a$b", 0, "a$b"));
    }

    #[test]
    fn flags() {
        assert!(!matches("^abc", REG_EXTENDED, "ABC"));
        assert!(matches("^abc", REG_EXTENDED | REG_ICASE, "ABC"));
        // Without REG_NEWLINE `.` crosses lines and `^` is the string start.
        assert!(matches("a.b", REG_EXTENDED, "a\nb"));
        assert!(!matches("^b", REG_EXTENDED, "a\nb"));
        assert!(!matches("a.b", REG_EXTENDED | REG_NEWLINE, "a\nb"));
        assert!(matches("^b", REG_EXTENDED | REG_NEWLINE, "a\nb"));
        assert!(!matches("a[^x]b", REG_EXTENDED | REG_NEWLINE, "a\nb"));
        assert!(matches("a[^x]b", REG_EXTENDED, "a\nb"));
    }

    #[test]
    fn brackets_and_escapes() {
        assert!(matches("[]a]", REG_EXTENDED, "]"));
        assert!(matches("[a\\]", REG_EXTENDED, "\\"));
        assert!(matches("[&~]", REG_EXTENDED, "~"));
        assert!(matches("a\\.b", REG_EXTENDED, "a.b"));
        assert!(!matches("a\\.b", REG_EXTENDED, "axb"));
        assert!(matches("\\w+", REG_EXTENDED, "_"));
        assert!(matches("[[.-.]]", REG_EXTENDED, "-"));
        // A NUL ends the pattern, as for regcomp.
        assert!(matches("ab\0zzz", REG_EXTENDED, "ab"));
    }

    #[test]
    fn refusals() {
        for bad in ["a\\", "[abc", "(a", "\\1", "[[:nope:]]", "a{2,1}"] {
            assert!(compile(bad.as_bytes(), REG_EXTENDED).is_err(), "{bad}");
        }
        assert!(compile(b"\\(a", 0).is_err());
    }
}
