//! What an operator sees of a request Sluice refused while decoding it (issue 28, item 7):
//! the access line names the client's dialect and the `model` the body asked for, the
//! refusal's reason is logged at info with the request id, and the ledger has its row.

use crate::harness::{post_json, Mock, Sluice, KEY};
use crate::model_fallback::access_line;
use crate::timeouts::config;

#[test]
fn a_request_refused_while_decoding_is_logged_with_its_dialect_model_reason_and_ledger_row() {
    let mock = Mock::start("{}");
    let sluice = Sluice::start(&config("", &[("p1", &mock.base_url(), "")]));
    let auth = format!("Bearer {KEY}");
    let cases = [
        (
            "diag-chat",
            "/v1/chat/completions",
            r#"{"model":"acme/chat","messages":"not a list"}"#,
            "chat",
            "messages",
        ),
        (
            "diag-messages",
            "/v1/messages",
            r#"{"model":"acme/chat","max_tokens":"many","messages":[{"role":"user","content":"hi"}]}"#,
            "messages",
            "max_tokens",
        ),
        (
            "diag-responses",
            "/v1/responses",
            // `input` neither a string nor a list: refused at parse (a malformed item is the
            // translation's to refuse, on a route that translates: one attempt).
            r#"{"model":"acme/chat","input":7}"#,
            "responses",
            "input",
        ),
    ];
    for (id, path, body, dialect, reason) in cases {
        let r = post_json(
            sluice.addr,
            path,
            &[("authorization", &auth), ("x-request-id", id)],
            body,
        );
        assert_eq!(r.status, 400, "{id}: {}", r.text());
        let line = access_line(&sluice, id);
        for want in [
            "standard_model=acme/chat".to_string(),
            format!("dialect={dialect}"),
            "outcome=invalid_request".to_string(),
            "status=400".to_string(),
        ] {
            assert!(line.contains(&want), "{id}: {want} in {line}");
        }
        let log = sluice.log();
        let refusal = log
            .lines()
            .find(|l| l.contains("request refused") && l.contains(&format!("request_id={id} ")))
            .unwrap_or_else(|| panic!("{id}: no refusal line in {log}"));
        assert!(
            refusal.contains(&format!("dialect={dialect}"))
                && refusal.contains("model=acme/chat")
                && refusal.contains(reason),
            "{id}: {refusal}"
        );
    }
    // One ledger row per refused request, under the model the body named.
    let recs = crate::ledger::wait_records(sluice.dir.path(), &sluice.config_path, cases.len());
    for (id, _, _, dialect, _) in cases {
        let rec = recs
            .iter()
            .find(|r| r["request_id"] == id)
            .unwrap_or_else(|| panic!("no ledger row for {id}: {recs:?}"));
        assert_eq!(rec["model"], "acme/chat", "{rec}");
        assert_eq!(rec["outcome"], "invalid_request", "{rec}");
        assert_eq!(rec["status"], 400, "{rec}");
        assert_eq!(rec["ingress"], dialect, "{rec}");
        assert_eq!(rec["attempts"], 0, "{rec}");
    }
    assert_eq!(mock.hits(), 0, "nothing refused reached the provider");
}
