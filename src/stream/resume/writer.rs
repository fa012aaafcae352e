//! Owns the generation side of a resumable stream ([`Resumable`], held in the request's
//! context): every client write of the committed stream is stamped with event ids and
//! appended to the replay buffer, then written to the original client while it holds the
//! stream. Its drop (a failed write, the connection closed) detaches it instead of ending
//! the stream; the pump keeps reading the upstream into the buffer and watches
//! [`control`] for the grace window's end or a cancel. After the upstream ended,
//! [`Resumable::settle`] waits until the final event reached some client or the window
//! passed.

use std::sync::Arc;

use bytes::Bytes;
use pingora::proxy::Session;
use tokio::time::sleep_until;

use super::buffer::Overflow;
use super::entry::{Ended, Entry, Hold, Limits, Owner};
use super::registry::registry;
use super::stamp::Stamper;
use crate::backpressure::BufferReservation;
use crate::protocol::ClientDialect;

/// Why the pump must stop a resumable stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// No client came back within the grace window.
    Expired,
    /// `DELETE /v1/streams/<id>`.
    Cancelled,
    /// The process is shutting down with no client attached: a resume would reach the next
    /// process.
    Shutdown,
}

/// The original request's handle on its resumable stream.
#[derive(Debug)]
pub struct Resumable {
    entry: Arc<Entry>,
    stamper: Stamper,
    /// The original client still gets the events (it neither dropped nor was taken over).
    session: bool,
    /// The response head went out: the stream exists for resumes.
    started: bool,
    /// Why the generation stopped early, when it did.
    stopped: Option<Ended>,
    /// [`Resumable::settle`] ran (else its drop retires the stream).
    settled: bool,
    /// Bytes written to the original client minus the bytes handed to [`Resumable::emit`]
    /// and [`Resumable::heartbeat`] (which the pump counts in `bytes_out` as written): the
    /// event ids added, less what a detached client was not sent.
    written_adjust: i64,
}

/// How a resumable stream ended for the request that generated it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Settled {
    /// Resumes that took the stream.
    pub(crate) resumptions: u32,
    /// The stream was committed (its head went out with the stream id).
    pub(crate) started: bool,
    /// The final event reached some client (else the client of the request is gone).
    pub(crate) delivered: bool,
    /// To add to the request's `bytes_out` (counted as the pump handed bytes over): the
    /// event ids written, less what the original client was not sent after it left.
    pub(crate) bytes_out_adjust: i64,
}

impl Resumable {
    /// Registers a new resumable stream `id` of `dialect` for `owner`, within `limits`, its
    /// buffer charged through `reservation` to `limits.global_bound`.
    pub(crate) fn start(
        id: String,
        dialect: ClientDialect,
        owner: Owner,
        limits: Limits,
        reservation: BufferReservation,
    ) -> Box<Self> {
        let stamper = Stamper::new(&id);
        let entry = Arc::new(Entry::new(id, dialect, owner, limits, reservation));
        registry().insert(entry.clone());
        Box::new(Self {
            entry,
            stamper,
            session: true,
            started: false,
            stopped: None,
            settled: false,
            written_adjust: 0,
        })
    }

    /// The stream id.
    pub(crate) fn id(&self) -> &str {
        &self.entry.id
    }

    /// The shared state (for [`control`]).
    pub(crate) fn entry(&self) -> Arc<Entry> {
        self.entry.clone()
    }

    /// The response head (with the stream id) is going out.
    pub(crate) fn commit(&mut self) {
        self.started = true;
    }

    /// Whether the pump watches the original client's connection (it still holds the
    /// stream).
    pub(crate) fn watches_client(&self) -> bool {
        self.session
    }

    /// The pump stops the generation for `why`.
    pub(crate) fn stop(&mut self, why: Stop) {
        self.stopped = Some(match why {
            Stop::Expired => Ended::Expired,
            Stop::Cancelled => Ended::Cancelled,
            Stop::Shutdown => Ended::Shutdown,
        });
    }

