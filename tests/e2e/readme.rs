//! The README as a new user follows it: its set-up commands, every YAML config block passing
//! `sluice -t` as written (with the provider key variables it says to set), its key example
//! matching what `sluice key new` prints, the Nginx migration example (the same text as
//! `conf/examples/nginx-migration.yaml`) passing `sluice -t` with certificates made here, and
//! `scripts/install.sh` putting the binary, unit and config in place.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::tls::Pki;
use crate::harness::TempDir;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn readme() -> String {
    std::fs::read_to_string(root().join("README.md")).expect("read README.md")
}

/// The fenced blocks of `lang` in `text`, in order.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur: Option<String> = None;
    for line in text.lines() {
        match cur.as_mut() {
            None if line.trim_start() == format!("```{lang}") => cur = Some(String::new()),
            None => {}
            Some(_) if line.trim_start() == "```" => out.extend(cur.take()),
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
        }
    }
    out
}

fn check(file: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sluice"));
    cmd.arg("-t").arg("-c").arg(file);
    cmd.env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("AZURE_OPENAI_API_KEY")
        .env_remove("GEMINI_API_KEY")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_SHARED_CREDENTIALS_FILE")
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run sluice -t")
}

#[test]
fn the_quick_start_commands_are_the_two_scripts() {
    let sh = blocks(&readme(), "sh");
    assert_eq!(sh[0].trim(), "bash scripts/run.sh");
    assert_eq!(sh[1].trim(), "bash scripts/test.sh");
}

