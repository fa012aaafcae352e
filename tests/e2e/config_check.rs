//! `sluice -t -c FILE` (the config test, like `nginx -t`) on the shipped configs and on
//! fixtures: every good file exits 0; every bad file exits non-zero and prints the
//! `file:line:col: key: message` its first line promises (`# expect: <substring>`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Variable the good fixtures read their provider key from (set for every run).
const FIXTURE_KEY_ENV: &str = "MOCK_API_KEY";
/// Variable the `missing_api_key_env` fixture names (removed for every run).
const UNSET_ENV: &str = "SLUICE_FIXTURE_SURELY_UNSET_KEY";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check(file: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("-t")
        .arg("-c")
        .arg(file)
        .env(FIXTURE_KEY_ENV, "sk-fixture-provider-key")
        .env_remove(UNSET_ENV)
        .env_remove("RUST_LOG")
        .output()
        .expect("run sluice -t")
}

/// `*.yaml` files under `dir` (recursively when `deep`), sorted.
fn yaml_files(dir: &Path, deep: bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("read {}: {e}", d.display())) {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                if deep {
                    stack.push(p);
                }
            } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn assert_valid(file: &Path) {
    let out = check(file);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} should be valid; exit {:?}\nstderr: {stderr}",
        file.display(),
        out.status.code()
    );
    assert!(stdout.contains("is valid"), "stdout: {stdout}");
}

#[test]
fn shipped_configs_are_valid() {
    // conf/examples/ name host files (certificates) that exist only where the example is
    // installed: `readme::the_nginx_migration_example_is_in_the_readme_and_passes_sluice_t`
    // checks them with certificates it makes.
    let examples = root().join("conf/examples");
    let files: Vec<PathBuf> = yaml_files(&root().join("conf"), true)
        .into_iter()
        .filter(|f| !f.starts_with(&examples))
        .collect();
    assert!(
        files.iter().any(|f| f.ends_with("conf/sluice.yaml")),
        "conf/sluice.yaml missing: {files:?}"
    );
    for f in &files {
        assert_valid(f);
    }
}

#[test]
fn good_fixtures_are_valid() {
    let files = yaml_files(&root().join("tests/fixtures/config/good"), false);
    assert!(files.len() >= 3, "{files:?}");
    for f in &files {
        assert_valid(f);
    }
}

#[test]
fn bad_fixtures_fail_with_file_line_key_and_message() {
    let files = yaml_files(&root().join("tests/fixtures/config/bad"), false);
    assert!(files.len() >= 7, "{files:?}");
    let mut failures = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read fixture");
        let expect = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("# expect: "))
            .unwrap_or_else(|| panic!("{} lacks a first-line `# expect: …`", f.display()))
            .trim();
        let name = f.file_name().and_then(|n| n.to_str()).expect("name");
        assert!(
            expect.starts_with(&format!("{name}:")),
            "{name}: the expectation must start with `{name}:LINE:COL: key`"
        );
        let out = check(f);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            failures.push(format!("{name}: accepted (exit 0)"));
        } else if !stderr.contains(expect) {
            failures.push(format!(
                "{name}: stderr lacks\n    {expect}\n  got\n    {}",
                stderr.trim()
            ));
        } else if !stderr.contains(&f.display().to_string()) {
            failures.push(format!("{name}: the message does not name the file path"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_categories_the_contract_names_are_covered() {
    // Unknown key, unknown provider in a route, bad base_url, unset api_key_env, duplicate,
    // YAML syntax, key → unknown tenant: each category is a fixture that `sluice -t`
    // really refuses with this message (checked on its stderr, not on the fixture's
    // comment).
    let dir = root().join("tests/fixtures/config/bad");
    let cases = [
        ("unknown_key_route.yaml", "routes[0].priorty: unknown field `priorty`"),
        ("unknown_key_top.yaml", "budgets: unknown field `budgets`"),
        (
            "unknown_provider.yaml",
            "routes[0].provider: unknown provider `local-mok` (known: local-mock)",
        ),
        (
            "bad_base_url_scheme.yaml",
            "providers.local-mock.base_url: `ftp://127.0.0.1:18000/v1` must start with http:// or https://",
        ),
        (
            "missing_api_key_env.yaml",
            "providers.local-mock.api_key_env: environment variable `SLUICE_FIXTURE_SURELY_UNSET_KEY` is not set",
        ),
        ("duplicate_virtual_key.yaml", "virtual_keys[1]: duplicate virtual key"),
        (
            "duplicate_provider_id.yaml",
            "providers.local-mock: duplicate key `local-mock`",
        ),
        ("yaml_syntax.yaml", "while scanning a quoted scalar"),
        ("unknown_tenant.yaml", "virtual_keys[0].tenant: unknown tenant `team-b`"),
    ];
    for (file, want) in cases {
        let out = check(&dir.join(file));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{file} accepted");
        assert!(
            stderr.contains(want),
            "{file}: stderr lacks\n    {want}\n  got\n    {}",
            stderr.trim()
        );
    }
}

#[test]
fn a_missing_file_is_an_error_naming_it() {
    let out = check(Path::new("/nonexistent/sluice-e2e.yaml"));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/sluice-e2e.yaml"), "{stderr}");
}

#[test]
fn the_provider_key_from_the_environment_is_never_printed() {
    let out = check(&root().join("tests/fixtures/config/good/minimal.yaml"));
    assert!(out.status.success());
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains("sk-fixture-provider-key"), "{all}");
}