    /// Stamps `body` (and the end of the response when `end`), appends its events to the
    /// replay buffer and writes it to the original client while it holds the stream; a
    /// failed write detaches it.
    ///
    /// # Errors
    /// [`Overflow`]: events no client was sent passed the buffer's bound (the stream is to
    /// end as a client abort).
    pub(crate) async fn emit(
        &mut self,
        session: &mut Session,
        body: Option<Bytes>,
        end: bool,
    ) -> Result<(), Overflow> {
        let given = len_i64(body.as_ref().map_or(0, Bytes::len));
        let (out, blocks) = self.stamper.stamp(body.as_deref().unwrap_or_default(), end);
        let appended = self.entry.append(&out, &blocks, end);
        if self.session && !self.entry.holds(0) {
            // Another resume took the stream over.
            self.drop_session(session).await;
        }
        if !self.session || (out.is_empty() && !end) {
            self.written_adjust -= given;
            return self.overflowed(appended);
        }
        let stamped = len_i64(out.len());
        let body = (!out.is_empty()).then_some(out);
        match session.write_response_body(body, end).await {
            // Sent: what overflowed before the write may fit now.
            Ok(()) => {
                self.written_adjust += stamped - given;
                self.entry
                    .sent(0, self.stamper.last_seq(), end)
                    .map_err(|o| self.overflow(o))
            }
            Err(_) => {
                self.written_adjust -= given;
                self.drop_session(session).await;
                self.overflowed(appended)
            }
        }
    }

    fn overflowed(&mut self, r: Result<(), Overflow>) -> Result<(), Overflow> {
        r.map_err(|o| self.overflow(o))
    }

    fn overflow(&mut self, o: Overflow) -> Overflow {
        self.stopped = Some(Ended::Overflowed);
        log::info!(target: "sluice::stream::resume",
            "resumable stream overflowed its replay buffer stream_id={}; cancelling the generation",
            self.entry.id
        );
        o
    }

    /// Writes the heartbeat `beat` (stamped: an event repeats the last id) to the original
    /// client while it holds the stream; to nobody else.
    pub(crate) async fn heartbeat(&mut self, session: &mut Session, beat: &'static [u8]) {
        if self.session && !self.entry.holds(0) {
            self.drop_session(session).await;
        }
        let given = len_i64(beat.len());
        if !self.session {
            self.written_adjust -= given;
            return;
        }
        let beat = self.stamper.heartbeat(beat);
        let stamped = len_i64(beat.len());
        if session
            .write_response_body(Some(beat), false)
            .await
            .is_err()
        {
            self.written_adjust -= given;
            self.drop_session(session).await;
        } else {
            self.written_adjust += stamped - given;
        }
    }

    /// The original client is gone (or was taken over): it gets nothing more, its
    /// connection is closed (never reused: its response is unfinished) and the grace clock
    /// starts.
    pub(crate) async fn drop_session(&mut self, session: &mut Session) {
        if !self.session {
            return;
        }
        self.session = false;
        self.entry.detach(0);
        session.set_keepalive(None);
        session.downstream_session.shutdown().await;
    }

