//! The process and its listeners (issue 30, item 1): a listener that cannot be bound stops
//! the start at once with an error naming the key and the address and a non-zero exit
//! (before, Sluice logged "listening on", retried the bind for 30 s, lost both service
//! threads and ran on serving nothing, `/readyz` answering 200); `/readyz` names the
//! listeners this process holds; a port-0 listener's log line names the port it got.

use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{basic_config, free_port, get, Mock, Sluice, TempDir};

/// The exit status and stderr of `sluice -c` on `yaml`, or a panic if it is still running
/// after `within`.
fn run_until_exit(yaml: &str, within: Duration) -> (std::process::ExitStatus, String, Duration) {
    let dir = TempDir::new("listen");
    let conf = dir.path().join("sluice.yaml");
    std::fs::write(&conf, yaml).expect("write config");
    let log = dir.path().join("sluice.log");
    let started = Instant::now();
    let mut child = Command::new(sluice_exe())
        .current_dir(dir.path())
        .arg("-c")
        .arg(&conf)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn sluice");
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let took = started.elapsed();
            return (
                status,
                std::fs::read_to_string(&log).unwrap_or_default(),
                took,
            );
        }
        if started.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "sluice still runs {} s after its start on a busy port; log:\n{}",
                within.as_secs(),
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The binary under test (`SLUICE_E2E_BIN` runs these against another build, as the
/// harness does).
fn sluice_exe() -> std::ffi::OsString {
    std::env::var_os("SLUICE_E2E_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_sluice").into())
}

fn config_on(listen: &str, admin: &str) -> String {
    basic_config("http://127.0.0.1:9/v1", "")
        .replace("{listen}", listen)
        .replace("{admin}", admin)
}

#[test]
fn a_busy_proxy_or_admin_port_stops_the_start_with_a_clear_error_and_exit_1() {
    // Another process's listener (SO_REUSEADDR, as std sets it: Sluice's own bind sets it
    // too, and still may not share a port someone listens on).
    let busy = TcpListener::bind("127.0.0.1:0").expect("bind");
    let busy_addr = busy.local_addr().expect("addr").to_string();

    let admin = format!("127.0.0.1:{}", free_port());
    let (status, log, took) =
        run_until_exit(&config_on(&busy_addr, &admin), Duration::from_secs(10));
    eprintln!(
        "busy server.listen: exit {:?} after {} ms",
        status.code(),
        took.as_millis()
    );
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        took < Duration::from_secs(5),
        "exit took {} ms",
        took.as_millis()
    );
    assert!(
        log.contains(&format!(
            "ERROR sluice cannot listen on {busy_addr} (server.listen): Address already in use"
        )),
        "{log}"
    );
    assert!(log.contains("ss -ltnp"), "{log}");
    assert!(
        !log.contains("sluice listening on"),
        "never claims to listen: {log}"
    );
    // Nothing answers on the admin port: the process is gone, not serving /readyz.
    assert!(std::net::TcpStream::connect(&admin).is_err());

    let listen = format!("127.0.0.1:{}", free_port());
    let (status, log, took) =
        run_until_exit(&config_on(&listen, &busy_addr), Duration::from_secs(10));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(took < Duration::from_secs(5));
    assert!(
        log.contains(&format!(
            "cannot listen on {busy_addr} (server.admin_listen)"
        )),
        "{log}"
    );
    // The proxy port was not left bound by the failed start.
    TcpListener::bind(&listen).expect("the proxy port is free again");
    drop(busy);
}

#[test]
fn readyz_names_the_listeners_this_process_holds() {
    let mock = Mock::start("{}");
    let s = Sluice::start(&basic_config(&mock.base_url(), ""));
    let r = get(s.admin, "/readyz", &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    assert!(
        text.contains(&format!("listening on {} (server.listen)", s.addr)),
        "{text}"
    );
    assert!(
        text.contains(&format!("listening on {} (server.admin_listen)", s.admin)),
        "{text}"
    );
}

#[test]
fn a_port_0_listener_logs_the_port_it_was_given_and_serves_there() {
    let admin_port = free_port();
    let dir = TempDir::new("port0");
    let conf = dir.path().join("sluice.yaml");
    std::fs::write(
        &conf,
        config_on("127.0.0.1:0", &format!("127.0.0.1:{admin_port}")),
    )
    .expect("write config");
    let log = dir.path().join("sluice.log");
    let mut child = Command::new(sluice_exe())
        .current_dir(dir.path())
        .arg("-c")
        .arg(&conf)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn sluice");
    let logged = crate::harness::eventually(Duration::from_secs(20), || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("sluice listening on 127.0.0.1:")
    });
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let given: Option<u16> = text
        .lines()
        .find(|l| l.contains("sluice listening on"))
        .and_then(|l| l.split("listening on 127.0.0.1:").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok());
    let serves = given.is_some_and(|port| {
        crate::harness::eventually(Duration::from_secs(10), || {
            crate::harness::listens_on(child.id(), port)
        }) && get(
            format!("127.0.0.1:{port}").parse().expect("addr"),
            "/v1/models",
            &[("authorization", &format!("Bearer {}", crate::harness::KEY))],
        )
        .status
            == 200
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(logged, "{text}");
    assert_ne!(given, Some(0), "{text}");
    assert!(serves, "port {given:?} does not serve; log:\n{text}");
}
