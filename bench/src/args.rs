//! Command-line flags for the benchmark binaries: `--name value` pairs and bare switches,
//! with clear errors for unknown flags or bad values.

use std::collections::HashMap;
use std::str::FromStr;

/// Parsed flags.
#[derive(Debug, Default)]
pub struct Flags {
    values: HashMap<String, Vec<String>>,
    switches: Vec<String>,
}

impl Flags {
    /// Parses the process arguments. `valued` lists flags that take a value, `switches` those
    /// that do not; anything else is an error. Cargo's `--bench` switch (passed to every
    /// bench binary by `cargo bench`) is accepted and ignored.
    pub fn parse(valued: &[&str], switches: &[&str]) -> Result<Flags, String> {
        Self::parse_from(std::env::args().skip(1), valued, switches)
    }

    /// Parses `args` (see [`Flags::parse`]).
    pub fn parse_from(
        args: impl IntoIterator<Item = String>,
        valued: &[&str],
        switches: &[&str],
    ) -> Result<Flags, String> {
        let mut flags = Flags::default();
        let mut it = args.into_iter();
        while let Some(a) = it.next() {
            if a == "--bench" {
                continue;
            }
            if switches.contains(&a.as_str()) {
                flags.switches.push(a);
            } else if valued.contains(&a.as_str()) {
                let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
                flags.values.entry(a).or_default().push(v);
            } else {
                return Err(format!("unknown argument {a}"));
            }
        }
        Ok(flags)
    }

    /// Whether switch `name` was given.
    pub fn has(&self, name: &str) -> bool {
        self.switches.iter().any(|s| s == name)
    }

    /// Every value given for `name`, parsed; a value may be a comma-separated list.
    pub fn list<T: FromStr>(&self, name: &str) -> Result<Vec<T>, String>
    where
        T::Err: std::fmt::Display,
    {
        let mut out = Vec::new();
        for v in self.values.get(name).into_iter().flatten() {
            for part in v.split(',').filter(|p| !p.is_empty()) {
                out.push(
                    part.trim()
                        .parse()
                        .map_err(|e| format!("{name} {part}: {e}"))?,
                );
            }
        }
        Ok(out)
    }

    /// The last value given for `name`, parsed, or `default`.
    pub fn get<T: FromStr>(&self, name: &str, default: T) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        match self.values.get(name).and_then(|v| v.last()) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|e| format!("{name} {v}: {e}")),
        }
    }

    /// Every raw value given for `name`.
    pub fn raw(&self, name: &str) -> Vec<String> {
        self.values.get(name).cloned().unwrap_or_default()
    }
}

/// Prints `error` (unless empty) and `usage`, then exits with status 2.
pub fn exit_usage(error: &str, usage: &str) -> ! {
    if !error.is_empty() {
        eprintln!("error: {error}");
    }
    eprintln!("usage: {usage}");
    std::process::exit(2)
}

#[cfg(test)]
mod tests {
    use super::Flags;

    fn parse(args: &[&str]) -> Result<Flags, String> {
        Flags::parse_from(
            args.iter().map(|s| s.to_string()),
            &["--capacity", "--seconds"],
            &["--json"],
        )
    }

    #[test]
    fn values_lists_and_switches() {
        let f = parse(&["--capacity", "10,20", "--json", "--capacity", "30"]).unwrap();
        assert_eq!(f.list::<usize>("--capacity").unwrap(), vec![10, 20, 30]);
        assert!(f.has("--json"));
        assert_eq!(f.get("--seconds", 1.5).unwrap(), 1.5);
    }

    #[test]
    fn bad_input_is_an_error() {
        assert!(parse(&["--nope"]).is_err());
        assert!(parse(&["--capacity"]).is_err());
        assert!(parse(&["--capacity", "x"])
            .unwrap()
            .list::<usize>("--capacity")
            .is_err());
    }
}
