//! Provider retries: backoff with jitter, Retry-After, only before the first
//! delta, bounded, interruptible.

use sw_agent::model::{RunState, StopReason};
use sw_agent::protocol::{ErrorKind, Event};
use sw_agent::provider::{ProviderError, ProviderRequest};
use sw_agent::sim::{Reply, Sim};

use super::support::*;

fn failing_then_ok(
    failures: usize,
    error: ProviderError,
    partial: &'static str,
) -> sw_agent::sim::Policy {
    let mut n = 0;
    Box::new(move |_: &ProviderRequest| {
        n += 1;
        if n <= failures {
            Reply::Error {
                partial: partial.into(),
                error: error.clone(),
            }
        } else {
            Reply::text("finally")
        }
    })
}

fn retries(sim: &Sim) -> Vec<(u32, u64)> {
    sim.events
        .iter()
        .filter_map(|(_, e)| match &e.event {
            Event::RunRetry {
                attempt, delay_ms, ..
            } => Some((*attempt, *delay_ms)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_retry_says_when_it_is_sent_by_the_clock_a_late_panel_counts_down_to() {
    let error = ProviderError::new(ErrorKind::ProviderUnavailable, "HTTP 500", true);
    let mut sim = Sim::new(52, failing_then_ok(1, error, ""), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    // Step until the retry is announced: it names the moment it is due.
    let mut announced = None;
    let mut before = sim.now;
    for _ in 0..10_000 {
        before = sim.now;
        if !sim.step() {
            break;
        }
        announced = sim.events.iter().find_map(|(_, e)| match &e.event {
            Event::RunRetry {
                delay_ms, retry_at, ..
            } => Some((*delay_ms, *retry_at)),
            _ => None,
        });
        if announced.is_some() {
            break;
        }
    }
    let (delay_ms, retry_at) = announced.expect("a retry was announced");
    // Due delay_ms after the step that announced it (one step may move
    // the simulated clock a little).
    assert!(
        (before + delay_ms..=sim.now + delay_ms).contains(&retry_at),
        "{retry_at} not {delay_ms} ms after {before}..{}",
        sim.now
    );
    // The request goes again at that moment, not before.
    while sim.requests.len() < 2 && sim.step() {
        assert!(
            sim.requests.len() < 2 || sim.now >= retry_at,
            "sent at {} before {retry_at}",
            sim.now
        );
    }
    assert_eq!(sim.requests.len(), 2);
    assert!(sim.now >= retry_at);
}

#[test]
fn retryable_error_before_first_delta_is_retried_with_backoff() {
    let error = ProviderError::new(ErrorKind::ProviderUnavailable, "HTTP 500", true);
    let mut sim = Sim::new(51, failing_then_ok(2, error, ""), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    assert_eq!(sim.requests.len(), 3);
    let r = retries(&sim);
    assert_eq!(r.len(), 2);
    assert!((1_000..=1_250).contains(&r[0].1), "first delay {:?}", r[0]);
    assert!((2_000..=2_500).contains(&r[1].1), "doubles: {:?}", r[1]);
    assert!(
        sim.now >= r[0].1 + r[1].1,
        "virtual time advanced through the backoff"
    );
    assert_eq!(last_stop(&sim), Some(StopReason::End));
    assert_eq!(
        sim.store.runs.values().next().unwrap().state,
        RunState::Completed
    );
}

#[test]
fn retry_after_is_honoured() {
    let mut error = ProviderError::new(ErrorKind::RateLimited, "429", true);
    error.retry_after_ms = Some(7_000);
    let mut sim = Sim::new(52, failing_then_ok(1, error, ""), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    assert_eq!(retries(&sim), vec![(1, 7_000)]);
    assert_eq!(last_stop(&sim), Some(StopReason::End));
}

#[test]
fn no_retry_after_a_delta_reached_the_user() {
    let error = ProviderError::new(ErrorKind::Network, "connection reset", true);
    let mut sim = Sim::new(53, failing_then_ok(1, error, "Half"), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    assert_eq!(sim.requests.len(), 1);
    assert!(retries(&sim).is_empty());
    assert_eq!(last_stop(&sim), Some(StopReason::Error));
}

#[test]
fn non_retryable_errors_fail_at_once_and_attempts_are_bounded() {
    let auth = ProviderError::new(ErrorKind::Auth, "bad key", false);
    let mut sim = Sim::new(54, failing_then_ok(1, auth, ""), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    assert_eq!(sim.requests.len(), 1);
    let run = sim.store.runs.values().next().unwrap();
    assert_eq!(run.error.as_ref().unwrap().kind, ErrorKind::Auth);

    let overloaded = ProviderError::new(ErrorKind::ProviderUnavailable, "529", true);
    let mut sim = Sim::new(55, failing_then_ok(100, overloaded, ""), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    sim.run(10_000);
    assert_eq!(sim.requests.len(), 4, "max_attempts bounds the retries");
    assert_eq!(last_stop(&sim), Some(StopReason::Error));
}

#[test]
fn interrupt_during_backoff_stops_at_once() {
    let error = ProviderError::new(ErrorKind::ProviderUnavailable, "500", true);
    let mut sim = Sim::new(56, failing_then_ok(100, error, ""), page_tools());
    let conn = sim.connect();
    sim.send(conn, submit("s1", None, "go"));
    while retries(&sim).is_empty() {
        assert!(sim.step());
    }
    let thread = sim.store.threads.keys().next().unwrap().clone();
    sim.send(conn, interrupt("i1", &thread));
    sim.run(10_000);
    assert_eq!(sim.requests.len(), 1, "the pending retry was cancelled");
    assert_eq!(last_stop(&sim), Some(StopReason::Interrupted));
    check_invariants(&sim, &[]).unwrap();
}
