//! Owns [`Gateway`]'s `ProxyHttp` implementation: the thin shell Pingora calls. Every phase is
//! a few lines that delegate to the step of the request path owning the decision; the steps
//! are folders beside this one, and the arrows point down the path:
//!
//! [`crate::edge`] (connection loop, head guard, client IP, screening) → [`crate::ingress`]
//! (endpoints, body, dialect decode, token count, answers Sluice writes) → [`crate::engine`]
//! (attempt loop, one attempt's upstream request, hedge, fallback, continuation, pools) →
//! [`crate::stream`] (pump, per-stream pipe, unary exchange). Billing ([`crate::billing`])
//! is called from here, at the request's end.
//!
//! | phase | does | owner |
//! |---|---|---|
//! | `new_ctx` | end the head deadline; pin the config snapshot, start the clock | [`crate::edge::connection`], [`ctx`] |
//! | `early_request_filter` | request id, downstream write timeout; a WebSocket response's subrequest head | [`ctx`], [`crate::ingress::websocket`] |
//! | `request_filter` | head limits and per-IP rate; a passthrough route's request goes on to the native path; else route the path; auth; body; plan; the attempt loop (LLM endpoints), or the token count | [`crate::edge::screen`], [`crate::passthrough`], [`crate::ingress::endpoints`], [`crate::engine::attempt`], [`crate::ingress::count_tokens`] |
//! | `upstream_peer`, `fail_to_connect`, `error_while_proxy`, `upstream_request_filter`, `request_body_filter`, `response_filter` | passthrough requests only (Pingora's native path, with their own [`crate::passthrough::PassCtx`]): upstream selection, forwarding headers, body limits | [`crate::passthrough::serve`] |
//! | `fail_to_proxy` | OpenAI-style JSON for anything that escaped (plain text for passthrough) | [`crate::ingress::respond`], [`crate::passthrough::serve`] |
//! | `logging` | metering and budget settlement, access log line, request metrics | [`crate::billing`], [`access_log`], [`crate::passthrough::log`] |

pub mod access_log;
pub mod ctx;
pub mod gateway;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::proxy::{FailToProxy, ProxyHttp, Session};
use pingora::upstreams::peer::HttpPeer;
use pingora::{Error, ErrorType};

use crate::edge::{connection, screen as edge};
use crate::engine::upstream::ClientGone;
use crate::error::GatewayError;
use crate::ingress::{endpoints, respond};
use ctx::RequestCtx;
pub use gateway::{Gateway, DOWNSTREAM_KEEPALIVE_S};

#[async_trait]
impl ProxyHttp for Gateway {
    /// Boxed: Pingora keeps the context in each request's future twice over (as the argument
    /// of `process_request` and as its local, ~1 KiB each, for the life of a held stream).
    type CTX = Box<RequestCtx>;

    fn new_ctx(&self) -> Box<RequestCtx> {
        // The first hook after the request head: its deadline is met.
        connection::head_complete();
        Box::new(RequestCtx::pinned(&self.config.pinned()))
    }

    async fn early_request_filter(
        &self,
        session: &mut Session,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        ctx.request_id = ctx::request_id(
            session
                .req_header()
                .headers
                .get("x-request-id")
                .map(|v| v.as_bytes()),
        );
        // A Responses WebSocket's response: its inherited upgrade head becomes its POST.
        crate::ingress::websocket::rewrite_head(session, ctx)?;
        session.set_write_timeout(Some(ctx.config.server.downstream_write_timeout));
        // An idle keep-alive connection is closed after this long (Pingora's default keeps it
        // forever, which lets idle clients pin file descriptors).
        if session.get_keepalive() == Some(0) {
            session.set_keepalive(Some(DOWNSTREAM_KEEPALIVE_S));
        }
        Ok(())
    }

    fn allow_spawning_subrequest(&self, session: &Session, _ctx: &Box<RequestCtx>) -> bool {
        // A Responses WebSocket runs each response as a subrequest of its upgrade request.
        crate::ingress::websocket::wants_websocket(session.req_header())
    }