    /// After the generation ended (its upstream released or closed): waits until the final
    /// event reached some client, or the grace window passed with none attached, or a
    /// cancel; then retires the stream (a tombstone answers late resumes). A stream whose
    /// final event was written keeps its tail (`server.resume_linger_bytes`) replayable for
    /// the grace window first, as the client it was written to may have lost it unread; the
    /// wait is not this request's, so its ledger row is written now. A stream that never
    /// started is forgotten.
    pub(crate) async fn settle(mut self: Box<Self>) -> Settled {
        self.settled = true;
        let entry = self.entry.clone();
        if !self.started {
            registry().forget(&entry.id);
            entry.end(Ended::Cancelled);
            return Settled {
                resumptions: 0,
                started: false,
                delivered: false,
                bytes_out_adjust: self.written_adjust,
            };
        }
        let shutdown = crate::shutdown::streams_cancelled();
        tokio::pin!(shutdown);
        let why = loop {
            if entry.final_sent() {
                break Ended::Completed;
            }
            if let Some(why) = self.stopped {
                break why;
            }
            if !entry.is_finished() {
                // The generation stopped without its final event (the upstream was cut
                // before the stream ended): nothing more will come.
                break Ended::Expired;
            }
            match entry.hold() {
                Hold::Cancelled => break Ended::Cancelled,
                Hold::Expired => break Ended::Expired,
                Hold::Held => tokio::select! {
                    () = entry.wake.notified() => {}
                    () = &mut shutdown => break Ended::Shutdown,
                },
                Hold::Until(d) => tokio::select! {
                    () = entry.wake.notified() => {}
                    () = sleep_until(d) => {}
                    () = &mut shutdown => break Ended::Shutdown,
                    // No client, and none can come back to this process.
                    () = crate::shutdown::started() => break Ended::Shutdown,
                },
            }
        };
        let resumptions = entry.resumptions();
        match why {
            Ended::Completed => log::debug!(target: "sluice::stream::resume",
                "resumable stream delivered stream_id={} resumptions={resumptions}", entry.id),
            why => log::info!(target: "sluice::stream::resume",
                "resumable stream ended undelivered stream_id={} reason={} resumptions={resumptions}",
                entry.id, why.code()),
        }
        if why == Ended::Completed && entry.lingering() {
            let kept = entry.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = tokio::time::sleep(kept.grace()) => {}
                    () = crate::shutdown::started() => {}
                }
                registry().retire(&kept, Ended::Completed);
            });
        } else {
            registry().retire(&entry, why);
        }
        Settled {
            resumptions,
            started: true,
            delivered: why == Ended::Completed,
            bytes_out_adjust: self.written_adjust,
        }
    }
}

/// `n` as `i64` (saturating).
fn len_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Drop for Resumable {
    /// A request dropped before it settled (its task was cancelled): nothing will feed or
    /// wait for the stream any more, so it ends now.
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if self.started {
            registry().retire(&self.entry, self.stopped.unwrap_or(Ended::Expired));
        } else {
            registry().forget(&self.entry.id);
            self.entry.end(Ended::Cancelled);
        }
    }
}

/// The pump's watch of a resumable stream ([`control`]), made once per pump.
pub(crate) type Control = std::pin::Pin<Box<dyn std::future::Future<Output = Stop> + Send>>;

/// Resolves with [`control`]'s verdict; pending forever without one (a stream that is not
/// resumable; the branch is disabled then).
pub(crate) async fn stopped(control: &mut Option<Control>) -> Stop {
    match control {
        Some(c) => c.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Resolves when the pump must stop the stream: the grace window passed with no client
/// attached, or `DELETE` cancelled it. Pending while a client holds it.
pub(crate) fn control(entry: Arc<Entry>) -> Control {
    Box::pin(async move { watch(&entry).await })
}

/// [`control`]'s loop.
async fn watch(entry: &Entry) -> Stop {
    loop {
        match entry.hold() {
            Hold::Cancelled => return Stop::Cancelled,
            Hold::Expired => {
                log::info!(target: "sluice::stream::resume",
                    "resumable stream expired stream_id={}: no client within server.resume_grace_ms", entry.id);
                return Stop::Expired;
            }
            Hold::Held => entry.wake.notified().await,
            Hold::Until(d) => {
                tokio::select! {
                    () = entry.wake.notified() => {}
                    () = sleep_until(d) => {}
                    () = crate::shutdown::started() => {
                        log::info!(target: "sluice::stream::resume",
                            "resumable stream ended at shutdown stream_id={}: no client attached", entry.id);
                        return Stop::Shutdown;
                    }
                }
            }
        }
    }
}
