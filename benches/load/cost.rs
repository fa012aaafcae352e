//! The load bench's per-request cost columns (issue 31): instructions (Ir), allocations and
//! system calls per request and per streamed event of each target, as
//! `benches/callgrind_targets.sh` measures them under callgrind (load-independent), printed
//! beside the wall-clock figures of the same targets.
//!
//! `LOAD_INSTRUCTIONS=FILE` reads the script's `instructions.tsv` (made earlier, e.g. for the
//! same build); `LOAD_INSTRUCTIONS=run` runs the script first (before any load phase, so the
//! two do not share the CPUs) on the bench's own binaries, for the targets `LOAD_TARGETS`
//! names (`passthrough` is its `sluice-pass`), with `LOAD_INSTRUCTIONS_N` requests per phase
//! (default 200; 1–2 minutes per target). Unset: no cost columns.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{fmt_opt, median, Opts, Results, Scenario};

/// One target's cost in one scenario, per request (the idle background subtracted).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Cost {
    /// Instructions per request.
    ir: f64,
    /// Instructions per streamed event (`None` for non-stream requests).
    ir_event: Option<f64>,
    /// Calls into the allocator (malloc, calloc, realloc, the aligned ones) per request.
    allocs: f64,
    /// System calls per request.
    syscalls: f64,
}

/// Costs by (target name as the load bench names it, scenario as the script names it:
/// `unary`, `stream`, `burst`, `paced`).
pub(super) type Costs = BTreeMap<(String, String), Cost>;

/// The load bench's scenario of the script's scenario `name` (`paced`, token by token with
/// a delay so that the proxy reads each event alone, has none).
fn scenario(name: &str) -> Option<Scenario> {
    match name {
        "unary" => Some(Scenario::Unary),
        "stream" => Some(Scenario::Stream),
        "burst" => Some(Scenario::Burst),
        _ => None,
    }
}

/// The script's scenarios in the order they are printed.
const SCENARIOS: [&str; 4] = ["unary", "stream", "burst", "paced"];

/// Parses `instructions.tsv`: a header line naming the columns, then one line per target
/// and scenario; the columns read are `target`, `scenario`, `Ir_per_req`, `Ir_per_event`
/// (`-` when none), `allocs_per_req` and `syscalls_per_req`.
pub(super) fn parse(text: &str) -> Result<Costs, String> {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines.next().ok_or("empty file")?.split('\t').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| format!("no column {name}"))
    };
    let (t, s, ir, ev, al, sy) = (
        col("target")?,
        col("scenario")?,
        col("Ir_per_req")?,
        col("Ir_per_event")?,
        col("allocs_per_req")?,
        col("syscalls_per_req")?,
    );
    let mut out = Costs::new();
    for line in lines {
        let f: Vec<&str> = line.split('\t').collect();
        let get = |i: usize| {
            f.get(i)
                .copied()
                .ok_or_else(|| format!("short line {line:?}"))
        };
        let num = |i: usize| -> Result<f64, String> {
            get(i)?
                .parse()
                .map_err(|_| format!("not a number in column {} of {line:?}", i + 1))
        };
        let scen = get(s)?;
        if !SCENARIOS.contains(&scen) {
            return Err(format!("unknown scenario in {line:?}"));
        }
        let ir_event = match get(ev)? {
            "-" => None,
            _ => Some(num(ev)?),
        };
        out.insert(
            (get(t)?.to_string(), scen.to_string()),
            Cost {
                ir: num(ir)?,
                ir_event,
                allocs: num(al)?,
                syscalls: num(sy)?,
            },
        );
    }
    Ok(out)
}

/// The costs `LOAD_INSTRUCTIONS` asks for (see the module doc), or `None` with a note on
/// why when it cannot be had.
pub(super) fn load(o: &Opts, dir: &Path, notes: &mut Vec<String>) -> Option<Costs> {
    let how = std::env::var("LOAD_INSTRUCTIONS").ok()?;
    let file = if how == "run" {
        match run_script(o, dir) {
            Ok(f) => f,
            Err(e) => {
                notes.push(format!("instructions: {e}; cost columns skipped"));
                return None;
            }
        }
    } else {
        PathBuf::from(how)
    };
    let parsed = std::fs::read_to_string(&file)
        .map_err(|e| e.to_string())
        .and_then(|t| parse(&t));
    match parsed {
        Ok(c) => {
            notes.push(format!("instructions: from {}", file.display()));
            Some(c)
        }
        Err(e) => {
            notes.push(format!(
                "instructions: cannot read {}: {e}; cost columns skipped",
                file.display()
            ));
            None
        }
    }
}

