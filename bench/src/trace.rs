//! Access traces for the hit-ratio benchmark, in the two formats of the shared trace set:
//!
//! - `*.trace.gz` (the LIRS traces): gzip'd text, one integer key per line; other lines (the
//!   `*` separators some traces carry) are skipped;
//! - `*.trace.xz` (the cache2k traces): xz'd big-endian `u32` keys back to back.
//!
//! The traces are not part of the repository; they are read from a directory given on the
//! command line, from `HERDCACHE_TRACES`, or from `../shared/traces` when it exists.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// The two trace families, which have different default capacities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Gzip'd text, one key per line.
    LirsText,
    /// Xz'd big-endian u32 keys.
    Cache2kBinary,
}

impl Format {
    /// The format a file name implies, if any.
    pub fn of(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?;
        if name.ends_with(".gz") {
            Some(Format::LirsText)
        } else if name.ends_with(".xz") {
            Some(Format::Cache2kBinary)
        } else {
            None
        }
    }

    /// Capacities the hit-ratio grid uses for traces of this family.
    pub fn default_capacities(self) -> &'static [usize] {
        match self {
            Format::LirsText => &[100, 200, 500, 1000],
            Format::Cache2kBinary => &[1000, 5000, 20000],
        }
    }
}

/// A trace read into memory.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Short name: the file name without `.trace.gz` / `.trace.xz`.
    pub name: String,
    /// Its format.
    pub format: Format,
    /// The keys, in access order.
    pub keys: Vec<u64>,
}

/// Reads the trace at `path`, choosing the format by extension.
pub fn read(path: &Path) -> Result<Trace, String> {
    let format = Format::of(path)
        .ok_or_else(|| format!("{}: expected a .gz or .xz trace", path.display()))?;
    let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let keys = match format {
        Format::LirsText => read_text(BufReader::new(flate2::read::GzDecoder::new(file))),
        Format::Cache2kBinary => {
            let mut raw = Vec::new();
            lzma_rs::xz_decompress(&mut BufReader::new(file), &mut raw)
                .map_err(|e| format!("{}: {e:?}", path.display()))?;
            if raw.len() % 4 != 0 {
                return Err(format!(
                    "{}: {} bytes is not a whole number of u32 keys",
                    path.display(),
                    raw.len()
                ));
            }
            Ok(raw
                .chunks_exact(4)
                .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as u64)
                .collect())
        }
    }
    .map_err(|e| format!("{}: {e}", path.display()))?;
    if keys.is_empty() {
        return Err(format!("{}: no keys", path.display()));
    }
    let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("trace");
    let name = file_name
        .trim_end_matches(".gz")
        .trim_end_matches(".xz")
        .trim_end_matches(".trace")
        .to_owned();
    Ok(Trace { name, format, keys })
}

fn read_text(reader: impl BufRead) -> Result<Vec<u64>, String> {
    let mut keys = Vec::new();
    for line in reader.lines() {
        let line = line.map_err(|e| e.to_string())?;
        if let Ok(k) = line.trim().parse::<u64>() {
            keys.push(k);
        }
    }
    Ok(keys)
}

/// Where to look for traces when none is given: `HERDCACHE_TRACES`, else `../shared/traces`
/// (from the current directory, then from this crate's parent), if it exists.
pub fn default_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("HERDCACHE_TRACES") {
        return Some(PathBuf::from(dir));
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    [
        PathBuf::from("../shared/traces"),
        manifest.join("../../shared/traces"),
    ]
    .into_iter()
    .find(|p| p.is_dir())
}

/// Every trace file (`*.gz`, `*.xz`) in `dir`, sorted by name.
pub fn files_in(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| Format::of(p).is_some())
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn text_traces_skip_separator_lines() {
        let keys = read_text("1\n2\n*\n 3 \n\n".as_bytes()).unwrap();
        assert_eq!(keys, vec![1, 2, 3]);
    }

    #[test]
    fn gz_trace_round_trips() {
        let dir = std::env::temp_dir().join(format!("herdcache-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.trace.gz");
        let mut enc = flate2::write::GzEncoder::new(
            File::create(&path).unwrap(),
            flate2::Compression::fast(),
        );
        enc.write_all(b"5\n6\n5\n").unwrap();
        enc.finish().unwrap();
        let t = read(&path).unwrap();
        assert_eq!((t.name.as_str(), t.keys), ("t", vec![5, 6, 5]));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unknown_extensions_are_an_error() {
        assert!(read(Path::new("trace.txt")).is_err());
    }
}