#[test]
fn the_readme_example_config_passes_sluice_t_as_written() {
    let text = readme();
    let configs: Vec<String> = blocks(&text, "yaml")
        .into_iter()
        .filter(|b| is_whole_config(b))
        .collect();
    assert!(!configs.is_empty(), "no full config block in the README");
    let dir = TempDir::new("readme");
    // A service-account key file for the Vertex AI block (never contacted by `-t`).
    let vertex_key = crate::vertex::TestKey::new("https://oauth2.googleapis.com/token");
    let keys = [
        ("OPENAI_API_KEY", "sk-test-openai"),
        ("ANTHROPIC_API_KEY", "sk-ant-test"),
        ("AZURE_OPENAI_API_KEY", "azure-test-key"),
        ("GEMINI_API_KEY", "gemini-test-key"),
        ("AWS_ACCESS_KEY_ID", "AKIAREADMEEXAMPLE001"),
        ("AWS_SECRET_ACCESS_KEY", "readme-test-secret"),
        (
            "GOOGLE_APPLICATION_CREDENTIALS",
            vertex_key.file.to_str().expect("utf-8 path"),
        ),
    ];
    for (i, yaml) in configs.iter().enumerate() {
        let file = dir.path().join(format!("example-{i}.yaml"));
        std::fs::write(&file, yaml).expect("write");
        let out = check(&file, &keys);
        assert!(
            out.status.success(),
            "README config block {i} fails `sluice -t`:\n{yaml}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Without the variables the README says to set, it names every one of them at once.
        if yaml.contains("api_key_env: ") {
            let out = check(&file, &[]);
            assert!(!out.status.success());
            let stderr = String::from_utf8_lossy(&out.stderr);
            for var in ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"] {
                if yaml.contains(&format!("api_key_env: {var}")) {
                    assert!(stderr.contains(&format!("`{var}`")), "{var}: {stderr}");
                }
            }
            assert!(stderr.contains("is not set"), "{stderr}");
        }
    }
    // The section fragments (providers, keys, tenants), pasted into the first config, pass too.
    for fragment in fragments(&text) {
        let merged = paste(&configs[0], &fragment);
        let file = dir.path().join("fragment.yaml");
        std::fs::write(&file, &merged).expect("write");
        let out = check(&file, &keys);
        assert!(
            out.status.success(),
            "README fragment fails `sluice -t`:\n{merged}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A README YAML block that is a whole config (not a section to paste): `server:` first and
/// `models:` in it.
fn is_whole_config(block: &str) -> bool {
    block.starts_with("server:") && block.contains("\nmodels:")
}

/// The README's YAML blocks that are top-level sections to paste (not a whole config, which
/// has `models:`, not a named file).
fn fragments(text: &str) -> Vec<String> {
    blocks(text, "yaml")
        .into_iter()
        .filter(|b| !b.starts_with('#') && !is_whole_config(b))
        .collect()
}

/// `base` with each top-level section of `fragment` put in place of the same section (its
/// indented lines), or appended when `base` lacks it: what a user pasting it does.
fn paste(base: &str, fragment: &str) -> String {
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in fragment.lines() {
        if !line.starts_with(' ') && !line.starts_with('#') && !line.is_empty() {
            sections.push((line.to_string(), String::new()));
        }
        if let Some((_, body)) = sections.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    let mut merged = String::new();
    let mut skipping = false;
    for line in base.lines() {
        let top = !line.starts_with(' ') && !line.is_empty();
        if top {
            skipping = false;
        }
        let name = line.split('#').next().unwrap_or("").trim_end();
        if top {
            if let Some(i) = sections.iter().position(|(s, _)| s == name) {
                merged.push_str(&sections.remove(i).1);
                skipping = true;
                continue;
            }
        }
        if !skipping {
            merged.push_str(line);
            merged.push('\n');
        }
    }
    for (_, body) in sections {
        merged.push_str(&body);
    }
    merged
}

#[test]
fn the_readme_key_entries_pasted_into_the_default_config_pass_sluice_t() {
    let text = readme();
    let default = std::fs::read_to_string(root().join("conf/sluice.yaml")).expect("default config");
    let key_blocks: Vec<String> = fragments(&text)
        .into_iter()
        .filter(|b| b.contains("virtual_keys:"))
        .collect();
    assert!(
        !key_blocks.is_empty(),
        "no virtual_keys block in the README"
    );
    let dir = TempDir::new("readme-keys");
    for fragment in key_blocks {
        let merged = paste(&default, &fragment);
        let file = dir.path().join("sluice.yaml");
        std::fs::write(&file, &merged).expect("write");
        let out = check(&file, &[]);
        assert!(
            out.status.success(),
            "README key block pasted into conf/sluice.yaml fails `sluice -t`:\n{merged}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Each variant of `block` that a comment on one of its lines offers as another form of
/// that line's value (`key: value  # or <form>`, where the form is YAML: it has `{` or `[`;
/// a comment in words, `# or a number of ms`, is not a form): the block with the form in
/// place of the value. A reader pastes those forms as they are shown.
fn comment_alternatives(block: &str) -> Vec<String> {
    let lines: Vec<&str> = block.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some((code, comment)) = line.split_once('#') else {
            continue;
        };
        let Some(form) = comment.trim().strip_prefix("or ") else {
            continue;
        };
        let form = form.split(';').next().unwrap_or("").trim();
        let Some((key, _)) = code.split_once(':') else {
            continue;
        };
        if !(form.contains('{') || form.contains('[')) {
            continue;
        }
        let mut variant: Vec<String> = lines.iter().map(|l| (*l).to_string()).collect();
        variant[i] = format!("{key}: {form}");
        out.push(variant.join("\n") + "\n");
    }
    out
}

#[test]
fn the_other_forms_readme_comments_offer_pass_sluice_t_too() {
    let text = readme();
    assert!(
        blocks(&text, "yaml")
            .iter()
            .filter(|b| is_whole_config(b))
            .all(|b| comment_alternatives(b).is_empty()),
        "a whole README config offers another form in a comment: check it here too"
    );
    let default = std::fs::read_to_string(root().join("conf/sluice.yaml")).expect("default config");
    let dir = TempDir::new("readme-forms");
    let mut checked = 0;
    for fragment in fragments(&text) {
        for variant in comment_alternatives(&fragment) {
            let merged = paste(&default, &variant);
            let file = dir.path().join("sluice.yaml");
            std::fs::write(&file, &merged).expect("write");
            let out = check(&file, &[]);
            assert!(
                out.status.success(),
                "a form a README comment offers fails `sluice -t`:\n{variant}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no README comment offers another form");
}

/// The README's YAML blocks that are whole files named by their first line (`# path`), in
/// order: (path, content).
fn named_files(text: &str) -> Vec<(String, String)> {
    blocks(text, "yaml")
        .into_iter()
        .filter_map(|b| {
            let first = b.lines().next()?.strip_prefix("# ")?.trim().to_string();
            (first.ends_with(".yaml") && !first.contains(' ')).then_some((first, b))
        })
        .collect()
}

#[test]
fn the_readme_include_example_passes_sluice_t_as_written() {
    let files = named_files(&readme());
    let main = files
        .iter()
        .find(|(_, b)| b.contains("\ninclude:"))
        .expect("an include example in the README");
    let dir = TempDir::new("readme-include");
    for (path, content) in &files {
        let file = dir.path().join(path);
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(&file, content).expect("write");
    }
    let main_file = dir.path().join(&main.0);
    let out = check(&main_file, &[("OPENAI_API_KEY", "sk-test-openai")]);
    assert!(
        out.status.success(),
        "README include example fails `sluice -t`:\n{files:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Each included file is really read: without it the example fails (a glob that
    // matches nothing, a folder without the model's routes).
    for (path, _) in files.iter().filter(|(p, _)| *p != main.0) {
        let file = dir.path().join(path);
        let saved = std::fs::read(&file).expect("read");
        std::fs::remove_file(&file).expect("remove");
        let out = check(&main_file, &[("OPENAI_API_KEY", "sk-test-openai")]);
        assert!(!out.status.success(), "{path} is not needed by the example");
        std::fs::write(&file, saved).expect("restore");
    }
    // The scalar form the README warns about is rejected as it says.
    let scalar = dir.path().join("scalar.yaml");
    std::fs::write(&scalar, "include: conf.d\n").expect("write");
    let out = check(&scalar, &[("OPENAI_API_KEY", "sk-test-openai")]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("expected a sequence"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_nginx_migration_example_is_in_the_readme_and_passes_sluice_t() {
    let example = std::fs::read_to_string(root().join("conf/examples/nginx-migration.yaml"))
        .expect("read conf/examples/nginx-migration.yaml");
    let text = readme();
    let shown = blocks(&text, "yaml")
        .into_iter()
        .find(|b| b.lines().next() == example.lines().next())
        .expect("the README shows conf/examples/nginx-migration.yaml");
    assert_eq!(
        shown, example,
        "the README's copy of conf/examples/nginx-migration.yaml differs from the file"
    );
    let section = text
        .split("\n## Migrating from Nginx\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a `## Migrating from Nginx` section");
    for directive in [
        "proxy_buffering off",
        "proxy_read_timeout",
        "proxy_http_version 1.1",
        "client_max_body_size",
        "limit_req",
        "limit_conn",
        "ssl_certificate",
        "`upstream ",
        "keepalive",
        "X-Accel-Buffering",
    ] {
        assert!(
            section.contains(directive),
            "the migration section does not map `{directive}`"
        );
    }

    // The example as an operator installs it: the file, and its certificates in tls/ beside it.
    let pki = Pki::new();
    let dir = TempDir::new("nginx-migration");
    let tls = dir.path().join("tls");
    std::fs::create_dir_all(&tls).expect("mkdir tls");
    for name in ["api.example.com", "ui.example.com"] {
        pki.issue(name, &[name]);
        for ext in ["pem", "key"] {
            std::fs::copy(pki.path(name, ext), tls.join(format!("{name}.{ext}"))).expect("copy");
        }
    }
    let config = dir.path().join("nginx-migration.yaml");
    std::fs::write(&config, &example).expect("write");
    let keys = [("OPENAI_API_KEY", "sk-test-openai")];
    let out = check(&config, &keys);
    assert!(
        out.status.success(),
        "conf/examples/nginx-migration.yaml fails `sluice -t`:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The certificates are really loaded: without the UI's the check names its entry.
    std::fs::remove_file(tls.join("ui.example.com.pem")).expect("remove");
    let out = check(&config, &keys);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("server.tls.certificates[1].cert_path"),
        "{stderr}"
    );
}

#[test]
fn install_sh_stages_binary_unit_config_and_env_file() {
    let dest = TempDir::new("install");
    let out = Command::new("bash")
        .arg(root().join("scripts/install.sh"))
        .env("DESTDIR", dest.path())
        .env("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
        .output()
        .expect("run install.sh");
    assert!(out.status.success(), "{out:?}");
    let d = dest.path();
    let bin = d.join("usr/bin/sluice");
    assert_eq!(
        std::fs::read(&bin).expect("installed binary"),
        std::fs::read(env!("CARGO_BIN_EXE_sluice")).expect("built binary")
    );
    let unit = std::fs::read_to_string(d.join("etc/systemd/system/sluice.service")).expect("unit");
    assert!(unit.contains("ExecStart=/usr/bin/sluice -c /etc/sluice/sluice.yaml"));
    assert!(unit.contains("User=sluice"));
    // The optional graceful-upgrade drop-in is shipped with the docs, not enabled.
    assert_eq!(
        std::fs::read(d.join("usr/share/doc/sluice/graceful-upgrade.conf")).expect("drop-in"),
        std::fs::read(root().join("systemd/graceful-upgrade.conf")).expect("shipped drop-in")
    );
    assert!(!d.join("etc/systemd/system/sluice.service.d").exists());
    // The unit's Documentation= points at a file the script installs.
    let doc = unit
        .lines()
        .find_map(|l| l.strip_prefix("Documentation=file://"))
        .expect("Documentation=file:// in the unit");
    assert_eq!(
        std::fs::read_to_string(d.join(doc.trim_start_matches('/'))).expect("installed doc"),
        readme()
    );
    let conf = d.join("etc/sluice/sluice.yaml");
    assert_eq!(
        std::fs::read_to_string(&conf).expect("config"),
        std::fs::read_to_string(root().join("conf/sluice.yaml")).expect("shipped config")
    );
    use std::os::unix::fs::PermissionsExt;
    let env_mode = std::fs::metadata(d.join("etc/sluice/sluice.env"))
        .expect("env file")
        .permissions()
        .mode();
    assert_eq!(env_mode & 0o777, 0o600);
    // The installed binary validates the installed config.
    let out = Command::new(&bin)
        .arg("-t")
        .arg("-c")
        .arg(&conf)
        .output()
        .expect("installed sluice -t");
    assert!(out.status.success(), "{out:?}");
    // A second run keeps an edited config.
    std::fs::write(&conf, "# edited\n").expect("edit");
    let out = Command::new("bash")
        .arg(root().join("scripts/install.sh"))
        .env("DESTDIR", d)
        .env("SLUICE_BIN", env!("CARGO_BIN_EXE_sluice"))
        .output()
        .expect("rerun install.sh");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(&conf).expect("config"),
        "# edited\n"
    );
}

#[test]
fn install_sh_under_sudo_without_a_release_binary_refuses_to_build_as_root() {
    // A copy of the script in a tree without target/release/sluice, run as "root" (a shimmed
    // `id -u`) under sudo for another user; `cargo` is a shim that records being called.
    let tree = TempDir::new("install-sudo");
    let t = tree.path();
    std::fs::create_dir_all(t.join("scripts")).expect("mkdir");
    std::fs::create_dir_all(t.join("shims")).expect("mkdir");
    std::fs::copy(
        root().join("scripts/install.sh"),
        t.join("scripts/install.sh"),
    )
    .expect("copy install.sh");
    let called = t.join("cargo-called");
    let shims = [
        (
            "id",
            "#!/bin/sh\n[ \"$1\" = -u ] && { echo 0; exit 0; }\nexec /usr/bin/id \"$@\"\n"
                .to_string(),
        ),
        ("cargo", format!("#!/bin/sh\ntouch {}\n", called.display())),
    ];
    for (name, body) in shims {
        let p = t.join("shims").join(name);
        std::fs::write(&p, body).expect("write shim");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let path = format!(
        "{}:{}",
        t.join("shims").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .arg(t.join("scripts/install.sh"))
        .env("PATH", path)
        .env("SUDO_USER", "alice")
        .env("DESTDIR", t.join("dest"))
        .env_remove("SLUICE_BIN")
        .output()
        .expect("run install.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{out:?}");
    assert!(stderr.contains("does not build it as root"), "{stderr}");
    assert!(
        stderr.contains("cargo build --locked --release"),
        "{stderr}"
    );
    assert!(stderr.contains("SLUICE_BIN="), "{stderr}");
    assert!(!called.exists(), "install.sh ran cargo as root");
    assert!(!t.join("dest/usr/bin/sluice").exists());
}

#[test]
fn install_sh_takes_the_release_binary_from_cargo_target_dir() {
    // A copy of the script and what it installs, in a tree without target/; the release
    // build is where CARGO_TARGET_DIR says cargo puts it. (The tree has no
    // scripts/install-deps.sh and `cargo` is a shim recording calls: looking in ./target
    // and building would fail here instead of building for minutes.)
    let tree = TempDir::new("install-target-dir");
    let t = tree.path();
    for dir in ["scripts", "systemd", "conf", "shims", "out/release"] {
        std::fs::create_dir_all(t.join(dir)).expect("mkdir");
    }
    for file in [
        "scripts/install.sh",
        "systemd/sluice.service",
        "systemd/graceful-upgrade.conf",
        "systemd/sluice.env.example",
        "conf/sluice.yaml",
        "README.md",
    ] {
        std::fs::copy(root().join(file), t.join(file)).expect("copy");
    }
    std::fs::copy(env!("CARGO_BIN_EXE_sluice"), t.join("out/release/sluice")).expect("copy");
    let called = t.join("cargo-called");
    let shim = t.join("shims/cargo");
    std::fs::write(
        &shim,
        format!("#!/bin/sh\ntouch {}\nexit 1\n", called.display()),
    )
    .expect("write shim");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = Command::new("bash")
        .arg(t.join("scripts/install.sh"))
        .env(
            "PATH",
            format!(
                "{}:{}",
                t.join("shims").display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env("DESTDIR", t.join("dest"))
        .env("CARGO_TARGET_DIR", t.join("out"))
        .env_remove("SLUICE_BIN")
        .output()
        .expect("run install.sh");
    assert!(out.status.success(), "{out:?}");
    assert!(
        !called.exists(),
        "install.sh ran cargo although the binary was built"
    );
    assert_eq!(
        std::fs::read(t.join("dest/usr/bin/sluice")).expect("installed binary"),
        std::fs::read(env!("CARGO_BIN_EXE_sluice")).expect("built binary")
    );
}

/// The effective `[Service]` values of `key` in `unit` then `dropin` (systemd's rule: an
/// empty assignment clears the list).
fn unit_values(unit: &str, dropin: &str, key: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in unit.lines().chain(dropin.lines()) {
        if let Some(v) = line.strip_prefix(key).and_then(|r| r.strip_prefix('=')) {
            if v.trim().is_empty() {
                out.clear();
            } else {
                out.push(v.trim().to_string());
            }
        }
    }
    out
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one end-to-end scenario, read top to bottom"
)]
fn the_graceful_upgrade_drop_in_commands_hand_the_listener_over_and_move_the_pid_file() {
    // What systemd runs with systemd/graceful-upgrade.conf, replayed outside systemd: the
    // ExecStartPre/ExecStart commands, then the ExecReload commands in order with $MAINPID
    // set to the pid in PIDFile=, as `systemctl reload` does; then PIDFile= must name the
    // new process (systemd re-reads it after a reload), which serves, while the old one exits.
    // Not covered here: systemd itself (its PID file and cgroup handling).
    use crate::cancellation::chat_body;
    use crate::harness::{eventually, post_json, Mock, KEY};
    use std::time::{Duration, Instant};

    let unit = std::fs::read_to_string(root().join("systemd/sluice.service")).expect("unit");
    let dropin =
        std::fs::read_to_string(root().join("systemd/graceful-upgrade.conf")).expect("drop-in");
    assert_eq!(unit_values(&unit, &dropin, "Type"), ["simple", "forking"]);
    let pid_path = unit_values(&unit, &dropin, "PIDFile")
        .pop()
        .expect("PIDFile=");
    // The drop-in tells the operator to set exactly these paths in the config.
    assert!(
        dropin.contains(&format!("pid_file: {pid_path}")),
        "{dropin}"
    );
    assert!(dropin.contains("upgrade_sock: /run/sluice/"), "{dropin}");

    let mock = Mock::start(r#"{"tokens":2}"#);
    let crate::upgrade::DaemonFiles {
        dir: _dir,
        pid_file,
        error_log,
        cfg_path,
        port,
    } = crate::upgrade::DaemonFiles::write("sd-upgrade", &mock, "  shutdown_grace_ms: 1000\n");
    let run = |cmd: &str, mainpid: &str| {
        let cmd = cmd
            .replace("/usr/bin/sluice", env!("CARGO_BIN_EXE_sluice"))
            .replace("/etc/sluice/sluice.yaml", &cfg_path.to_string_lossy());
        // Its output goes to a file, kept for the failure message only: a pipe would keep
        // the test waiting for as long as a forked daemon held it open.
        let out_path = error_log.with_extension("cmd-output");
        let out = std::fs::File::create(&out_path).expect("command output file");
        let status = Command::new("sh")
            .arg("-c")
            .arg(&cmd)
            .env("MAINPID", mainpid)
            .env("RUST_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().expect("dup"))
            .stderr(out)
            .status()
            .expect("sh");
        assert!(
            status.success(),
            "`{cmd}` exited {status:?}\n--- its output ---\n{}\n--- the daemons' error log ---\n{}",
            std::fs::read_to_string(&out_path).unwrap_or_default(),
            std::fs::read_to_string(&error_log).unwrap_or_default()
        );
    };
    let read_pid =
        || -> Option<u32> { std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok() };
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    // Kills the daemons this test started if it fails (only pids running this config).
    struct Kill(Vec<u32>, String);
    impl Drop for Kill {
        fn drop(&mut self) {
            for pid in &self.0 {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                if String::from_utf8_lossy(&cmdline).contains(&self.1) {
                    let _ = Command::new("kill")
                        .args(["-KILL", &pid.to_string()])
                        .status();
                }
            }
        }
    }
    let mut guard = Kill(Vec::new(), cfg_path.to_string_lossy().into_owned());
    let log = || std::fs::read_to_string(&error_log).unwrap_or_default();

    for cmd in unit_values(&unit, &dropin, "ExecStartPre")
        .iter()
        .chain(&unit_values(&unit, &dropin, "ExecStart"))
    {
        run(cmd, "");
    }
    assert!(
        eventually(Duration::from_secs(10), || read_pid().is_some()),
        "no pid file"
    );
    let old = read_pid().expect("pid");
    guard.0.push(old);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let body = chat_body(false, "{}");
    let auth = format!("Bearer {KEY}");
    let serve = || {
        post_json(
            addr,
            "/v1/chat/completions",
            &[("authorization", &auth)],
            &body,
        )
        .status
    };
    assert!(
        eventually(Duration::from_secs(10), || std::net::TcpStream::connect(
            addr
        )
        .is_ok()),
        "the daemon does not listen:\n{}",
        log()
    );
    assert_eq!(serve(), 200);

    // Clients connect through the whole reload; each connection must be accepted.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut ok, mut refused) = (0u32, 0u32);
            let t = Instant::now();
            while !stop.load(std::sync::atomic::Ordering::SeqCst)
                && t.elapsed() < Duration::from_secs(30)
            {
                match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                    Ok(_) => ok += 1,
                    Err(_) => refused += 1,
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (ok, refused)
        })
    };
    let reload = Instant::now();
    for cmd in unit_values(&unit, &dropin, "ExecReload") {
        run(&cmd, &old.to_string());
    }
    let reload_took = reload.elapsed();
    // After the reload commands, PIDFile= names a new, live process.
    assert!(
        eventually(Duration::from_secs(10), || read_pid()
            .is_some_and(|p| p != old && alive(p))),
        "the pid file still names {old:?} ({:?}):\n{}",
        read_pid(),
        log()
    );
    let new = read_pid().expect("pid");
    guard.0.push(new);
    // The old process drains and exits (Pingora keeps it accepting for 5 s, then the grace).
    assert!(
        eventually(Duration::from_secs(20), || !alive(old)),
        "old {old} still runs:\n{}",
        log()
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (ok, refused) = clients.join().expect("clients");
    eprintln!("reload commands took {reload_took:?}; {ok} connections accepted, {refused} refused");
    assert_eq!(
        refused,
        0,
        "{refused} refused connections (of {})",
        ok + refused
    );
    assert!(ok > 10, "{ok}");
    assert_eq!(serve(), 200, "the new process does not serve:\n{}", log());
    assert!(reload_took < Duration::from_secs(10), "{reload_took:?}");
    let _ = Command::new("kill")
        .args(["-TERM", &new.to_string()])
        .status();
    assert!(
        eventually(Duration::from_secs(10), || !alive(new)),
        "new {new} ignores SIGTERM"
    );
}