/// Runs `benches/callgrind_targets.sh DIR/callgrind N` on the bench's binaries; its table
/// goes to stderr, its TSV path is returned.
fn run_script(o: &Opts, dir: &Path) -> Result<PathBuf, String> {
    for tool in ["valgrind", "callgrind_control", "curl"] {
        if super::find_program(tool).is_none() {
            return Err(format!("no {tool} (`apt-get install valgrind curl`)"));
        }
    }
    let targets: Vec<&str> = ["direct", "nginx", "pingora", "sluice-pass", "sluice"]
        .into_iter()
        .filter(|t| {
            let named = if *t == "sluice-pass" {
                "passthrough"
            } else {
                t
            };
            o.targets.iter().any(|x| x == named)
        })
        .collect();
    let out = dir.join("callgrind");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/callgrind_targets.sh");
    let n = super::env_u64("LOAD_INSTRUCTIONS_N", 200).to_string();
    eprintln!("load: callgrind_targets.sh for {targets:?}, {n} requests per phase");
    let status = Command::new("bash")
        .arg(script)
        .arg(&out)
        .arg(&n)
        .env("SLUICE_BIN", super::sluice_exe())
        .env("MOCK_BIN", super::mock_exe())
        .env("PINGORA_BIN", super::pingora::exe())
        .env("CG_TARGETS", targets.join(","))
        .stdout(Stdio::from(std::io::stderr()))
        .status()
        .map_err(|e| format!("cannot run {script}: {e}"))?;
    if !status.success() {
        return Err(format!("{script} failed ({status})"));
    }
    Ok(out.join("instructions.tsv"))
}

/// Median req/s of `target` in the script's scenario `s` over the rounds.
fn rps(results: &Results, s: &str, target: &str) -> Option<f64> {
    let s = scenario(s)?;
    results
        .iter()
        .find(|((sc, t), _)| *sc == s && *t == target)
        .and_then(|(_, rs)| median(rs.iter().map(|r| r.rps).collect()))
}

/// The main table's extra cells for `target`: non-stream and token-by-token stream Ir per
/// request (`-` where not measured).
pub(super) fn main_cells(costs: &Costs, target: &str) -> String {
    let ir = |s: &str| {
        costs
            .get(&(target.to_string(), s.to_string()))
            .map(|c| c.ir)
    };
    format!(
        " {} | {} |",
        fmt_opt(ir("unary"), 0),
        fmt_opt(ir("stream"), 0)
    )
}

/// Prints the cost table (every target and scenario measured: req/s and its ratio to nginx
/// from this run, Ir per request and its ratios to nginx and Pingora-smallest, Ir per
/// event, allocations and system calls per request) and the ratios.
pub(super) fn print(costs: &Costs, results: &Results) {
    let get = |t: &str, s: &str| costs.get(&(t.to_string(), s.to_string()));
    println!();
    println!("Per-request cost (callgrind, benches/callgrind_targets.sh; req/s from this run):");
    println!();
    println!("| target | scenario | req/s | / nginx | Ir/req | / nginx | / pingora | Ir/event | allocs/req | syscalls/req |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
        _ => "-".into(),
    };
    let mut targets: Vec<&str> = costs.keys().map(|(t, _)| t.as_str()).collect();
    targets.dedup();
    for (t, s) in targets
        .iter()
        .flat_map(|t| SCENARIOS.iter().map(move |s| (*t, *s)))
    {
        let Some(c) = get(t, s) else { continue };
        let r = rps(results, s, t);
        println!(
            "| {t} | {s} | {} | {} | {:.0} | {} | {} | {} | {:.2} | {:.2} |",
            fmt_opt(r, 0),
            ratio(r, rps(results, s, "nginx")),
            c.ir,
            ratio(Some(c.ir), get("nginx", s).map(|n| n.ir)),
            ratio(Some(c.ir), get("pingora", s).map(|n| n.ir)),
            fmt_opt(c.ir_event, 0),
            c.allocs,
            c.syscalls,
        );
    }
    if costs.keys().any(|(t, _)| t == "sluice-pass") {
        println!("(the load bench's passthrough non-stream phase asks the mock for a ~2 KiB answer, callgrind's for the 100-token one of every target)");
    }
    println!();
    for (s, what) in [
        ("unary", "non-stream request"),
        ("stream", "stream (token_delay_ms 0)"),
        ("burst", "burst stream"),
        ("paced", "paced stream (each event read alone)"),
    ] {
        let (Some(p), Some(sl)) = (get("pingora", s), get("sluice", s)) else {
            continue;
        };
        let added = (sl.ir - p.ir) / p.ir;
        println!(
            "Ir per {what}: sluice / pingora-smallest = {:.2}, (sluice - pingora-smallest) / pingora-smallest = {added:.2} (target <= 0.50): {}",
            sl.ir / p.ir,
            if added <= 0.5 { "MET" } else { "MISSED" }
        );
        if let Some(n) = get("nginx", s) {
            println!(
                "Ir per {what}: pingora-smallest / nginx = {:.2}, sluice / nginx = {:.2}",
                p.ir / n.ir,
                sl.ir / n.ir
            );
        }
    }
}

/// The sanity pass's check of [`parse`] on a two-line file in the script's format.
pub(super) fn check_parse() {
    let tsv =
        "target\tscenario\trequests\tIr_per_req\tIr_per_event\tallocs_per_req\tsyscalls_per_req\n\
               pingora\tunary\t200\t95000\t-\t40.50\t9.00\n\
               sluice\tstream\t200\t880000\t8627\t300.00\t210.25\n";
    let c = parse(tsv).expect("the script's TSV parses");
    assert_eq!(
        c.get(&("pingora".to_string(), "unary".to_string())),
        Some(&Cost {
            ir: 95000.0,
            ir_event: None,
            allocs: 40.5,
            syscalls: 9.0
        })
    );
    assert_eq!(
        c.get(&("sluice".to_string(), "stream".to_string()))
            .and_then(|c| c.ir_event),
        Some(8627.0)
    );
    assert!(
        parse("target\tscenario\n").is_err(),
        "missing columns are refused"
    );
}
