//! The circuit breaker in front of the verification webhook.
//!
//! - closed: calls go through; `circuit_breaker_threshold` consecutive
//!   failures open it.
//! - open: calls are refused (new subscriptions get 503 with `Retry-After`)
//!   until `circuit_breaker_timeout_sec` has passed; then half-open.
//! - half-open: one trial call goes through, others are refused; its success
//!   closes the breaker, its failure opens it again.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};
use serde::Serialize;

use flotilla_api_types::clock::Clock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed { failures: u32 },
    Open { since: DateTime<Utc>, failures: u32 },
    HalfOpen { trial_running: bool, failures: u32 },
}

/// What `/health` shows of the breaker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BreakerView {
    /// `closed`, `open` or `half-open` (the spec's words).
    pub state: &'static str,
    pub consecutive_failures: u32,
    pub opened_at: Option<DateTime<Utc>>,
}

pub struct Breaker {
    /// A std mutex: transitions are a few comparisons.
    state: Mutex<State>,
    threshold: u32,
    open_for: Duration,
    clock: Arc<dyn Clock>,
}

impl Breaker {
    pub fn new(threshold: u32, open_for_sec: u64, clock: Arc<dyn Clock>) -> Self {
        Self {
            state: Mutex::new(State::Closed { failures: 0 }),
            threshold: threshold.max(1),
            open_for: Duration::seconds(open_for_sec as i64),
            clock,
        }
    }

    /// May a call go through now? `Err(retry_after_seconds)` if not.
    pub fn allow(&self) -> Result<(), u64> {
        let mut state = self.state.lock().expect("breaker lock");
        let now = self.clock.now();
        match *state {
            State::Closed { .. } => Ok(()),
            State::Open { since, failures } => {
                let reopens = since + self.open_for;
                if now >= reopens {
                    *state = State::HalfOpen {
                        trial_running: true,
                        failures,
                    };
                    Ok(())
                } else {
                    Err(((reopens - now).num_milliseconds().max(0) as u64)
                        .div_ceil(1000)
                        .max(1))
                }
            }
            State::HalfOpen {
                trial_running: true,
                ..
            } => Err(1),
            State::HalfOpen {
                trial_running: false,
                failures,
            } => {
                *state = State::HalfOpen {
                    trial_running: true,
                    failures,
                };
                Ok(())
            }
        }
    }

    pub fn record_success(&self) {
        *self.state.lock().expect("breaker lock") = State::Closed { failures: 0 };
    }

    pub fn record_failure(&self) {
        let mut state = self.state.lock().expect("breaker lock");
        let now = self.clock.now();
        *state = match *state {
            State::Closed { failures } if failures + 1 >= self.threshold => State::Open {
                since: now,
                failures: failures + 1,
            },
            State::Closed { failures } => State::Closed {
                failures: failures + 1,
            },
            State::HalfOpen { failures, .. } | State::Open { failures, .. } => State::Open {
                since: now,
                failures: failures + 1,
            },
        };
        if matches!(*state, State::Open { .. }) {
            tracing::warn!("verification webhook circuit breaker open");
        }
    }

    /// A call that never reached the webhook (e.g. rate limited) gives back a trial.
    pub fn release_trial(&self) {
        let mut state = self.state.lock().expect("breaker lock");
        if let State::HalfOpen { failures, .. } = *state {
            *state = State::HalfOpen {
                trial_running: false,
                failures,
            };
        }
    }

    /// The state as the spec names it: an open breaker whose timeout has
    /// passed is `half-open` already, before the next request tries it.
    pub fn view(&self) -> BreakerView {
        match *self.state.lock().expect("breaker lock") {
            State::Open { since, failures } if self.clock.now() >= since + self.open_for => {
                BreakerView {
                    state: "half-open",
                    consecutive_failures: failures,
                    opened_at: Some(since),
                }
            }
            State::Closed { failures } => BreakerView {
                state: "closed",
                consecutive_failures: failures,
                opened_at: None,
            },
            State::Open { since, failures } => BreakerView {
                state: "open",
                consecutive_failures: failures,
                opened_at: Some(since),
            },
            State::HalfOpen { failures, .. } => BreakerView {
                state: "half-open",
                consecutive_failures: failures,
                opened_at: None,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_api_types::clock::ManualClock;

    #[test]
    fn closed_open_half_open_closed_and_open_again() {
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let breaker = Breaker::new(3, 30, clock.clone());
        for _ in 0..2 {
            breaker.allow().unwrap();
            breaker.record_failure();
        }
        assert_eq!(breaker.view().state, "closed");
        breaker.record_failure();
        assert_eq!(breaker.view().state, "open");
        assert_eq!(breaker.allow(), Err(30));
        clock.advance(Duration::seconds(20));
        assert_eq!(breaker.allow(), Err(10));
        clock.advance(Duration::seconds(10));
        assert_eq!(
            breaker.view().state,
            "half-open",
            "half-open once the timeout passed, before any request"
        );
        breaker.allow().expect("one trial after the timeout");
        assert_eq!(breaker.view().state, "half-open");
        assert_eq!(breaker.allow(), Err(1), "only one trial at a time");
        breaker.record_failure();
        assert_eq!(
            breaker.view().state,
            "open",
            "a failed trial opens it again"
        );
        clock.advance(Duration::seconds(30));
        breaker.allow().unwrap();
        breaker.record_success();
        assert_eq!(
            breaker.view(),
            BreakerView {
                state: "closed",
                consecutive_failures: 0,
                opened_at: None
            }
        );
        breaker.allow().unwrap();
    }

    #[test]
    fn success_resets_the_count() {
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let breaker = Breaker::new(2, 30, clock);
        breaker.record_failure();
        breaker.record_success();
        breaker.record_failure();
        assert_eq!(
            breaker.view().state,
            "closed",
            "failures must be consecutive"
        );
    }
}
