//! Cron schedules with a duration: "0 8 * * 1-5" for 10h is active on
//! weekdays from 08:00 to 18:00 UTC. Used by disruption budgets and warm-spare
//! windows.

use crate::model::Seconds;
use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid cron schedule {text:?}: {why}")]
pub struct ScheduleError {
    pub text: String,
    pub why: String,
}

/// A parsed five-field cron expression (minute hour day-of-month month
/// day-of-week, UTC), as bit sets of the allowed values.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cron {
    pub text: String,
    minutes: u64,
    hours: u32,
    days: u32,
    months: u16,
    weekdays: u8,
    /// Both day fields restricted: cron matches either (the classic rule).
    day_or_weekday: bool,
}

fn parse_field(field: &str, min: u32, max: u32, names: &[&str]) -> Result<u64, String> {
    let mut bits = 0u64;
    for part in field.split(',') {
        let (range, step) = match part.split_once('/') {
            Some((r, s)) => (r, s.parse::<u32>().map_err(|_| format!("bad step in {part:?}"))?),
            None => (part, 1),
        };
        if step == 0 {
            return Err(format!("zero step in {part:?}"));
        }
        let value = |v: &str| -> Result<u32, String> {
            if let Some(i) = names.iter().position(|n| n.eq_ignore_ascii_case(v)) {
                return Ok(i as u32 + min);
            }
            v.parse::<u32>().map_err(|_| format!("{v:?} is not a number"))
        };
        let (lo, hi) = if range == "*" {
            (min, max)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a)?, value(b)?)
        } else {
            let v = value(range)?;
            (v, if part.contains('/') { max } else { v })
        };
        // Sunday may be written 7.
        let sunday_as_seven = max == 6 && hi == 7;
        let (lo, hi) = match (sunday_as_seven, lo) {
            (true, 7) => (0, 0),
            (true, lo) => (lo, 6),
            (false, lo) => (lo, hi),
        };
        if lo < min || hi > max || lo > hi {
            return Err(format!("{part:?} is outside {min}-{max}"));
        }
        let mut v = lo;
        while v <= hi {
            bits |= 1 << v;
            let Some(next) = v.checked_add(step) else { break };
            v = next;
        }
        if sunday_as_seven {
            bits |= 1;
        }
    }
    Ok(bits)
}

impl Cron {
    pub fn parse(text: &str) -> Result<Cron, ScheduleError> {
        let err = |why: String| ScheduleError { text: text.to_string(), why };
        let expanded = match text.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other => other,
        };
        let fields: Vec<&str> = expanded.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(err(format!("expected 5 fields, found {}", fields.len())));
        }
        const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
        const DAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];
        Ok(Cron {
            text: text.to_string(),
            minutes: parse_field(fields[0], 0, 59, &[]).map_err(err)?,
            hours: parse_field(fields[1], 0, 23, &[]).map_err(err)? as u32,
            days: parse_field(fields[2], 1, 31, &[]).map_err(err)? as u32,
            months: parse_field(fields[3], 1, 12, &MONTHS).map_err(err)? as u16,
            weekdays: parse_field(fields[4], 0, 6, &DAYS).map_err(err)? as u8,
            day_or_weekday: fields[2] != "*" && fields[4] != "*",
        })
    }

    /// Whether the minute starting at `t` (seconds since the Unix epoch, UTC)
    /// matches.
    pub fn matches(&self, t: Seconds) -> bool {
        let (month, day, weekday, hour, minute) = civil(t);
        let day_ok = self.days & (1 << day) != 0;
        let weekday_ok = self.weekdays & (1 << weekday) != 0;
        let days_match = if self.day_or_weekday { day_ok || weekday_ok } else { day_ok && weekday_ok };
        self.minutes & (1 << minute) != 0 && self.hours & (1 << hour) != 0 && self.months & (1 << month) != 0 && days_match
    }
}

/// (month 1-12, day 1-31, weekday 0=Sunday, hour, minute) of a Unix time.
fn civil(t: Seconds) -> (u32, u32, u32, u32, u32) {
    let days = (t / 86_400) as i64;
    let secs = t % 86_400;
    // Howard Hinnant's days-from-civil inverse.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let weekday = ((days + 4).rem_euclid(7)) as u32; // 1970-01-01 was a Thursday
    (month, day, weekday, (secs / 3600) as u32, (secs / 60 % 60) as u32)
}

/// A cron schedule and how long each window it starts lasts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub cron: Cron,
    pub duration_s: Seconds,
}

impl Window {
    /// Active if a window started within the last `duration_s`. Looks back
    /// minute by minute, at most one week.
    pub fn is_active(&self, now_s: Seconds) -> bool {
        let now_minute = now_s - now_s % 60;
        let lookback = self.duration_s.min(7 * 86_400);
        let mut back = 0;
        while back < lookback.max(1) && back <= now_minute {
            let start = now_minute - back;
            if self.cron.matches(start) && now_s < start + self.duration_s {
                return true;
            }
            back += 60;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2026-11-30 is a Monday.
    const MONDAY_0800: Seconds = 1_795_996_800 + 8 * 3600;

    #[test]
    fn civil_time_is_right() {
        assert_eq!(civil(0), (1, 1, 4, 0, 0));
        assert_eq!(civil(MONDAY_0800), (11, 30, 1, 8, 0));
    }

    #[test]
    fn business_hours_window() {
        let w = Window { cron: Cron::parse("0 8 * * 1-5").unwrap(), duration_s: 10 * 3600 };
        assert!(w.is_active(MONDAY_0800));
        assert!(w.is_active(MONDAY_0800 + 9 * 3600 + 59 * 60));
        assert!(!w.is_active(MONDAY_0800 + 10 * 3600));
        assert!(!w.is_active(MONDAY_0800 - 60));
        // Saturday 09:00.
        assert!(!w.is_active(MONDAY_0800 + 5 * 86_400 + 3600));
    }

    #[test]
    fn fields_lists_steps_names_and_macros() {
        let c = Cron::parse("*/15 9-17 * jan,dec mon-fri").unwrap();
        assert!(!c.matches(MONDAY_0800 + 3600 + 30 * 60)); // November
        let c = Cron::parse("*/15 9-17 * * mon-fri").unwrap();
        assert!(c.matches(MONDAY_0800 + 3600 + 30 * 60));
        assert!(!c.matches(MONDAY_0800 + 3600 + 31 * 60));
        assert!(Cron::parse("@daily").unwrap().matches(MONDAY_0800 - 8 * 3600));
        assert!(Cron::parse("0 0 * * 7").unwrap().matches(MONDAY_0800 - 8 * 3600 - 86_400));
    }

    #[test]
    fn bad_expressions_say_why() {
        // A huge step is one value, not an overflow.
        assert!(Cron::parse("1-5/4294967295 * * * *").unwrap().matches(60));
        for bad in ["", "* * * *", "61 * * * *", "* 24 * * *", "*/0 * * * *", "a * * * *", "5-1 * * * *"] {
            assert!(Cron::parse(bad).is_err(), "{bad}");
        }
    }
}
