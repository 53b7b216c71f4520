//! The wait queue of creates: `POST /v2/instances?wait_sec=N` waits in FIFO
//! order for room, up to N seconds (at most `scheduler.max_wait_sec`), then
//! answers 503 as a create without waiting would.
//!
//! Only the head of the queue tries to place its instance; it is woken when
//! capacity may have freed on this control plane (an instance removed,
//! stopped, failed or parked; a node registered) and, for what other control
//! planes free, once a second. When the head has been served (placed, or it
//! gave up, or its client went away: dropping the request drops its place) the
//! next one tries at once. Creates without `wait_sec` do not queue.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use flotilla_api_types::instances::{CreateInstanceRequest, Instance};

use super::{ControlPlane, Scope};
use crate::error::{Error, Result};

/// How often the head looks for room freed elsewhere (another control plane).
const POLL: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(crate) struct CreateQueue {
    /// Waiting creates in arrival order, each with the signal that wakes it.
    /// A std mutex: pushed, popped and peeked without awaiting.
    waiters: std::sync::Mutex<VecDeque<(u64, Instant, Arc<Notify>)>>,
    next_ticket: AtomicU64,
}

/// A place in the queue; leaving (drop) wakes the next waiter.
struct Place<'a> {
    queue: &'a CreateQueue,
    ticket: u64,
    wake: Arc<Notify>,
}

impl CreateQueue {
    fn join(&self) -> Place<'_> {
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        self.waiters
            .lock()
            .expect("queue lock")
            .push_back((ticket, Instant::now(), wake.clone()));
        Place {
            queue: self,
            ticket,
            wake,
        }
    }

    fn is_head(&self, ticket: u64) -> bool {
        self.waiters
            .lock()
            .expect("queue lock")
            .front()
            .is_some_and(|(head, _, _)| *head == ticket)
    }

    /// Capacity may have freed: the head tries again.
    pub fn capacity_changed(&self) {
        if let Some((_, _, wake)) = self.waiters.lock().expect("queue lock").front() {
            wake.notify_one();
        }
    }

    /// Waiting creates now, and how long the oldest has waited.
    pub fn snapshot(&self) -> (usize, Duration) {
        let waiters = self.waiters.lock().expect("queue lock");
        let oldest = waiters
            .front()
            .map(|(_, since, _)| since.elapsed())
            .unwrap_or_default();
        (waiters.len(), oldest)
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut waiters = self.queue.waiters.lock().expect("queue lock");
        waiters.retain(|(ticket, _, _)| *ticket != self.ticket);
        if let Some((_, _, next)) = waiters.front() {
            next.notify_one();
        }
    }
}

impl ControlPlane {
    /// Creates an instance, waiting up to `wait_sec` in FIFO order for room.
    pub async fn instance_create_waiting(
        &self,
        request: CreateInstanceRequest,
        wait_sec: u64,
        scope: &Scope,
    ) -> Result<Instance> {
        let limit = self.config.scheduler.max_wait_sec;
        if wait_sec > limit {
            return Err(Error::InvalidRequest(format!(
                "wait_sec must be an integer from 0 to {limit} (scheduler.max_wait_sec; got {wait_sec})"
            )));
        }
        self.instance_create_queued(request, wait_sec, scope).await
    }

    /// [`ControlPlane::instance_create_waiting`] without the limit of
    /// `scheduler.max_wait_sec` (WebDriver sessions have their own).
    pub(crate) async fn instance_create_queued(
        &self,
        request: CreateInstanceRequest,
        wait_sec: u64,
        scope: &Scope,
    ) -> Result<Instance> {
        if wait_sec == 0 {
            return self.instance_create(request, scope).await;
        }
        let started = Instant::now();
        let deadline = started + Duration::from_secs(wait_sec);
        let place = self.create_queue.join();
        let outcome = loop {
            if self.create_queue.is_head(place.ticket) {
                match self.instance_create(request.clone(), scope).await {
                    Err(Error::InsufficientCapacity(reason)) => {
                        if Instant::now() >= deadline {
                            break Err(Error::InsufficientCapacity(format!(
                                "{reason} (waited {wait_sec} s in the create queue)"
                            )));
                        }
                    }
                    other => break other,
                }
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break Err(Error::InsufficientCapacity(format!(
                    "no room within {wait_sec} s: {} create(s) were ahead in the queue; retry, delete instances or add a node",
                    self.create_queue.snapshot().0.saturating_sub(1)
                )));
            }
            tokio::select! {
                _ = place.wake.notified() => {}
                _ = tokio::time::sleep(POLL.min(remaining)) => {}
            }
        };
        drop(place);
        self.telemetry.create_queue_wait.observe(started.elapsed());
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_kept_in_order_and_given_up_on_drop() {
        let queue = CreateQueue::default();
        let first = queue.join();
        let second = queue.join();
        assert!(queue.is_head(first.ticket));
        assert!(!queue.is_head(second.ticket));
        assert_eq!(queue.snapshot().0, 2);
        drop(first);
        assert!(queue.is_head(second.ticket));
        let third = queue.join();
        drop(second);
        assert!(queue.is_head(third.ticket));
        drop(third);
        assert_eq!(queue.snapshot().0, 0);
    }
}
