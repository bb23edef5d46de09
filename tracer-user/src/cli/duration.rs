//! Durations on the command line: `500ms`, `10s`, `2m`, `1h`, or plain seconds.

use std::time::Duration;

pub fn parse(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("'{s}' is not a duration (try 500ms, 10s, 2m)"))?;
    let secs = match unit {
        "" | "s" => value,
        "ms" => value / 1e3,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => {
            return Err(format!(
                "unknown unit '{other}' in '{s}' (use ms, s, m or h)"
            ))
        }
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("'{s}': {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse("ten").is_err());
        assert!(parse("5d").is_err());
    }
}
