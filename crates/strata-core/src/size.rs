//! Sizes as users write them on command lines (`100G`, `256MiB`, `10GB`).

/// Parses a size: a number with an optional unit — none or `B` (bytes),
/// `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` (powers of 1024) or `KB`,
/// `MB`, `GB`, `TB` (powers of 1000); case-insensitive, fractions allowed
/// (`1.5G`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("bad size {s:?}: expected e.g. 4096, 64M, 1.5GiB, 10GB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024.0 * 1024.0,
        "g" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        u => return Err(format!("bad size {s:?}: unknown unit {u:?}")),
    };
    let v = n * mult;
    if !v.is_finite() || v >= u64::MAX as f64 {
        return Err(format!("bad size {s:?}: too large"));
    }
    Ok(v.round() as u64)
}