    async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<bool> {
        // Hostile input first, before authentication: head limits, per-IP rate.
        if edge::refuse(session, ctx).await {
            return Ok(true);
        }
        if let Some(m) = self.passthrough.find(session.req_header()) {
            let ctx = &mut **ctx;
            let start = crate::passthrough::serve::Start {
                config: &ctx.config,
                received: ctx.received,
                request_id: std::mem::take(&mut ctx.request_id),
                client_ip: ctx.client_ip,
            };
            return crate::passthrough::serve::admit(session, &mut ctx.passthrough, start, m).await;
        }
        match endpoints::handle(self, session, ctx).await {
            Ok(()) => Ok(true),
            Err(ClientGone(phase)) => {
                crate::metrics::metrics()
                    .client_aborts_total
                    .with_label_values(&[phase])
                    .inc();
                ctx.outcome.label = "client_abort";
                Err(Error::explain(ErrorType::ConnectionClosed, "client disconnected").into_down())
            }
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<Box<HttpPeer>> {
        match ctx.passthrough.as_mut() {
            Some(p) => crate::passthrough::serve::peer(p),
            // Every other request is answered in `request_filter`; reaching here is a bug.
            None => Err(Error::explain(
                ErrorType::HTTPStatus(404),
                "no native proxy route",
            )),
        }
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Box<RequestCtx>,
        e: Box<Error>,
    ) -> Box<Error> {
        match ctx.passthrough.as_ref() {
            Some(p) => crate::passthrough::serve::connect_failed(p, e),
            None => e,
        }
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut Box<RequestCtx>,
        client_reused: bool,
    ) -> Box<Error> {
        crate::passthrough::serve::proxy_failed(
            session,
            ctx.passthrough.as_mut(),
            peer,
            e,
            client_reused,
        )
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        match ctx.passthrough.as_ref() {
            Some(p) => crate::passthrough::serve::upstream_request(session, p, upstream_request),
            None => Ok(()),
        }
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        if ctx.passthrough.is_some() {
            crate::passthrough::serve::response_head(session, upstream_response);
        }
        Ok(())
    }

    async fn request_body_filter(
        &self,
        session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut Box<RequestCtx>,
    ) -> pingora::Result<()> {
        match ctx.passthrough.as_mut() {
            Some(p) => {
                crate::passthrough::serve::request_body(p, body.as_ref(), session.was_upgraded())
            }
            None => Ok(()),
        }
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Box<RequestCtx>,
    ) -> FailToProxy {
        if let Some(p) = ctx.passthrough.as_mut() {
            return crate::passthrough::serve::fail(session, p, e).await;
        }
        if matches!(e.esource(), pingora::ErrorSource::Downstream)
            || ctx.attempts.downstream_committed
        {
            return FailToProxy {
                error_code: 0,
                can_reuse_downstream: false,
            };
        }
        let err = match e.etype() {
            ErrorType::HTTPStatus(404) => GatewayError::NotFound {
                message: "unknown path".into(),
                code: "not_found",
            },
            _ => GatewayError::Internal("the gateway failed to handle the request".into()),
        };
        let code = err.status();
        let _ = respond::write_error(session, ctx, &err).await;
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    fn suppress_error_log(
        &self,
        _session: &Session,
        ctx: &Box<RequestCtx>,
        _error: &Error,
    ) -> bool {
        // A client that leaves is normal traffic: counted and access-logged, not an ERROR;
        // so is a passthrough request refused for its body (413, 408).
        match ctx.passthrough.as_ref() {
            Some(p) => p.quiet_error(),
            None => ctx.outcome.label == "client_abort",
        }
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Box<RequestCtx>) {
        if let Some(p) = ctx.passthrough.as_ref() {
            crate::passthrough::log::record(session, e, p);
            return;
        }
        // Metering: the request's usage priced, for the access log, metrics and ledger.
        ctx.billing.metered =
            crate::billing::metering::meter(&ctx.config, ctx.answering_model(), &ctx.outcome);
        // The budget learns the real charge (an aborted stream: what was streamed); a `hard`
        // budget caps it at what the budget held for the request (the cost stays as billed).
        if let Some(r) = ctx.billing.budget.take() {
            let charge = ctx.billing.metered.map_or(0.0, |m| m.charge_usd);
            let charged = r.settle_hard(&ctx.config, charge).await;
            if let Some(m) = ctx.billing.metered.as_mut() {
                m.charge_usd = m.charge_usd.min(charged);
            }
        }
        access_log::record(session, e, ctx);
    }
}
