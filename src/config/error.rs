//! `ConfigError`: what went wrong loading a config file, with file, line, column and key path,
//! displayed `file:line:col: key.path: message` (the shape `sluice -t` and reload logs print).

use std::path::{Path, PathBuf};

/// A config load or validation failure.
#[derive(Debug, thiserror::Error)]
#[error("{}", self.render())]
pub struct ConfigError {
    /// The file at fault.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
    /// Dotted key path, e.g. `models.acme/chat.routes[0].provider` (empty for the whole file).
    pub key_path: String,
    /// What is wrong.
    pub message: String,
}

impl ConfigError {
    /// An error about `key_path` in `file`; the line is looked up in `source` when given.
    pub fn at(
        file: &Path,
        source: Option<&str>,
        key_path: &str,
        message: impl Into<String>,
    ) -> Self {
        let (line, column) = source
            .and_then(|s| locate_key(s, key_path))
            .map_or((None, None), |(l, c)| (Some(l), Some(c)));
        Self {
            file: file.to_path_buf(),
            line,
            column,
            key_path: key_path.to_string(),
            message: message.into(),
        }
    }

    /// An I/O failure reading `file`.
    pub fn io(file: &Path, err: &std::io::Error) -> Self {
        Self {
            file: file.to_path_buf(),
            line: None,
            column: None,
            key_path: String::new(),
            message: format!("cannot read: {err}"),
        }
    }

    fn render(&self) -> String {
        let mut s = self.file.display().to_string();
        if let Some(l) = self.line {
            s.push_str(&format!(":{l}"));
            if let Some(c) = self.column {
                s.push_str(&format!(":{c}"));
            }
        }
        s.push_str(": ");
        if !self.key_path.is_empty() {
            s.push_str(&self.key_path);
            s.push_str(": ");
        }
        s.push_str(&self.message);
        s
    }
}

/// Splits a key path like `models.acme/chat.routes[1].provider` into segments
/// (`models`, `acme/chat`, `routes`, `[1]`, `provider`). Map keys containing dots are not
/// supported by the locator (it then reports the nearest parent it found).
fn segments(key_path: &str) -> Vec<String> {
    let mut out = Vec::new();
    for part in key_path.split('.') {
        let mut rest = part;
        while let Some(i) = rest.find('[') {
            if i > 0 {
                out.push(rest[..i].to_string());
            }
            let end = rest[i..].find(']').map_or(rest.len(), |e| i + e + 1);
            out.push(rest[i..end].to_string());
            rest = &rest[end..];
        }
        if !rest.is_empty() {
            out.push(rest.to_string());
        }
    }
    out
}

/// Finds the 1-based (line, column) of `key_path` in block-style YAML `source`, or of its
/// deepest ancestor that can be found. Only used when an error is reported.
pub fn locate_key(source: &str, key_path: &str) -> Option<(usize, usize)> {
    let lines: Vec<&str> = source.lines().collect();
    let mut found: Option<(usize, usize)> = None;
    // Search window: [start, end) lines, with items deeper than `min_indent`.
    let mut start = 0usize;
    let mut end = lines.len();
    let mut min_indent: isize = -1;
    for seg in segments(key_path) {
        let hit = if let Some(idx) = seg.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            let want: usize = idx.parse().ok()?;
            let mut count = 0usize;
            let mut hit = None;
            let mut item_indent: Option<usize> = None;
            for (i, line) in lines.iter().enumerate().take(end).skip(start) {
                let ind = indent(line);
                let t = line.trim_start();
                if t.is_empty() || t.starts_with('#') {
                    continue;
                }
                if (ind as isize) <= min_indent && !t.starts_with('-') {
                    break;
                }
                if t.starts_with("- ") || t == "-" {
                    if item_indent.is_none() {
                        item_indent = Some(ind);
                    }
                    if Some(ind) == item_indent {
                        if count == want {
                            hit = Some((i, ind + 2));
                            break;
                        }
                        count += 1;
                    }
                }
            }
            hit
        } else {
            let mut hit = None;
            for (i, line) in lines.iter().enumerate().take(end).skip(start) {
                let t = line.trim_start().trim_start_matches("- ");
                let ind = line.len() - t.len();
                if t.is_empty() || t.starts_with('#') {
                    continue;
                }
                if (ind as isize) <= min_indent && i > start {
                    break;
                }
                let key_matches = t
                    .strip_prefix(seg.as_str())
                    .or_else(|| t.strip_prefix(&format!("\"{seg}\"")))
                    .or_else(|| t.strip_prefix(&format!("'{seg}'")))
                    .is_some_and(|r| r.trim_start().starts_with(':'));
                if key_matches {
                    hit = Some((i, ind));
                    break;
                }
            }
            hit
        };
        match hit {
            Some((line, col)) => {
                found = Some((line + 1, col + 1));
                min_indent = col as isize;
                start = line + 1;
                // The value may sit on the same line (flow style): keep the line as a bound.
                if start >= end {
                    break;
                }
                // A block item (`- key: v`) may hold the next key on its own line; a flow
                // item (`- {key: v}`) holds everything below it on that line.
                let item = lines[line].trim_start().strip_prefix("- ");
                if lines[line].trim_end().ends_with(':')
                    || item.is_some_and(|r| !r.trim_start().starts_with(['{', '[']))
                {
                    continue;
                }
                // Scalar or flow value on this line: nothing deeper to find below it.
                let _ = &mut end;
                break;
            }
            None => break,
        }
    }
    found
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = "server:\n  listen: 127.0.0.1:8080\nmodels:\n  acme/chat:\n    routes:\n      - provider: p1\n        upstream_model: m1\n      - provider: nope\n        upstream_model: m2\n";

    #[test]
    fn locates_nested_keys_and_list_items() {
        assert_eq!(locate_key(SRC, "server.listen"), Some((2, 3)));
        assert_eq!(
            locate_key(SRC, "models.acme/chat.routes[1].provider"),
            Some((8, 9))
        );
        assert_eq!(
            locate_key(SRC, "models.acme/chat.routes[0].upstream_model"),
            Some((7, 9))
        );
    }

    #[test]
    fn a_key_inside_a_flow_item_is_located_at_its_item() {
        let src = "tls:\n  certificates:\n    - {cert_path: a.pem, key_path: a.key}\n    - cert_path: b.pem\n      key_path: b.key\n";
        assert_eq!(
            locate_key(src, "tls.certificates[0].cert_path"),
            Some((3, 7))
        );
        assert_eq!(
            locate_key(src, "tls.certificates[1].key_path"),
            Some((5, 7))
        );
    }

    #[test]
    fn falls_back_to_nearest_parent() {
        assert_eq!(locate_key(SRC, "models.acme/chat.missing"), Some((4, 3)));
    }

    #[test]
    fn renders_file_line_key_message() {
        let e = ConfigError::at(
            Path::new("x.yaml"),
            Some(SRC),
            "models.acme/chat.routes[1].provider",
            "unknown provider `nope`",
        );
        assert_eq!(
            e.to_string(),
            "x.yaml:8:9: models.acme/chat.routes[1].provider: unknown provider `nope`"
        );
    }
}
