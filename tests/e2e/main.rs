//! Sluice's end-to-end tests: one test binary (link time matters on 2 cores) that starts the
//! real `sluice` and `sluice-mock-upstream` binaries on loopback ports and talks to them over
//! real sockets. Each module covers one concern.

mod harness;
mod smoke;
