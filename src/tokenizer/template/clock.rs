//! `strftime_now`: the current (or a given) time formatted as Python's `strftime` does, in
//! UTC, for the directives chat templates use, without a date-time dependency.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Calendar fields of a UTC time.
struct Civil {
    year: i64,
    month: u32, // 1..=12
    day: u32,   // 1..=31
    hour: u32,
    minute: u32,
    second: u32,
    weekday: usize, // 0 = Monday
    yday: u32,      // 1..=366
}

fn civil(t: SystemTime) -> Civil {
    let secs = match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64) - 1,
    };
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400) as u32;
    // Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = BEFORE[month as usize - 1] + day + u32::from(leap && month > 2);
    Civil {
        year,
        month,
        day,
        hour: rem / 3600,
        minute: rem / 60 % 60,
        second: rem % 60,
        weekday: (days + 3).rem_euclid(7) as usize, // 1970-01-01 was a Thursday
        yday,
    }
}

/// Python's `datetime.strftime` for the C directives that do not depend on the locale beyond
/// English names; other `%x` pass through unchanged, as glibc leaves them.
pub(super) fn strftime(now: SystemTime, format: &str) -> String {
    let c = civil(now);
    let hour12 = match c.hour % 12 {
        0 => 12,
        h => h,
    };
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(ch) = chars.next() {
        if ch != '%' {
            out.push(ch);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        let _ = match d {
            'Y' => write!(out, "{}", c.year),
            'y' => write!(out, "{:02}", c.year.rem_euclid(100)),
            'm' => write!(out, "{:02}", c.month),
            'd' => write!(out, "{:02}", c.day),
            'e' => write!(out, "{:2}", c.day),
            'H' => write!(out, "{:02}", c.hour),
            'I' => write!(out, "{hour12:02}"),
            'M' => write!(out, "{:02}", c.minute),
            'S' => write!(out, "{:02}", c.second),
            'p' => write!(out, "{}", if c.hour < 12 { "AM" } else { "PM" }),
            'j' => write!(out, "{:03}", c.yday),
            'B' => write!(out, "{}", MONTHS[c.month as usize - 1]),
            'b' | 'h' => write!(out, "{}", &MONTHS[c.month as usize - 1][..3]),
            'A' => write!(out, "{}", DAYS[c.weekday]),
            'a' => write!(out, "{}", &DAYS[c.weekday][..3]),
            'u' => write!(out, "{}", c.weekday + 1),
            'w' => write!(out, "{}", (c.weekday + 1) % 7),
            'F' => write!(out, "{}-{:02}-{:02}", c.year, c.month, c.day),
            'T' => write!(out, "{:02}:{:02}:{:02}", c.hour, c.minute, c.second),
            '%' => write!(out, "%"),
            other => write!(out, "%{other}"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        let at = |s: u64| UNIX_EPOCH + std::time::Duration::from_secs(s);
        assert_eq!(
            strftime(at(0), "%Y-%m-%d %H:%M:%S %a %j"),
            "1970-01-01 00:00:00 Thu 001"
        );
        // 2024-02-29 12:34:56 UTC, a leap day (Thursday).
        assert_eq!(
            strftime(at(1_709_210_096), "%d %b %Y|%B %d, %Y|%A|%I %p|%j|%%"),
            "29 Feb 2024|February 29, 2024|Thursday|12 PM|060|%"
        );
        assert_eq!(
            strftime(at(1_738_919_103), "%d %b %Y %H:%M:%S"),
            "07 Feb 2025 09:05:03"
        );
    }
}
