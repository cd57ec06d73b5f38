//! The values of flags that clap cannot read by itself: durations, a
//! rejection status, the id secret file.

use std::time::Duration;

/// A client-error status (400-499) for rejections.
pub(crate) fn parse_reject_status(text: &str) -> Result<http::StatusCode, String> {
    text.trim()
        .parse::<u16>()
        .ok()
        .and_then(|code| http::StatusCode::from_u16(code).ok())
        .filter(http::StatusCode::is_client_error)
        .ok_or_else(|| format!("{text:?} is not a 4xx status code such as 400 or 409"))
}

/// `5`, `5s`, `500ms`, `2m`: a whole number with an optional unit (seconds
/// when none is given).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 5s or 500ms"))?;
    match unit.trim() {
        "" | "s" => Ok(Duration::from_secs(number)),
        "ms" => Ok(Duration::from_millis(number)),
        "m" => Ok(Duration::from_secs(number.saturating_mul(60))),
        _ => Err(format!(
            "{text:?}: unknown unit (use ms, s or m, e.g. 5s or 500ms)"
        )),
    }
}

/// Reads an id secret file: 32 hex digits (surrounding white space allowed).
pub(crate) fn read_id_secret(path: &std::path::Path) -> Result<[u8; 16], String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("cannot read the id secret file {}: {error}", path.display()))?;
    let hex = text.trim();
    let invalid = || {
        format!(
            "the id secret file {} must hold 32 hex digits (16 bytes), e.g. from `openssl rand -hex 16`",
            path.display()
        )
    };
    if hex.len() != 32 || !hex.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return Err(invalid());
    }
    let mut secret = [0; 16];
    for (index, byte) in secret.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * index..2 * index + 2], 16).map_err(|_| invalid())?;
    }
    Ok(secret)
}
