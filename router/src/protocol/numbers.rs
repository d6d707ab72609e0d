//! Numbers on a command line, read as memcached 1.6.18 reads them.
//!
//! memcached reads every number with C's `strtol`/`strtoull` through its `safe_strto*` helpers:
//! leading whitespace bytes are skipped (a token has no spaces, but may start with a tab, VT, FF or
//! CR), a sign is taken, the number may end at the token's end or at a whitespace byte, and the
//! result is then stored in the C type of the field — so a 64-bit number is cut to 32 bits where
//! the field is 32-bit (a length of 2^32 + 13 is 13). What memcached takes, the router must take,
//! and with the same value: a length read differently from memcached frames the value differently,
//! and a value framed differently is run as commands (request smuggling).

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// The sign, the magnitude (`None` past 2^64 - 1) and whether the number ends where `safe_strto*`
/// accepts it (at the token's end or at a whitespace byte); `None` without a digit.
fn scan(tok: &[u8]) -> Option<(bool, Option<u64>, bool)> {
    let mut rest = &tok[tok.iter().take_while(|&&b| is_c_space(b)).count()..];
    let negative = rest.first() == Some(&b'-');
    if matches!(rest.first(), Some(b'-' | b'+')) {
        rest = &rest[1..];
    }
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let magnitude = rest[..digits]
        .iter()
        .try_fold(0u64, |acc, &d| acc.checked_mul(10)?.checked_add(u64::from(d - b'0')));
    let ends_well = rest.get(digits).is_none_or(|&b| is_c_space(b));
    Some((negative, magnitude, ends_well))
}

/// memcached's `safe_strtoull` (and `safe_strtoul`, whose `unsigned long` is 64-bit here): a
/// magnitude of 2^64 or more is refused; a negative number is wrapped to 64 bits and refused if the
/// result is 2^63 or more (so `-1` is refused, `-9223372036854775809` taken as 2^63 - 1).
pub fn strtoull(tok: &[u8]) -> Option<u64> {
    let (negative, magnitude, ends_well) = scan(tok)?;
    let magnitude = magnitude?;
    if !ends_well {
        return None;
    }
    let value = if negative { magnitude.wrapping_neg() } else { magnitude };
    if negative && value > i64::MAX as u64 {
        return None;
    }
    Some(value)
}

/// memcached's `safe_strtoul` into a 32-bit field (client flags, `verbosity`): the low 32 bits of
/// `strtoull` (`4294967296` is 0, 2^64 - 1 is 4294967295).
pub fn strtoul32(tok: &[u8]) -> Option<u32> {
    strtoull(tok).map(|v| v as u32)
}

/// memcached's `safe_strtol` into its `int32_t` fields (exptimes, value lengths): C's `strtol`
/// reads a 64-bit `long` (out of range: refused), and the store into the 32-bit field keeps the
/// low 32 bits (`4294967309` is 13, `-4294967293` is 3, `2147483648` is -2147483648).
pub fn strtol32(tok: &[u8]) -> Option<i32> {
    let (negative, magnitude, ends_well) = scan(tok)?;
    let magnitude = magnitude?;
    let value = if negative {
        if magnitude > i64::MAX as u64 + 1 {
            return None;
        }
        (magnitude as i64).wrapping_neg()
    } else {
        i64::try_from(magnitude).ok()?
    };
    ends_well.then_some(value as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strtol32_keeps_the_low_32_bits_as_memcached_does() {
        assert_eq!(strtol32(b"13"), Some(13));
        assert_eq!(strtol32(b"4294967309"), Some(13));
        assert_eq!(strtol32(b"-4294967293"), Some(3));
        assert_eq!(strtol32(b"2147483648"), Some(i32::MIN));
        assert_eq!(strtol32(b"-1"), Some(-1));
        assert_eq!(strtol32(b"+7"), Some(7));
        assert_eq!(strtol32(b"\t7"), Some(7));
        assert_eq!(strtol32(b"7\t"), Some(7));
        assert_eq!(strtol32(b"9223372036854775807"), Some(-1));
        assert_eq!(strtol32(b"-9223372036854775808"), Some(0));
        assert_eq!(strtol32(b"9223372036854775808"), None); // ERANGE
        assert_eq!(strtol32(b"-9223372036854775809"), None);
        assert_eq!(strtol32(b"7x"), None);
        assert_eq!(strtol32(b"x"), None);
        assert_eq!(strtol32(b"-"), None);
        assert_eq!(strtol32(b""), None);
    }

    #[test]
    fn strtoull_refuses_negatives_that_wrap_past_2_63() {
        assert_eq!(strtoull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(strtoull(b"18446744073709551616"), None);
        assert_eq!(strtoull(b"-1"), None);
        assert_eq!(strtoull(b"-0"), Some(0));
        assert_eq!(strtoull(b"-9223372036854775809"), Some(i64::MAX as u64));
        assert_eq!(strtoul32(b"4294967301"), Some(5));
    }
}
